"""The key-value probe, in the corpus's own shape (code): ``name = 40213`` early in a file, a gap of code,
then ``name = `` again; the loss on the digits tells whether the model recalls the value. Counted in
the model's own ids; the answer's loss in bits per byte of its digits.
Shapes: B rows in a batch, T sequence length in ids, k ids of an answer.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
import torch

from posviz.errors import PosvizError
from posviz.models.interface import LabModel
from posviz.labs.probes import GapResult, LN2, Progress, fits, held_out, no_progress, padded, answer_scores, span_nats_per_byte, gap_summary


DIGIT_BITS = math.log2(10)  # a uniformly random digit: what a model that cannot recall pays per digit


@dataclasses.dataclass
class KeyValueResult(GapResult):
    """The key-value probe at one gap: GapResult's losses, and how often the value comes out whole."""

    # share of names whose value the model's most likely ids reproduce exactly (every id of it)
    first_correct: float | None = None
    second_correct: float | None = None


# -- key-value probe ------------------------------------------------------------------------------------
def _random_name(gen: torch.Generator) -> bytes:
    letters = b"abcdefghijklmnopqrstuvwxyz"
    return b"".join(bytes([letters[int(i)]]) for i in torch.randint(0, 26, (8,), generator=gen))


def ids_covering(sizes: Sequence[int] | np.ndarray, start: int, end: int) -> tuple[int, int]:
    """(first, last + 1): the ids whose bytes overlap bytes ``start..end-1``, given each id's byte count.

    A tokenizer may fold the byte before an answer into the answer's first id (`` 40`` for " 40213"): that
    id is the answer's all the same, as the model cannot write the value without it.
    """
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    starts = ends - np.asarray(sizes, dtype=np.int64)
    inside = np.flatnonzero((starts < end) & (ends > start))
    if not inside.size:
        raise PosvizError(f"no id covers bytes {start}..{end - 1}")
    return int(inside[0]), int(inside[-1]) + 1


@dataclasses.dataclass
class KeyValueRow:
    """One name of the key-value probe: its row of ids and where its value's ids are, twice.

    ids: (T,) ``\\n<name> = <number>\\n``, a gap of held-out ids, the same binding again (the very same
    ids: the binding is encoded once). ``first``/``second``: (start, end) of the value's ids in the row.
    """

    ids: torch.Tensor
    first: tuple[int, int]
    second: tuple[int, int]


def key_value_rows(text: torch.Tensor, gap: int, trials: int, seed: int, digits: int = 5,
                   model: LabModel | None = None) -> list[KeyValueRow]:
    """The probe's rows for ``model`` (None: bytes as ids); ``text``: held-out ids, ``gap`` of them between.

    Each binding is built as text, then encoded whole (its own ids, as the model would read it), so a
    tokenizer splits the value as it would in any file; the value's ids are those covering its bytes.
    """
    gen = torch.Generator().manual_seed(seed)
    n = text.numel()
    unit = "byte" if model is None else model.unit
    if n < gap + 2:
        raise PosvizError(f"the held-out text has {n:,} {unit}s, too short for a gap of {gap:,}")
    rows = []
    for _ in range(trials):
        name = _random_name(gen)
        number = bytes(str(int(torch.randint(10 ** (digits - 1), 10 ** digits, (1,), generator=gen))), "ascii")
        binding = b"\n" + name + b" = "
        start = int(torch.randint(0, n - gap, (1,), generator=gen))
        line = binding + number + b"\n"
        if model is None:  # byte-level rows
            piece, value = torch.tensor(list(line)), (len(binding), len(binding) + digits)
        else:
            line_ids = model.tokenize(line)
            piece, value = line_ids.ids, ids_covering(line_ids.id_bytes, len(binding), len(binding) + digits)
        shift = piece.numel() + gap
        rows.append(KeyValueRow(torch.cat((piece, text[start:start + gap], piece)), value,
                                (value[0] + shift, value[1] + shift)))
    return rows


def key_value_batch(text: torch.Tensor, gap: int, trials: int, seed: int, digits: int = 5) -> tuple[torch.Tensor, int, int]:
    """The byte-level rows ``\\n<name> = <number>\\n`` + gap of held-out code + ``\\n<name> = <number>\\n``.

    Returns (rows (trials, T), the offset of the first number, the offset of the second). Every row
    has the same layout, so one offset serves all; names and numbers differ per row.
    """
    rows = key_value_rows(text, gap, trials, seed, digits)
    return torch.stack([row.ids for row in rows]), rows[0].first[0], rows[0].second[0]


@dataclasses.dataclass
class Recall:
    """One name's value as the model scored it, unrounded: bits per byte and whether its most likely
    ids were the value's, where it is first bound and where the name comes back."""

    row: KeyValueRow
    value_bytes: int
    first_bits: float
    second_bits: float
    first_correct: bool
    second_correct: bool


