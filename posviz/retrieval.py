"""The numbers behind the Far-context retrieval lab: can a model still *use* a far token it needs?

Perplexity alone cannot say: a flat loss curve can hide a model that ignores everything past a few
hundred bytes. These probes put a token the model needs far back and measure whether it gets used.

* Repeat probe: a chunk of held-out text, a gap of other held-out text, the same chunk again. A model
  that can reach the first copy predicts the second one far better; the ratio second/first loss
  (1 = no help from the first copy, 0 = perfect copy) is read per gap, mean and spread over chunks.
* Key-value probe, in the corpus's own shape (code): ``name = 40213`` early in a file, a gap of code,
  then ``name = `` again; the loss on the digits tells whether the model recalls the value.
* Induction heads (Olsson et al. 2022, https://arxiv.org/abs/2209.11895): on the second copy, the
  attention a byte pays to the byte *after* its earlier occurrence, per layer and head, by gap.
* At the end of the module, for the lab's last sections: the retired random-string copy probe
  (``copy_probe_live``, the checkpoints' stored ``shipped_copy_probe``; the probe itself is
  ``copy_probe``) and how much ALiBi attenuates a key by its distance (``alibi_attenuation``).

All bytes come from the validation split (files never seen in training). Losses are in bits per byte.
Shapes: B chunks in a batch, T sequence length, H heads, n chunk length.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .data import byte_ids
from .errors import PosvizError
from .lab_model import LabModel
from .positions.alibi import alibi_slopes

LN2 = math.log(2)


@torch.inference_mode()
def copy_probe(model: LabModel, filler, gaps: Iterable[int], string_length: int = 32, trials: int = 8,
               seed: int = 0) -> dict[str, float | None]:
    """Loss (bits/byte) on the second copy of a random string, by the gap of ordinary text between copies.

    A random string cannot be predicted the first time (~5.2 bits/byte for 36 symbols); the second time
    it can, if the model can still attend to the first copy. As the gap grows past what a method can
    reach, the second copy becomes as hard as the first.
    """
    filler = byte_ids(filler)
    gaps = list(gaps)
    if not isinstance(string_length, (int, np.integer)) or string_length < 2:
        raise PosvizError(f"the copied string needs at least 2 bytes, got {string_length!r}")
    if not isinstance(trials, (int, np.integer)) or trials < 1:
        raise PosvizError(f"trials must be a positive integer, got {trials!r}")
    for gap in gaps:
        if not isinstance(gap, (int, np.integer)) or not 0 <= gap <= filler.numel() - 2:
            raise PosvizError(f"each gap must be an integer from 0 to {filler.numel() - 2:,} (the filler text holds "
                              f"{filler.numel():,} bytes), got {gap!r}")
    gen = torch.Generator().manual_seed(seed)
    alphabet = torch.tensor(list(b"abcdefghijklmnopqrstuvwxyz0123456789"))
    limit = model.max_positions
    result = {}
    for gap in gaps:
        total = 2 * string_length + gap
        if limit is not None and total > limit:
            result[str(gap)] = None
            continue
        rows = []
        for t in range(trials):
            secret = alphabet[torch.randint(0, len(alphabet), (string_length,), generator=gen)]
            start = int(torch.randint(0, filler.numel() - gap - 1, (1,), generator=gen))
            rows.append(torch.cat((secret, filler[start : start + gap], secret)))
        batch = torch.stack(rows).to(model.device)  # (trials, total)
        logits = model(batch[:, :-1]).logits.float()
        losses = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")  # (trials, total-1)
        # losses[:, i] predicts byte i + 1; the second copy is bytes total-n .. total-1, and its byte 1
        # (following the filler) cannot be predicted, so its bytes 2..n are losses[:, total-n : total-1].
        second = losses[:, total - string_length :]
        result[str(gap)] = round(float(second.mean()) / LN2, 4)
    return result
DIGIT_BITS = math.log2(10)  # a uniformly random digit: what a model that cannot recall pays per digit
Progress = Callable[[float], None]


def _no_progress(_: float) -> None:
    pass


def default_gaps(train_length: int, max_multiple: int = 16) -> list[int]:
    """0, then 1/4, 1/2, 1, 2, 4, 8, 16 x the training length: inside and far past what was trained."""
    gaps = [0] + [train_length // 4, train_length // 2] + [train_length * m for m in (1, 2, 4, 8, 16) if m <= max_multiple]
    return sorted(set(g for g in gaps if g >= 0))


def _held_out(text: np.ndarray | bytes | Sequence[int] | torch.Tensor) -> torch.Tensor:
    if isinstance(text, torch.Tensor) and text.dtype == torch.long and text.dim() == 1:
        data = text  # already converted (evaluate_probes does it once for its three probes)
    else:
        array = np.frombuffer(text, dtype=np.uint8) if isinstance(text, (bytes, bytearray)) else np.asarray(text)
        data = torch.tensor(array, dtype=torch.long).flatten()  # a copy: the corpus arrays are read-only
    if data.numel() < 1024:
        raise PosvizError(f"the probes need at least 1,024 bytes of held-out text, got {data.numel():,}")
    return data


def _fits(model: LabModel, total: int) -> bool:
    limit = model.max_positions
    return limit is None or total <= limit


@torch.inference_mode()
def _losses(model: LabModel, batch: torch.Tensor) -> torch.Tensor:
    """(B, T-1) loss in nats of predicting byte t+1 from bytes 0..t."""
    logits = model(batch[:, :-1].to(model.device)).logits.float()
    return F.cross_entropy(logits.transpose(1, 2), batch[:, 1:].to(model.device), reduction="none").cpu()


@dataclasses.dataclass
class GapResult:
    gap: int
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


def _summary(gap: int, first: torch.Tensor, second: torch.Tensor, control: torch.Tensor | None = None) -> GapResult:
    """first, second, control: (B,) mean nats per chunk."""
    ratio = (second / first).numpy()
    result = GapResult(gap, round(float(first.mean()) / LN2, 4), round(float(second.mean()) / LN2, 4),
                       round(float(ratio.mean()), 4), round(float(np.quantile(ratio, 0.1)), 4),
                       round(float(np.quantile(ratio, 0.9)), 4), int(ratio.size))
    if control is not None:
        result.control_bits = round(float(control.mean()) / LN2, 4)
        result.gain = round(float((second / control).mean()), 4)
    return result


def repeat_batch(text: torch.Tensor, gap: int, chunk: int, chunks: int, seed: int,
                 control: bool = False) -> torch.Tensor:
    """(chunks, 2 chunk + gap) rows: chunk, gap of other held-out text, the same chunk again.

    The chunk and the gap are drawn from different places of the held-out text (seeded), so the gap
    is ordinary text that does not contain the chunk. ``control``: the same rows with another chunk
    in the first slot (same seed, so the gap and the last chunk are the very same bytes).
    """
    gen = torch.Generator().manual_seed(seed)
    n = text.numel()
    if n < 2 * (chunk + gap) + 2:
        raise PosvizError(f"the held-out text has {n:,} bytes, too short for a gap of {gap:,} with {chunk}-byte chunks")
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
                 batch_bytes: int = 1 << 16, progress: Progress = _no_progress) -> list[GapResult | None]:
    """The repeat probe at each gap; None where the method cannot represent the positions.

    Both copies are scored on their bytes 1..n-1 (byte 0 of the second copy follows the gap, and
    byte 0 of the first has no context at all), so the ratio compares like with like.
    """
    if not 8 <= chunk <= 1024:
        raise PosvizError(f"the chunk must have 8 to 1,024 bytes, got {chunk}")
    if not 1 <= chunks <= 256:
        raise PosvizError(f"use 1 to 256 chunks per gap, got {chunks}")
    data = _held_out(text)
    out: list[GapResult | None] = []
    for i, gap in enumerate(gaps):
        total = 2 * chunk + gap
        if not _fits(model, total):
            out.append(None)
            progress((i + 1) / len(gaps))
            continue
        per = max(1, batch_bytes // total)

        def losses_of(batch: torch.Tensor) -> torch.Tensor:  # (B, T-1)
            return torch.cat([_losses(model, batch[s:s + per]) for s in range(0, chunks, per)])

        losses = losses_of(repeat_batch(data, gap, chunk, chunks, seed + gap))
        control = losses_of(repeat_batch(data, gap, chunk, chunks, seed + gap, control=True))
        # losses[:, t] predicts byte t+1: the first copy's bytes 1..n-1 are losses[:, 0:n-1], the second's
        # bytes 1..n-1 (positions total-n+1 .. total-1) are losses[:, total-n : total-1]
        first = losses[:, : chunk - 1].mean(1)
        second = losses[:, total - chunk:].mean(1)
        out.append(_summary(gap, first, second, control[:, total - chunk:].mean(1)))
        progress((i + 1) / len(gaps))
    return out


# -- key-value probe ------------------------------------------------------------------------------------
def _random_name(gen: torch.Generator) -> bytes:
    letters = b"abcdefghijklmnopqrstuvwxyz"
    return b"".join(bytes([letters[int(i)]]) for i in torch.randint(0, 26, (8,), generator=gen))


def key_value_batch(text: torch.Tensor, gap: int, trials: int, seed: int, digits: int = 5) -> tuple[torch.Tensor, int, int]:
    """Rows ``\\n<name> = <number>\\n`` + gap of held-out code + ``\\n<name> = <number>\\n``.

    Returns (rows (trials, T), the offset of the first number, the offset of the second). Every row
    has the same layout, so one offset serves all; names and numbers differ per row.
    """
    gen = torch.Generator().manual_seed(seed)
    n = text.numel()
    if n < gap + 2:
        raise PosvizError(f"the held-out text has {n:,} bytes, too short for a gap of {gap:,}")
    rows, first_at, second_at = [], 0, 0
    for _ in range(trials):
        name = _random_name(gen)
        number = bytes(str(int(torch.randint(10 ** (digits - 1), 10 ** digits, (1,), generator=gen))), "ascii")
        binding = b"\n" + name + b" = "
        start = int(torch.randint(0, n - gap, (1,), generator=gen))
        filler = bytes(text[start:start + gap].tolist())
        row = binding + number + b"\n" + filler + binding + number + b"\n"
        first_at, second_at = len(binding), len(binding) + digits + 1 + gap + len(binding)
        rows.append(torch.tensor(list(row)))
    return torch.stack(rows), first_at, second_at


def key_value_probe(model: LabModel, text, gaps: Sequence[int], trials: int = 16, seed: int = 0,
                    progress: Progress = _no_progress) -> list[GapResult | None]:
    """Bits per digit of a 5-digit value when it is first bound (``first``: about log2(10) = 3.3, it
    is random) and when the name is used again after the gap (``second``: low if recalled)."""
    if not 1 <= trials <= 256:
        raise PosvizError(f"use 1 to 256 trials per gap, got {trials}")
    data = _held_out(text)
    digits = 5
    out: list[GapResult | None] = []
    for i, gap in enumerate(gaps):
        batch, a, b = key_value_batch(data, gap, trials, seed + gap, digits)
        if not _fits(model, batch.shape[1]):
            out.append(None)
        else:
            losses = _losses(model, batch)  # losses[:, t] predicts byte t+1
            first = losses[:, a - 1:a - 1 + digits].mean(1)
            second = losses[:, b - 1:b - 1 + digits].mean(1)
            out.append(_summary(gap, first, second))
        progress((i + 1) / len(gaps))
    return out


# -- induction heads ---------------------------------------------------------------------------------------
@torch.inference_mode()
def induction_scores(model: LabModel, text, gaps: Sequence[int], chunk: int = 64, chunks: int = 8, seed: int = 0,
                     progress: Progress = _no_progress) -> dict[int, np.ndarray | None]:
    """{gap: (n_layer, H) mean attention from second-copy byte t to first-copy byte t+1}, None where the
    method cannot run. An induction head puts most of its weight there: "what came after this, last time?".

    The text before the second copy is encoded once into a KV cache; only the second copy's queries
    then ask for a map (n x T per layer, not T x T), so long gaps stay cheap.
    """
    data = _held_out(text)
    L, H = model.n_layer, model.n_head
    out: dict[int, np.ndarray | None] = {}
    for i, gap in enumerate(gaps):
        total = 2 * chunk + gap
        if not _fits(model, total):
            out[gap] = None
            progress((i + 1) / len(gaps))
            continue
        batch = repeat_batch(data, gap, chunk, chunks, seed + gap).to(model.device)  # (B, T)
        prefix, second = batch[:, : chunk + gap], batch[:, chunk + gap:]
        t = torch.arange(chunk - 1, device=model.device)  # second-copy bytes 0..n-2 ...
        targets = t + 1  # ... look at first-copy bytes 1..n-1
        scores = np.zeros((L, H))
        for layer in range(L):
            cache = model.new_cache()
            model(prefix, cache=cache)
            probs = model(second, cache=cache, attention_layer=layer).attention  # (B, H, n, T)
            scores[layer] = probs[:, :, t, targets].float().mean(dim=(0, 2)).cpu().numpy()
        out[gap] = scores
        progress((i + 1) / len(gaps))
    return out


def alibi_reach(slopes: Sequence[float], margin: float) -> list[dict]:
    """Per ALiBi head: the distance at which its penalty -m d cancels a content match worth ``margin``
    logits (d = margin / m). Past it the first copy scores below a neighbour that matches nothing, so an
    induction head with that slope cannot find it however well it matches."""
    return [{"head": h, "slope": float(m), "reach": float(margin) / float(m)} for h, m in enumerate(slopes)]


def as_rows(results: Sequence[GapResult | None], gaps: Sequence[int]) -> list[dict]:
    """JSON-ready rows for metrics.json and tables; a gap the method cannot run is {gap, None...}."""
    rows = []
    for gap, r in zip(gaps, results):
        rows.append(dataclasses.asdict(r) if r is not None else
                    {**{f.name: None for f in dataclasses.fields(GapResult)}, "gap": int(gap), "chunks": 0})
    return rows


COPY_CHECK_BYTES = 200_000  # held-out bytes the training-time check draws its chunks from


def copy_check(model, validation) -> dict | None:
    """The repeat probe at gap 0 (16 chunks of 64 bytes from the first 200,000 held-out bytes): does
    the model (a ``posviz.model.GPT`` in training) copy yet? Training runs it at every saved state, so
    each checkpoint's metrics show when copying formed. None when the model cannot hold two chunks (a
    learned table shorter than 128)."""
    from .checkpoint_model import as_lab_model

    text = _held_out(np.asarray(validation)[:COPY_CHECK_BYTES])
    was_training = model.training
    model.eval()
    try:
        result = repeat_probe(as_lab_model(model), text, [0], chunks=16, seed=0)[0]
    finally:
        model.train(was_training)
    return None if result is None else {"ratio": result.ratio, "gain": result.gain}


def evaluate_probes(model: LabModel, text, train_length: int, chunks: int = 16, seed: int = 0) -> dict:
    """The "retrieval" block of a checkpoint's metrics.json: all three probes at the ``default_gaps`` the
    held-out text is long enough for."""
    text = _held_out(text)
    gaps = [g for g in default_gaps(train_length) if 2 * (64 + g) + 2 <= text.numel()]
    induction = induction_scores(model, text, gaps, chunks=max(4, chunks // 2), seed=seed)
    return {
        "gaps": gaps,
        "repeat": as_rows(repeat_probe(model, text, gaps, chunks=chunks, seed=seed), gaps),
        "key_value": as_rows(key_value_probe(model, text, gaps, trials=chunks, seed=seed), gaps),
        "induction": {str(g): (None if s is None else np.round(s, 4).tolist()) for g, s in induction.items()},
    }


__all__ = ["DIGIT_BITS", "GapResult", "RANDOM_STRING_BITS", "alibi_attenuation", "alibi_reach", "as_rows",
           "copy_probe_live", "default_gaps", "evaluate_probes", "induction_scores", "key_value_probe", "probe_gaps",
           "repeat_probe", "shipped_copy_probe"]


# -- tables for the lab -----------------------------------------------------------------------------------
PROBES = {"repeat": "repeat probe", "key_value": "key-value probe"}


def shipped_rows(metrics_by_name: dict[str, dict | None]) -> list[dict]:
    """Long-format rows {model, probe, gap, first_bits, second_bits, ratio, ...} from each checkpoint's
    stored eval.retrieval block; checkpoints without one are skipped (the page says so)."""
    rows = []
    for name, metrics in metrics_by_name.items():
        block = ((metrics or {}).get("eval") or {}).get("retrieval")
        if not block:
            continue
        for probe in PROBES:
            for row in block.get(probe, []):
                rows.append({"model": name, "probe": probe, **row})
    return rows


COPY_TARGET = 0.5  # the set's goal: the second copy costs at most half the first, right after it


def copy_curve_rows(metrics_by_name: dict[str, dict | None]) -> list[dict]:
    """Rows {model, step, bytes, ratio, gain} of each checkpoint's ``copy_curve`` (the repeat probe at
    gap 0 that training runs at every saved state): when, during training, copying formed.
    Checkpoints trained before the check existed have none and are skipped (the page says so)."""
    return [{"model": name, "step": point["step"], "bytes": point["tokens"], "ratio": point["ratio"], "gain": point["gain"]}
            for name, metrics in metrics_by_name.items() for point in (metrics or {}).get("copy_curve") or []]


def results_rows(name: str, probe: str, results: Sequence[GapResult | None], gaps: Sequence[int]) -> list[dict]:
    """The same rows for a live run."""
    return [{"model": name, "probe": probe, **row} for row in as_rows(results, gaps)]


def induction_table(metrics_by_name: dict[str, dict | None]) -> dict[str, dict[int, np.ndarray | None]]:
    """{model: {gap: (n_layer, H) induction scores or None}} from the stored blocks."""
    out = {}
    for name, metrics in metrics_by_name.items():
        block = ((metrics or {}).get("eval") or {}).get("retrieval")
        if block and block.get("induction"):
            out[name] = {int(g): (None if v is None else np.asarray(v, dtype=float)) for g, v in block["induction"].items()}
    return out


def induction_rows(table: dict[str, dict[int, np.ndarray | None]]) -> list[dict]:
    """Rows {model, gap, layer, head, score} of every stored score, plus {best}: the strongest head's
    score at each gap (the head chosen at gap 0, so the curve follows one head as the gap grows)."""
    rows = []
    for name, by_gap in table.items():
        at0 = by_gap.get(0)
        best = None if at0 is None else np.unravel_index(int(np.argmax(at0)), at0.shape)
        for gap, scores in sorted(by_gap.items()):
            if scores is None:
                continue
            for (layer, head), score in np.ndenumerate(scores):
                rows.append({"model": name, "gap": gap, "layer": int(layer), "head": int(head), "score": float(score),
                             "best": best is not None and (layer, head) == tuple(best)})
    return rows


# -- the retired random-string copy probe, and ALiBi's attenuation by distance ---------------------------
RANDOM_STRING_BITS = math.log2(36)  # the probe's strings are drawn from 36 symbols: a blind guess costs this


def probe_gaps(max_total: int, string_length: int) -> list[int]:
    """Gaps 0, 16, 32, 64, ... whose probe (two copies + gap) fits in ``max_total`` bytes."""
    gaps, g = [0], 16
    while 2 * string_length + g <= max_total:
        gaps.append(g)
        g *= 2
    return gaps


def copy_probe_live(model: LabModel, filler, gaps: Sequence[int], string_length: int = 32, trials: int = 4,
                    progress: Progress = _no_progress) -> dict[int, float | None]:
    """``copy_probe`` gap by gap (for a progress bar), capped at the device's length cap.

    None where the method cannot represent the positions (learned past its table).
    """
    if not 4 <= string_length <= 256:
        raise PosvizError(f"The random string must have 4 to 256 bytes, got {string_length}.")
    if not 1 <= trials <= 32:
        raise PosvizError(f"Use 1 to 32 trials, got {trials}.")
    cap = model.length_cap
    filler = byte_ids(filler)
    out = {}
    for i, gap in enumerate(gaps):
        if 2 * string_length + gap > cap:
            raise PosvizError(f"A gap of {gap:,} with two {string_length}-byte copies is past this device's cap of "
                              f"{cap:,} bytes.")
        if gap + 2 > filler.numel():
            raise PosvizError(f"The filler text has {filler.numel():,} bytes, too short for a gap of {gap:,}.")
        out[int(gap)] = copy_probe(model, filler, [gap], string_length=string_length, trials=trials,
                                   seed=gap)[str(gap)]
        progress((i + 1) / len(gaps))
    return out


def shipped_copy_probe(model: LabModel) -> list[tuple[int, float | None]]:
    table = model.stored_metrics().get("eval", {}).get("copy_probe", {})
    return sorted((int(g), None if v is None else float(v)) for g, v in table.items())


def alibi_attenuation(n_head: int, distances: Sequence[int]) -> list[dict]:
    """Rows {head, slope, distance, penalty, factor}: ALiBi subtracts ``penalty = slope * distance``
    from the logit of a key ``distance`` bytes back, i.e. multiplies its weight by ``factor =
    exp(-penalty)`` before normalisation, whatever the input."""
    slopes = alibi_slopes(n_head).double()
    return [{"head": h, "slope": float(m), "distance": int(d), "penalty": float(m) * d, "factor": math.exp(-float(m) * d)}
            for h, m in enumerate(slopes) for d in distances]
