"""The Workshop's quick recipe (``python -m posviz.train --quick``) and the scores a quick checkpoint stores."""
from __future__ import annotations

from pathlib import Path

import torch

from posviz.errors import PositionLimitError, PosvizError
from posviz.models.checkpoint_files import load_checkpoint
from posviz.training.data import load_corpus
from posviz.training.evaluate import eval_tables
from posviz.training.train import TrainConfig

# --quick: the Workshop's short recipe, the shared recipe with fewer bytes (see QUICK_RECIPE_WHY), run for every
# quick checkpoint alike (a formula and the quick baselines alibi, rope, nope), so they compare with each other and
# not with the shipped set.
QUICK_RECIPE = {"tokens": 2_000_000, "warmup_steps": 30, "eval_bytes": 1 << 15, "checkpoint_every": 1_000_000}
QUICK_RECIPE_WHY = ("2 M bytes from scratch (488 steps), a 30-step warm-up and 32 KiB of validation: about 3 minutes on "
                    "2 CPU threads; docs/workshop.md has the measurements behind it")
QUICK_MULTIPLES = (1, 4, 16)  # the lengths a quick checkpoint is scored at after training, as multiples of its context


def quick_eval(folder: str | Path, cfg: TrainConfig, multiples=QUICK_MULTIPLES, progress: bool = False) -> dict:
    """bits per byte of ``folder``'s stored weights at each multiple of the training length, on the recipe's
    validation text: the "eval" block a quick checkpoint's metrics.json holds (the shipped set's evaluate_all keys)."""
    model = load_checkpoint(folder)
    data = load_corpus(cfg.corpus).eval_stream(max(cfg.eval_bytes, max(multiples) * cfg.train_length + 1))
    lengths = [m * cfg.train_length for m in multiples]
    table, _ = eval_tables(model, data, lengths, progress=progress)
    return {"nonoverlapping_bpb": table, "lengths_x_train": {str(n): float(m) for n, m in zip(lengths, multiples)},
            "eval_bytes": int(len(data))}


def scored_length(cfg: TrainConfig, multiples=QUICK_MULTIPLES) -> int:
    """The longest text a quick checkpoint is scored on (16x its context): what its method is checked up to first."""
    return max(multiples) * cfg.train_length


def check_scored_lengths(position, cfg: TrainConfig) -> None:
    """Refuse, before any training step, a method that is no bias at some length a run will be scored at (a formula
    that is NaN, infinite or too large for float32 only past 4x): the scoring would fail after the whole run, and the
    server's one training slot would have been spent on nothing. ``position``: the run's position method, as built.
    A learned table's end is no refusal: its longer lengths are scored as not measurable."""
    n = scored_length(cfg)
    was_training = position.training
    position.eval()
    try:
        with torch.no_grad():
            position.check_positions(torch.arange(n))
    except PositionLimitError:
        pass
    except PosvizError as exc:  # the same words, and why a length past the context is checked now
        raise type(exc)(f"{exc} A run is scored up to {n:,} positions ({max(QUICK_MULTIPLES)}x its trained context), "
                        "so this is checked before training.") from None
    finally:
        position.train(was_training)
