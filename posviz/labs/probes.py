"""Far-context probes: can a model still *use* a far token it needs? (the Retrieval lab's, and the
checkpoints' evaluation)

Perplexity alone cannot say: a flat loss curve can hide a model that ignores everything past a few
hundred bytes. These probes put a token the model needs far back and measure whether it gets used.

Every probe runs in the model's own ids (``LabModel.encode``): bytes for our checkpoints, a tokenizer's
tokens for a published model (``model.unit``). Gaps, chunks and the training length are counted in
those ids; losses are reported in bits per *byte* (an answer's bits summed over its ids, over the bytes
those ids cover: ``bytes_per_id``), so a byte model and a tokenizer's compare. For a byte model every
number is what it was when ids were bytes.

* Repeat probe: a chunk of held-out text, a gap of other held-out text, the same chunk again. A model
  that can reach the first copy predicts the second one far better; the ratio second/first loss
  (1 = no help from the first copy, 0 = perfect copy) is read per gap, mean and spread over chunks.
* Key-value probe, in the corpus's own shape (code): ``name = 40213`` early in a file, a gap of code,
  then ``name = `` again; the loss on the digits tells whether the model recalls the value.
* Induction heads (Olsson et al. 2022, https://arxiv.org/abs/2209.11895): on the second copy, the
  attention an id pays to the id *after* its earlier occurrence, per layer and head, by gap.

All text comes from the validation split (files never seen in training). Losses are in bits per byte.
Shapes: B chunks (rows) in a batch, T sequence length in ids, H heads, n chunk length in ids, k ids of an answer.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from posviz.errors import PosvizError
from posviz.models.interface import LabModel
from posviz.labs.attention_maps import as_drawn


LN2 = math.log(2)


@torch.inference_mode()
def copy_probe(model: LabModel, filler, gaps: Iterable[int], string_length: int = 32, trials: int = 8,
               seed: int = 0) -> dict[str, float | None]:
    """Loss (bits/byte) on the second copy of a random string, by the gap of ordinary text between copies.

    A random string cannot be predicted the first time (~5.2 bits/byte for 36 symbols); the second time
    it can, if the model can still attend to the first copy. As the gap grows past what a method can
    reach, the second copy becomes as hard as the first. The string has ``string_length`` bytes (its ids
    in the model's encoding, each copy the same ids); the gap is ``gap`` ids of ``filler``.
    """
    filler = as_ids(filler, model)
    gaps = list(gaps)
    if not isinstance(string_length, (int, np.integer)) or string_length < 2:
        raise PosvizError(f"the copied string needs at least 2 bytes, got {string_length!r}")
    if not isinstance(trials, (int, np.integer)) or trials < 1:
        raise PosvizError(f"trials must be a positive integer, got {trials!r}")
    for gap in gaps:
        if not isinstance(gap, (int, np.integer)) or not 0 <= gap <= filler.numel() - 2:
            raise PosvizError(f"each gap must be an integer from 0 to {filler.numel() - 2:,} (the filler text holds "
                              f"{filler.numel():,} {model.unit}s), got {gap!r}")
    gen = torch.Generator().manual_seed(seed)
    alphabet = torch.tensor(list(b"abcdefghijklmnopqrstuvwxyz0123456789"))
    result = {}
    for gap in gaps:
        rows, spans = [], []
        for t in range(trials):
            secret = alphabet[torch.randint(0, len(alphabet), (string_length,), generator=gen)]
            start = int(torch.randint(0, filler.numel() - gap - 1, (1,), generator=gen))
            secret = model.encode(bytes(secret.tolist()))  # the string as the model reads it (a byte model: the bytes)
            rows.append(torch.cat((secret, filler[start : start + gap], secret)))
            # the second copy's id 0 follows the filler and cannot be predicted: score its ids 1..k-1
            spans.append((rows[-1].numel() - secret.numel() + 1, rows[-1].numel()))
        if not fits(model, max(row.numel() for row in rows)):
            result[str(gap)] = None
            continue
        losses = _row_losses(model, rows)  # (trials, T-1)
        nats, sizes = span_nats_per_byte(model, losses, rows, spans)
        scored = sizes > 0  # a string that is one token leaves nothing to score after its first id
        result[str(gap)] = (round(float((nats[scored] * sizes[scored]).sum() / sizes[scored].sum()) / LN2, 4)
                            if scored.any() else None)
    return result


Progress = Callable[[float], None]


def no_progress(_: float) -> None:
    pass


def default_gaps(train_length: int, max_multiple: int = 16) -> list[int]:
    """0, then 1/4, 1/2, 1, 2, 4, 8, 16 x the training length: inside and far past what was trained."""
    gaps = [0] + [train_length // 4, train_length // 2] + [train_length * m for m in (1, 2, 4, 8, 16) if m <= max_multiple]
    return sorted(set(g for g in gaps if g >= 0))


def as_ids(text, model: LabModel | None = None) -> torch.Tensor:
    """(T,) the model's ids of ``text``. A 1-D int64 tensor is ids already (a caller that encoded once for
    several probes); anything else (bytes, a uint8 array, byte values) is text, which ``model`` encodes.
    Without a model the bytes are the ids."""
    if isinstance(text, torch.Tensor) and text.dtype == torch.long and text.dim() == 1:
        return text
    if model is None:
        array = np.frombuffer(text, dtype=np.uint8) if isinstance(text, (bytes, bytearray)) else np.asarray(text)
        return torch.tensor(array, dtype=torch.long).flatten()  # a copy: the corpus arrays are read-only
    data = bytes(text) if isinstance(text, (bytes, bytearray)) else np.asarray(text, dtype=np.uint8).tobytes()
    return model.tokenize(data).ids


def held_out(text: np.ndarray | bytes | Sequence[int] | torch.Tensor, model: LabModel | None = None) -> torch.Tensor:
    """(T,) ids of the held-out text the probes draw from (see ``as_ids``), at least 1,024 of them."""
    data = as_ids(text, model)
    if data.numel() < 1024:
        unit = model.unit if model is not None else "byte"
        raise PosvizError(f"the probes need at least 1,024 {unit}s of held-out text, got {data.numel():,}")
    return data


def fits(model: LabModel, total: int) -> bool:
    limit = model.max_positions
    return limit is None or total <= limit


@torch.inference_mode()
def _losses(model: LabModel, batch: torch.Tensor) -> torch.Tensor:
    """(B, T-1) loss in nats of predicting id t+1 from ids 0..t."""
    return answer_scores(model, batch)[0]


@torch.inference_mode()
def answer_scores(model: LabModel, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T-1) loss in nats of predicting id t+1 from ids 0..t, and (B, T-1) the id found most likely there."""
    logits = model(batch[:, :-1].to(model.device)).logits.float()
    losses = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:].to(model.device), reduction="none").cpu()
    return losses, logits.argmax(-1).cpu()