@torch.inference_mode()
def key_value_recalls(model: LabModel, text, gap: int, trials: int = 16, seed: int = 0, digits: int = 5) -> list[Recall] | None:
    """Every name of the key-value probe at ``gap`` (ids), scored; None where the method cannot run the row."""
    data = held_out(text, model)
    rows = key_value_rows(data, gap, trials, seed, digits, model)
    if not fits(model, max(row.ids.numel() for row in rows)):
        return None
    ids = [row.ids for row in rows]
    losses, guesses = answer_scores(model, padded(ids))
    scored = {}
    for which in ("first", "second"):
        spans = [getattr(row, which) for row in rows]
        nats, sizes = span_nats_per_byte(model, losses, ids, spans)
        right = [bool((guesses[i, s - 1:e - 1] == ids[i][s:e]).all()) for i, (s, e) in enumerate(spans)]
        scored[which] = (nats / LN2, sizes, right)
    (first, sizes, first_right), (second, _, second_right) = scored["first"], scored["second"]
    return [Recall(row, int(sizes[i]), float(first[i]), float(second[i]), first_right[i], second_right[i])
            for i, row in enumerate(rows)]


def key_value_probe(model: LabModel, text, gaps: Sequence[int], trials: int = 16, seed: int = 0,
                    progress: Progress = no_progress) -> list[KeyValueResult | None]:
    """Bits per byte of a 5-digit value when it is first bound (``first``: about log2(10) = 3.3 per digit,
    it is random) and when the name is used again after ``gap`` ids (``second``: low if recalled), and
    the share of names whose value the model's most likely ids reproduce (``first_correct``/``second_correct``).

    A byte model's value is its 5 digit bytes; a tokenizer's is the ids covering them (see ``ids_covering``),
    their bits summed over their bytes.
    """
    if not 1 <= trials <= 256:
        raise PosvizError(f"use 1 to 256 trials per gap, got {trials}")
    data = held_out(text, model)
    digits = 5
    out: list[KeyValueResult | None] = []
    for i, gap in enumerate(gaps):
        recalls = key_value_recalls(model, data, gap, trials, seed + gap, digits)
        if recalls is None:
            out.append(None)
        else:
            weights = torch.tensor([r.value_bytes for r in recalls], dtype=torch.float64)
            out.append(gap_summary(gap, torch.tensor([r.first_bits for r in recalls], dtype=torch.float64) * LN2,
                                   torch.tensor([r.second_bits for r in recalls], dtype=torch.float64) * LN2,
                                   weights=weights, result=KeyValueResult,
                                   first_correct=round(float(np.mean([r.first_correct for r in recalls])), 4),
                                   second_correct=round(float(np.mean([r.second_correct for r in recalls])), 4)))
        progress((i + 1) / len(gaps))
    return out


# -- effective context length ------------------------------------------------------------------------------------
# Where the pair is planted: the share of the text before it (the far, the middle and the near end), as RULER's and
# NoLiMa's needles are placed at several depths.
EFFECTIVE_DEPTHS = (0.1, 0.5, 0.9)
# The share of its own gain at 1x a length must keep (NoLiMa's relative threshold, Modarressi et al. 2025). RULER's
# absolute one (85.6, Llama 2 7B's score at 4K) is calibrated on 7B chat models answering in words; these checkpoints
# are scored by the bits of a value, so each is held to its own 1x.
EFFECTIVE_KEEP = 0.85
# At 1x the pair must save at least this many bits per byte of its value against the control, or the model does not
# recall at all and no length is "effective": "not measurable", not 16x.
EFFECTIVE_MIN_GAIN = 0.5


@dataclasses.dataclass
class PlantedPair:
    """A text of ``length`` ids with ``\\n<name> = <number>\\n`` planted at ``depth``, asked at the end (``\\n<name>
    = <number>``, the value its last ids); ``control``: the same length and question with no pair planted (the
    text runs on in its place). ``value``: (start, end) of the value's ids at the end of both."""

    primed: torch.Tensor
    control: torch.Tensor
    value: tuple[int, int]
    depth: float


