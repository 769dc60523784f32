"""A checkpoint's other training seeds, kept as scores: ``python -m posviz.training.seeds RUN [RUN ...]``.

Every shipped checkpoint is one training run. A run of the same recipe with another seed
(``python -m posviz.train --method rope --seed 2``: other initial weights and another data order) is trained into
``runs/seeds/`` and evaluated here like the shipped checkpoint (every length with its stored windows, the
validation split, the copy and key-value probes, the effective length as trained). Its scores, not its weights
(models/ has no room for them), go into ``seeds.json`` beside the checkpoint: one entry per seed.
``seed_records`` reads the shipped run and those entries as one list, so a reader never asks which is which.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from posviz.errors import PosvizError
from posviz.models.checkpoint_files import SEEDS as SEEDS_FILE
from posviz.models.checkpoint_files import read_config, read_metrics, read_seeds, shipped_checkpoints, write_seeds
# what may differ between two runs of one recipe: the seed, and what says where and how a run ran
NOT_RECIPE = {"seed", "device", "precision_used"}


def _built_options(model: dict) -> dict:
    """The position options a config's model builds, written out. A checkpoint trained before options were pinned
    stores ``{}`` and builds the defaults of the code that loads it (its stored numbers re-score with them:
    tests/test_shipped_checkpoints.py); a newer run stores the same options written out."""
    from posviz.config import ModelConfig
    from posviz.models.byte_gpt import pinned_config

    try:
        return pinned_config(ModelConfig.from_dict(model)).position_options
    except (PosvizError, TypeError, ValueError):
        return model.get("position_options", {})  # not a config this code builds: compared as written


def recipe_differences(run_config: dict, shipped_config: dict) -> list[str]:
    """The recipe's fields (model and training) in which a seed's run differs from the shipped checkpoint, the
    seed aside: empty for a run of the same recipe (position options compared as each config builds them)."""
    out = []
    for part in ("model", "train"):
        a, b = dict(run_config.get(part, {})), dict(shipped_config.get(part, {}))
        if part == "model" and a.get("position_options") != b.get("position_options"):
            a["position_options"], b["position_options"] = _built_options(a), _built_options(b)
        out += [f"{part}.{k}" for k in sorted(set(a) | set(b)) if k not in NOT_RECIPE and a.get(k) != b.get(k)]
    if run_config.get("corpus", {}).get("file_list_sha256") != shipped_config.get("corpus", {}).get("file_list_sha256"):
        out.append("corpus")
    return out


def seed_entry(run_folder: Path, data, validation, device="cpu", documents=None) -> dict:
    """One seed's scores, as metrics.json stores the shipped run's (the same keys, a subset of them); with
    ``documents`` (the held-out files), the attention-sink block too (seeds recorded before it was kept lack it)."""
    from posviz.labs.key_value import effective_length_block
    from posviz.labs.scoring import bits_per_byte
    from posviz.models.checkpoint_files import load_checkpoint
    from posviz.models.interface import open_model
    from posviz.training.evaluate import eval_tables, retrieval_block, sinks_block

    config, metrics = read_config(run_folder), read_metrics(run_folder)
    model = load_checkpoint(run_folder, device=device)
    L = model.config.train_length
    lengths = [m * L for m in (1, 2, 4, 8, 16, 32) if m * L <= len(data)]
    table, windows = eval_tables(model, data, lengths, progress=False)
    entry = {
        "seed": config["train"]["seed"],
        "steps": metrics["steps"], "tokens": metrics["tokens"], "final_train_bpb": metrics["final_train_bpb"],
        "copy_curve": metrics.get("copy_curve", []),
        "eval": {"nonoverlapping_bpb": table, "nonoverlapping_window_bpb": windows,
                 "validation_split_bpb": round(bits_per_byte(model, validation, L, progress=False), 4),
                 "retrieval": retrieval_block(model, validation),
                 "effective_length": {"as_trained": effective_length_block(open_model(run_folder, device=device), validation)}},
    }
    if documents:
        entry["eval"]["sinks"] = sinks_block(model, documents, data)
    return entry


def seed_records(folder: Path) -> list[dict]:
    """The shipped run (its metrics.json, with its seed) and every recorded seed, shipped first: what a spread across
    training seeds is taken over."""
    shipped = {"seed": read_config(folder).get("train", {}).get("seed"), "shipped": True, **read_metrics(folder)}
    return [shipped] + [{**e, "shipped": False} for e in read_seeds(folder) if e["seed"] != shipped["seed"]]


def record(run_folder: Path, checkpoint: Path, data, validation, device="cpu", documents=None) -> dict:
    """Evaluate ``run_folder`` and put its entry into ``checkpoint``'s seeds.json (replacing one of the same seed);
    refused in words when its recipe is not the checkpoint's but for the seed."""
    run_config, shipped_config = read_config(run_folder), read_config(checkpoint)
    differ = recipe_differences(run_config, shipped_config)
    if differ:
        raise PosvizError(f"{run_folder} is not {checkpoint}'s recipe with another seed: it differs in "
                          f"{', '.join(differ)}")
    seed = run_config["train"]["seed"]
    if seed == shipped_config["train"]["seed"]:
        raise PosvizError(f"{run_folder} has the shipped checkpoint's own seed ({seed}): nothing to record")
    entry = seed_entry(run_folder, data, validation, device, documents)
    write_seeds(checkpoint, [e for e in read_seeds(checkpoint) if e["seed"] != seed] + [entry])
    return entry


def main(argv=None) -> None:
    from posviz.limits import add_device_argument, resolve_device
    from posviz.training.data import load_corpus
    from posviz.training.evaluate import DEFAULT_EVAL_BYTES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="a seed's run folder, e.g. runs/seeds/rope-seed2")
    ap.add_argument("--eval-bytes", type=int, default=DEFAULT_EVAL_BYTES)
    add_device_argument(ap)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    corpus = load_corpus()
    data = corpus.eval_stream(args.eval_bytes)
    checkpoints = shipped_checkpoints()
    for run in map(Path, args.runs):
        method = read_config(run)["train"]["method"]
        if method not in checkpoints:
            raise SystemExit(f"error: no shipped checkpoint {method!r} for {run}")
        try:
            entry = record(run, checkpoints[method], data, corpus.validation, device, corpus.eval_documents)
        except PosvizError as exc:
            raise SystemExit("error: " + " ".join(str(exc).split())) from None
        print(run, "seed", entry["seed"], entry["eval"]["nonoverlapping_bpb"], flush=True)


if __name__ == "__main__":
    main()
