"""The numbers behind the Far-context retrieval lab's tables and charts: the shipped checkpoints' stored
probe results as rows, the retired random-string copy probe (``copy_probe_live``, the checkpoints'
stored ``shipped_copy_probe``), and how much ALiBi attenuates a key by its distance. The probes
themselves are ``posviz.labs.probes``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from posviz.errors import PosvizError
from posviz.models.interface import LabModel
from posviz.positions.alibi import alibi_slopes
from posviz.labs.probes import GapResult, Progress, as_ids, as_rows, copy_probe, no_progress


def alibi_reach(slopes: Sequence[float], margin: float) -> list[dict]:
    """Per ALiBi head: the distance at which its penalty -m d cancels a content match worth ``margin``
    logits (d = margin / m). Past it the first copy scores below a neighbour that matches nothing, so an
    induction head with that slope cannot find it however well it matches."""
    return [{"head": h, "slope": float(m), "reach": float(margin) / float(m)} for h, m in enumerate(slopes)]



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
                    progress: Progress = no_progress) -> dict[int, float | None]:
    """``copy_probe`` gap by gap (for a progress bar), capped at the device's length cap; gaps in the model's ids.

    None where the method cannot represent the positions (learned past its table).
    """
    if not 4 <= string_length <= 256:
        raise PosvizError(f"The random string must have 4 to 256 bytes, got {string_length}.")
    if not 1 <= trials <= 32:
        raise PosvizError(f"Use 1 to 32 trials, got {trials}.")
    cap, unit = model.length_cap, model.unit
    filler = as_ids(filler, model)
    out = {}
    for i, gap in enumerate(gaps):
        # a string of n bytes is at most n ids: the check holds for a tokenizer's ids too
        if 2 * string_length + gap > cap:
            raise PosvizError(f"A gap of {gap:,} with two {string_length}-byte copies is past this device's cap of "
                              f"{cap:,} {unit}s.")
        if gap + 2 > filler.numel():
            raise PosvizError(f"The filler text has {filler.numel():,} {unit}s, too short for a gap of {gap:,}.")
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