def planted_pairs(text: torch.Tensor, length: int, depths=EFFECTIVE_DEPTHS, trials: int = 8, seed: int = 0,
                  model: LabModel | None = None) -> list[PlantedPair]:
    """``trials`` names per depth in texts of ``length`` ids (``model``'s; None: bytes), drawn from ``text``."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for depth in depths:
        for _ in range(trials):
            name = _random_name(gen)
            number = str(int(torch.randint(10_000, 100_000, (1,), generator=gen))).encode()
            binding, question = b"\n" + name + b" = " + number + b"\n", b"\n" + name + b" = "
            if model is None:
                pair, ask, value = torch.tensor(list(binding)), torch.tensor(list(question + number)), len(number)
            else:
                pair = model.tokenize(binding).ids
                asked = model.tokenize(question + number)
                first, _ = ids_covering(asked.id_bytes, len(question), len(question) + len(number))
                ask, value = asked.ids, asked.ids.numel() - first
            filler = length - ask.numel()
            if filler - pair.numel() < 1 or text.numel() < filler + 1:
                raise PosvizError(f"a text of {length:,} ids is too short to plant a pair and ask for it")
            start = int(torch.randint(0, text.numel() - filler, (1,), generator=gen))
            before = round(depth * (filler - pair.numel()))
            run = text[start:start + filler]
            primed = torch.cat((run[:before], pair, run[before:filler - pair.numel()], ask))
            control = torch.cat((run, ask))
            out.append(PlantedPair(primed, control, (length - value, length), depth))
    return out


@torch.inference_mode()
def planted_recall(model: LabModel, text, length: int, depths=EFFECTIVE_DEPTHS, trials: int = 8, seed: int = 0,
                   batch_rows: int = 8) -> dict | None:
    """The value's bits per byte at the end of a ``length``-id text, with the pair planted (``primed``) and without
    (``control``), per depth and overall; ``gain`` = control - primed. None where the model cannot run the length."""
    if not fits(model, length) or model.cannot_run(length):
        return None
    try:
        pairs = planted_pairs(held_out(text, model), length, depths, trials, seed, model)
    except PosvizError:  # a text too short to hold the pair and its question (a tiny test model's context)
        return None
    rows = [p.primed for p in pairs] + [p.control for p in pairs]
    spans = [p.value for p in pairs] * 2
    bits = []
    for at in range(0, len(rows), batch_rows):  # rows of up to 16x the context: a few at a time
        chunk = rows[at:at + batch_rows]
        losses, _ = answer_scores(model, padded(chunk))
        bits.append(span_nats_per_byte(model, losses, chunk, spans[at:at + batch_rows])[0] / LN2)
    bits = torch.cat(bits).view(2, len(pairs))  # (primed / control, pairs)
    depth_of = torch.tensor([p.depth for p in pairs])
    by_depth = {str(d): {"primed": round(float(bits[0, depth_of == d].mean()), 4),
                         "control": round(float(bits[1, depth_of == d].mean()), 4)} for d in depths}
    primed, control = float(bits[0].mean()), float(bits[1].mean())
    return {"length": int(length), "primed": round(primed, 4), "control": round(control, 4),
            "gain": round(control - primed, 4), "by_depth": by_depth, "pairs": len(pairs)}


def effective_length(rows: dict, keep: float = EFFECTIVE_KEEP, min_gain: float = EFFECTIVE_MIN_GAIN) -> dict:
    """The longest multiple at which the model, and at every shorter multiple, keeps ``keep`` of its own gain at 1x,
    from ``{multiple: planted_recall(...) or None}``: {"multiple": m or None, "reason": words}."""
    ordered = sorted(rows.items(), key=lambda kv: float(kv[0]))
    if not ordered or ordered[0][1] is None or float(ordered[0][0]) != 1.0:
        return {"multiple": None, "reason": "not measurable: the probe cannot run at the trained context (too short to "
                                            "hold a pair and its question, or past what the method represents)"}
    base = ordered[0][1]["gain"]
    if base < min_gain:
        return {"multiple": None, "reason": f"not measurable: at 1x the pair saves {base:.2f} bits per byte of its value "
                                            f"(under {min_gain:g}): the model does not recall it even within its context"}
    best, reason = 1.0, None
    for multiple, row in ordered[1:]:
        if row is None:
            reason = f"cannot run {float(multiple):g}x"
            break
        if row["gain"] < keep * base:
            reason = (f"at {float(multiple):g}x the pair saves {row['gain']:.2f} bits per byte, under {keep:.0%} of "
                      f"its {base:.2f} at 1x")
            break
        best = float(multiple)
    else:
        reason = f"keeps {keep:.0%} of its 1x gain up to the longest length probed ({best:g}x)"
    return {"multiple": best, "reason": reason, "gain_at_1x": round(base, 4)}


def effective_length_block(model: LabModel, text, multiples=None, trials: int | None = None, seed: int = 0) -> dict:
    """The "effective_length" block of metrics.json: ``planted_recall`` at each multiple of the trained context (capped
    by the device's length limit) and the ``effective_length`` they give."""
    from posviz.limits import EFFECTIVE_LENGTH_MULTIPLES, EFFECTIVE_LENGTH_TRIALS, max_eval_length

    multiples = multiples or EFFECTIVE_LENGTH_MULTIPLES
    cap = max_eval_length(model.train_length)
    rows = {}
    for m in multiples:
        first = rows.get("1")
        if m != 1 and multiples[0] == 1 and (first is None or first["gain"] < EFFECTIVE_MIN_GAIN):
            rows[str(m)] = None  # not measurable at 1x: the longer texts would say nothing more
            continue
        rows[str(m)] = (planted_recall(model, text, int(m * model.train_length), trials=trials or EFFECTIVE_LENGTH_TRIALS,
                                       seed=seed) if m * model.train_length <= cap else None)
    return {"rows": rows, **effective_length(rows), "depths": list(EFFECTIVE_DEPTHS), "keep": EFFECTIVE_KEEP}