def padded(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """(B, T) rows of different lengths, padded at the end with id 0 (rows of one length: just stacked).

    Why the end: the models are causal, so what follows a row's last id changes none of its losses;
    only the padded columns themselves are meaningless, and no probe reads them.
    """
    longest = max(row.numel() for row in rows)
    if all(row.numel() == longest for row in rows):
        return torch.stack(list(rows))
    batch = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, :row.numel()] = row
    return batch


def _row_losses(model: LabModel, rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """(B, T-1) nats of each row's id t+1 given its ids 0..t (see ``padded``)."""
    return _losses(model, padded(rows))


def _bytes_of(model: LabModel, ids: torch.Tensor) -> torch.Tensor:
    """(B,) bytes the ids of each row of ``ids`` (B, n) cover."""
    sizes = model.bytes_per_id(ids.flatten().cpu())  # it reads ids in one flat run
    return torch.as_tensor(np.asarray(sizes, dtype=np.float64)).reshape(ids.shape).sum(1)


def span_nats_per_byte(model: LabModel, losses: torch.Tensor, rows: Sequence[torch.Tensor],
                        spans: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) nats per byte of each row's ids ``start..end-1`` (an answer: its ids' loss summed, over the bytes
    they cover), and (B,) those bytes. losses: (B, T-1), column t predicting id t+1."""
    nats, sizes = [], []
    for row, loss, (start, end) in zip(rows, losses, spans):
        n_bytes = float(model.bytes_per_id(row[start:end]).sum()) if end > start else 0.0
        nats.append(float(loss[start - 1:end - 1].double().sum()) / n_bytes if n_bytes else float("nan"))
        sizes.append(n_bytes)
    return torch.tensor(nats, dtype=torch.float64), torch.tensor(sizes, dtype=torch.float64)


@dataclasses.dataclass
class GapResult:
    gap: int  # in the model's ids (bytes for a checkpoint, tokens for a published model)
    first_bits: float  # mean loss on the first copy (bits/byte)
    second_bits: float  # mean loss on the second copy
    ratio: float  # mean over chunks of second / first
    ratio_low: float  # 10th percentile over chunks
    ratio_high: float  # 90th percentile
    chunks: int
    # The same bytes at the same positions with no earlier copy (another chunk in the first slot):
    # what the second copy would cost without retrieval. Past the training length a method can get
    # worse at every byte; second / control separates "uses the copy" from "lost at this position".
    control_bits: float | None = None
    gain: float | None = None  # mean over chunks of second / control (1 = the copy does not help)


def gap_summary(gap: int, first: torch.Tensor, second: torch.Tensor, control: torch.Tensor | None = None,
             weights: torch.Tensor | None = None, result: type[GapResult] = GapResult, **extra) -> GapResult:
    """first, second, control: (B,) mean nats per byte per chunk. ``weights``: (B,) bytes scored per
    chunk, when chunks cover different numbers of bytes (a tokenizer's): the bits per byte over all of
    them is then their bits summed over their bytes. None: every chunk weighs the same (a byte model)."""
    def mean(x: torch.Tensor) -> float:
        return float(x.mean()) if weights is None else float((x.double() * weights).sum() / weights.sum())

    ratio = (second / first).numpy()
    out = result(gap, round(mean(first) / LN2, 4), round(mean(second) / LN2, 4),
                 round(float(ratio.mean()), 4), round(float(np.quantile(ratio, 0.1)), 4),
                 round(float(np.quantile(ratio, 0.9)), 4), int(ratio.size), **extra)
    if control is not None:
        out.control_bits = round(mean(control) / LN2, 4)
        out.gain = round(float((second / control).mean()), 4)
    return out


def repeat_batch(text: torch.Tensor, gap: int, chunk: int, chunks: int, seed: int,
                 control: bool = False, unit: str = "byte") -> torch.Tensor:
    """(chunks, 2 chunk + gap) rows of ids: chunk, gap of other held-out text, the same chunk again.

    The chunk and the gap are drawn from different places of the held-out ids (seeded), so the gap
    is ordinary text that does not contain the chunk. ``control``: the same rows with another chunk
    in the first slot (same seed, so the gap and the last chunk are the very same ids). The rows are
    cut from the text's ids, not encoded row by row: the second copy must be the first's very ids.
    """
    gen = torch.Generator().manual_seed(seed)
    n = text.numel()
    if n < 2 * (chunk + gap) + 2:
        raise PosvizError(f"the held-out text has {n:,} {unit}s, too short for a gap of {gap:,} with {chunk}-{unit} chunks")
    rows = []
    for _ in range(chunks):
        a = int(torch.randint(0, n - chunk, (1,), generator=gen))
        b = int(torch.randint(0, n - gap, (1,), generator=gen))
        while gap and abs(b - a) < chunk + gap:  # keep the gap away from the chunk's own neighbourhood
            b = int(torch.randint(0, n - gap, (1,), generator=gen))
        piece = text[a:a + chunk]
        c = (a + n // 2) % (n - chunk)  # far from the chunk: unrelated text of the same kind
        rows.append(torch.cat((text[c:c + chunk] if control else piece, text[b:b + gap], piece)))
    return torch.stack(rows)


def repeat_probe(model: LabModel, text, gaps: Sequence[int], chunk: int = 64, chunks: int = 16, seed: int = 0,
                 batch_ids: int = 1 << 16, progress: Progress = no_progress) -> list[GapResult | None]:
    """The repeat probe at each gap; None where the method cannot represent the positions.

    ``text``: held-out text (bytes, encoded here) or the model's ids of it; ``gaps`` and ``chunk`` are in
    the model's ids. Both copies are scored on their ids 1..n-1 (id 0 of the second copy follows the gap,
    and id 0 of the first has no context at all), so the ratio compares like with like; a chunk's loss is
    its ids' bits over the bytes they cover.
    """
    if not 8 <= chunk <= 1024:
        raise PosvizError(f"the chunk must have 8 to 1,024 {model.unit}s, got {chunk}")
    if not 1 <= chunks <= 256:
        raise PosvizError(f"use 1 to 256 chunks per gap, got {chunks}")
    data = held_out(text, model)
    out: list[GapResult | None] = []
    for i, gap in enumerate(gaps):
        total = 2 * chunk + gap
        if not fits(model, total):
            out.append(None)
            progress((i + 1) / len(gaps))
            continue
        per = max(1, batch_ids // total)

        def losses_of(batch: torch.Tensor) -> torch.Tensor:  # (B, T-1)
            return torch.cat([_losses(model, batch[s:s + per]) for s in range(0, chunks, per)])

        batch = repeat_batch(data, gap, chunk, chunks, seed + gap, unit=model.unit)
        losses = losses_of(batch)
        control = losses_of(repeat_batch(data, gap, chunk, chunks, seed + gap, control=True, unit=model.unit))
        # losses[:, t] predicts id t+1: the first copy's ids 1..n-1 are losses[:, 0:n-1], the second's
        # ids 1..n-1 (positions total-n+1 .. total-1) are losses[:, total-n : total-1]
        first, second, no_copy = losses[:, : chunk - 1], losses[:, total - chunk:], control[:, total - chunk:]
        # both copies (and the control's) score the same ids, so one count of bytes serves all three
        n_bytes = _bytes_of(model, batch[:, total - chunk + 1:])
        out.append(gap_summary(gap, first.double().sum(1) / n_bytes, second.double().sum(1) / n_bytes,
                               no_copy.double().sum(1) / n_bytes, weights=n_bytes))
        progress((i + 1) / len(gaps))
    return out


# -- induction heads ---------------------------------------------------------------------------------------
@torch.inference_mode()
def induction_scores(model: LabModel, text, gaps: Sequence[int], chunk: int = 64, chunks: int = 8, seed: int = 0,
                     progress: Progress = no_progress) -> dict[int, np.ndarray | None]:
    """{gap: (n_layer, H) mean attention from second-copy id t to first-copy id t+1}, None where the
    method cannot run; a recurrent layer's share of its implied row's |w| (``attention_maps.as_drawn``). An induction head puts most of its weight there: "what came after this, last time?".
    ``gaps`` and ``chunk`` are in the model's ids: the copies must be the very same ids to line up.

    The text before the second copy is encoded once into a KV cache; only the second copy's queries
    then ask for a map (n x T per layer, not T x T), so long gaps stay cheap.
    """
    data = held_out(text, model)
    L, H = model.n_layer, model.n_head
    out: dict[int, np.ndarray | None] = {}
    for i, gap in enumerate(gaps):
        total = 2 * chunk + gap
        if not fits(model, total):
            out[gap] = None
            progress((i + 1) / len(gaps))
            continue
        batch = repeat_batch(data, gap, chunk, chunks, seed + gap, unit=model.unit).to(model.device)  # (B, T)
        prefix, second = batch[:, : chunk + gap], batch[:, chunk + gap:]
        t = torch.arange(chunk - 1, device=model.device)  # second-copy ids 0..n-2 ...
        targets = t + 1  # ... look at first-copy ids 1..n-1
        scores = np.zeros((L, H))
        for layer in range(L):
            cache = model.new_cache(for_maps=True)  # a recurrent layer's rows read the keys before the copy
            model(prefix, cache=cache)
            probs = as_drawn(model, layer, model(second, cache=cache, attention_layer=layer).attention.float())  # (B, H, n, T)
            scores[layer] = probs[:, :, t, targets].float().mean(dim=(0, 2)).cpu().numpy()
        out[gap] = scores
        progress((i + 1) / len(gaps))
    return out


COPY_CHECK_BYTES = 200_000  # held-out bytes the training-time check draws its chunks from


def copy_check(model, validation) -> dict | None:
    """The repeat probe at gap 0 (16 chunks of 64 bytes from the first 200,000 held-out bytes): does
    the model (a ``posviz.models.byte_gpt.GPT`` in training) copy yet? Training runs it at every saved state, so
    each checkpoint's metrics show when copying formed. None when the model cannot hold two chunks (a
    learned table shorter than 128)."""
    from posviz.models.shipped import as_lab_model

    text = held_out(np.asarray(validation)[:COPY_CHECK_BYTES])
    was_training = model.training
    model.eval()
    try:
        result = repeat_probe(as_lab_model(model), text, [0], chunks=16, seed=0)[0]
    finally:
        model.train(was_training)
    return None if result is None else {"ratio": result.ratio, "gain": result.gain}



def as_rows(results: Sequence[GapResult | None], gaps: Sequence[int]) -> list[dict]:
    """JSON-ready rows for metrics.json and tables; a gap the method cannot run is {gap, None...}."""
    kind = next((type(r) for r in results if r is not None), GapResult)  # the key-value probe's has more columns
    rows = []
    for gap, r in zip(gaps, results):
        rows.append(dataclasses.asdict(r) if r is not None else
                    {**{f.name: None for f in dataclasses.fields(kind)}, "gap": int(gap), "chunks": 0})
    return rows
