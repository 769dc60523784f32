"""The Workshop's quick recipe (``python -m posviz.train --quick``) and the scores a quick checkpoint stores."""
from __future__ import annotations

from pathlib import Path

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
