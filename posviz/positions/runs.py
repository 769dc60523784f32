"""Position tensors as posviz passes them: runs noted on the tensor (so that a pass need not read a device to know
p0, p0 + 1, ...), their ranges and distances, and the small helpers the methods share (``positions.base`` re-exports
them)."""
from __future__ import annotations

import torch


def _version(t: torch.Tensor) -> int:
    """A tensor's in-place edit counter; inference tensors (``torch.inference_mode``) have none, and
    cannot be edited outside inference mode, so they count as never edited."""
    return 0 if t.is_inference() else t._version


def mark_run(pos: torch.Tensor, p0: int) -> torch.Tensor:
    """Note on ``pos`` that it is p0, p0+1, ...: what the model knows in Python when it builds positions.

    Why: reading a position back (``int(pos[0])``) waits for the GPU to finish all queued work, a
    host sync per call; with the note, ``run_start`` and ``position_range`` answer without reading.
    The note is dropped when ``pos`` is edited in place (its version counter moves)."""
    pos._posviz_run = (int(p0), _version(pos))
    return pos


def _noted_start(pos: torch.Tensor) -> int | None:
    note = getattr(pos, "_posviz_run", None)
    return note[0] if note is not None and note[1] == _version(pos) else None


def position_range(pos: torch.Tensor) -> tuple[int, int]:
    """(smallest, largest) position of a non-empty ``pos``; read from the tensor only when it is no noted run."""
    p0 = _noted_start(pos)
    if p0 is not None:
        return p0, p0 + pos.numel() - 1
    return int(pos.min()), int(pos.max())


def distance_range(q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[int, int]:
    """(smallest, largest) of ``relative_distance(q_pos, k_pos)``: every pair occurs, so min q - max k .. max q - min k."""
    (q_lo, q_hi), (k_lo, k_hi) = position_range(q_pos), position_range(k_pos)
    return q_lo - k_hi, q_hi - k_lo


def run_start(pos: torch.Tensor) -> int | None:
    """p0 when ``pos`` is p0, p0+1, ... (no cache, a growing cache, a sliding window), else None."""
    noted = _noted_start(pos)
    if noted is not None:
        return noted
    n, p0 = pos.numel(), int(pos[0])
    if int(pos[-1]) - p0 != n - 1 or (n > 2 and not bool((pos.diff() == 1).all())):
        return None
    return p0


def relative_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Distance from each query back to each key, ``q - k``: (Tq, Tk), >= 0 for visible keys."""
    return q_pos[:, None] - k_pos[None, :]


def bias_from_distance_table(table: torch.Tensor, distance: torch.Tensor, lo: int) -> torch.Tensor:
    """(H, Tq, Tk) bias from a per-distance table: ``table[:, d - lo]`` for each entry d of ``distance``.

    For biases that depend on the distance alone (T5, KERPLE): compute the few distinct distances
    once (a 1-D range starting at ``lo``), then look every (query, key) pair up, instead of running
    the formula over all Tq x Tk pairs. table (H, D), distance (Tq, Tk).
    """
    return table[:, (distance - lo).flatten()].view(-1, *distance.shape)


def at_least(x: torch.Tensor, low: float) -> torch.Tensor:
    """``x`` clamped to ``low`` in value, with the gradient of ``x`` itself (straight through).

    KERPLE and a formula's floors: training clamps the stored parameters after each update
    (``after_optimizer_step``, as KERPLE's authors do), so there this only guards values from elsewhere: a
    checkpoint trained before that clamp, or edited weights. Passing the gradient straight through keeps such a
    value able to come back.
    """
    return x + (x.clamp(min=low) - x).detach()
