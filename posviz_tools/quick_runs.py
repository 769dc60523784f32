"""The Workshop's quick runs: ``python -m posviz_tools.quick_runs [--only NAME ...] [--seeds S ...] [--write-only]``.

Trains, with ``python -m posviz.train --quick``, the quick baselines (alibi, rope, nope: the fair comparison for a
formula trained on the Workshop page) and the formulas docs/workshop.md discusses, each into ``runs/quick/<name>``
(resumable: a run whose metrics.json holds its scores is not trained again). Then writes what they measured into
``posviz/workshop/quick_runs.json`` (the page shows the baselines from it; the weights are not shipped: models/
has no room for them under its 40 MiB) and the table between the markers of docs/workshop.md.

``--seeds 1 2`` trains the baselines again with those training seeds (``--seed``: other initial weights and data
order, the recipe otherwise the same), each into ``runs/quick/<name>-seed<S>``; a baseline's entry lists every seed's
scores under ``seeds`` (its own first), the range the page compares a visitor's formula with.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from posviz.training.train import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "quick"
DATA = ROOT / "posviz" / "workshop" / "quick_runs.json"
DOC = ROOT / "docs" / "workshop.md"
BEGIN, END = "<!-- quick runs: written by python -m posviz_tools.quick_runs -->", "<!-- /quick runs -->"

# name -> the arguments of ``python -m posviz.train`` after --quick: baselines first, then the formulas
RUNS_TO_TRAIN = {
    "alibi": ["--method", "alibi"],
    "rope": ["--method", "rope"],
    "nope": ["--method", "nope"],
    "alibi as a formula": ["--formula", "-(2**(-8*(h+1)/H))*d"],
    "hard cut at 64": ["--formula", "where(d < 64, 0, -inf)"],
    "half the heads ALiBi": ["--formula", "where(h < H/2, -(2**(-16*(h+1)/H))*d, 0)"],
    "Gaussian window": ["--formula", "-(d / w[h])**2 / 2", "--param", "w=16:128", "--floor", "w=1"],
}
BASELINES = ("alibi", "rope", "nope")


def folder_of(name: str, seed: int | None = None) -> Path:
    return RUNS / (name.replace(" ", "-") + ("" if seed is None else f"-seed{seed}"))


def trained(name: str, seed: int | None = None) -> dict | None:
    path = folder_of(name, seed) / "metrics.json"
    if not path.is_file():
        return None
    metrics = json.loads(path.read_text())
    return metrics if "eval" in metrics else None


def train(name: str, seed: int | None = None) -> None:
    args = [sys.executable, "-m", "posviz.train", *RUNS_TO_TRAIN[name], "--quick", "--out", str(folder_of(name, seed)),
            *([] if seed is None else ["--seed", str(seed)])]
    print(" ".join(args[1:]), flush=True)
    subprocess.run(args, cwd=ROOT, check=True)


def record() -> dict:
    """What each run measured: from its folder in runs/quick where it is there, else as quick_runs.json recorded it
    (``--only`` retrains some runs; the others keep their entries)."""
    recorded = json.loads(DATA.read_text()) if DATA.is_file() else {}
    out = {}
    for name in RUNS_TO_TRAIN:
        metrics = trained(name)
        if metrics is None:
            if name in recorded:
                out[name] = recorded[name]
                if name in BASELINES:  # its own seed's scores as recorded, and any seed trained since
                    out[name]["seeds"] = seed_scores(name, TrainConfig.seed, recorded[name]["bits_per_byte"], recorded[name])
            continue
        config = json.loads((folder_of(name) / "config.json").read_text())
        scores = scores_of(metrics)
        out[name] = {"command": "python -m posviz.train " + " ".join(
                         f'"{a}"' if " " in a or "*" in a or "(" in a else a for a in RUNS_TO_TRAIN[name]) + " --quick",
                     "baseline": name in BASELINES, "bits_per_byte": scores,
                     "eval_bytes": metrics["eval"]["eval_bytes"], "steps": metrics["steps"],
                     "tokens": metrics["tokens"], "train_seconds": config["trained_on"]["seconds"],
                     "cpu_threads": config["trained_on"]["cpu_threads"],
                     "position_options": config["model"]["position_options"]}
        if name in BASELINES:
            out[name]["seeds"] = seed_scores(name, config["train"]["seed"], scores, recorded.get(name, {}))
    return out


def scores_of(metrics: dict) -> dict[str, float | None]:
    """{multiple: bits per byte} of a quick run's eval block."""
    return {f"{m:g}": v for m, v in zip(metrics["eval"]["lengths_x_train"].values(),
                                        metrics["eval"]["nonoverlapping_bpb"].values())}


def seed_scores(name: str, own_seed: int, own: dict, recorded: dict) -> list[dict]:
    """[{seed, bits_per_byte}] of a baseline: its own run first, then each other seed trained into runs/quick (or as
    quick_runs.json recorded it), each one's recipe checked to be the quick recipe of the method but for the seed."""
    import dataclasses

    from posviz.training.quick import QUICK_RECIPE
    from posviz.training.train import TrainConfig

    recipe = dataclasses.asdict(TrainConfig(**{**QUICK_RECIPE, "method": name}))
    kept = {e["seed"]: e for e in recorded.get("seeds", []) if e["seed"] != own_seed}
    for folder in sorted(RUNS.glob(folder_of(name).name + "-seed*")):
        metrics = trained(name, int(folder.name.rpartition("-seed")[2]))
        if metrics is None:
            continue
        config = json.loads((folder / "config.json").read_text())["train"]
        differ = sorted(k for k in set(recipe) | set(config) if k not in ("seed", "device") and config.get(k) != recipe.get(k))
        if differ:
            raise SystemExit(f"error: {folder} is not {name}'s quick recipe with another seed: it differs in {differ}")
        kept[config["seed"]] = {"seed": config["seed"], "bits_per_byte": scores_of(metrics)}
    return [{"seed": own_seed, "bits_per_byte": own}] + [kept[s] for s in sorted(kept)]


def table(runs: dict) -> str:
    lines = ["| run | command | 1× | 4× | 16× | 4× / 1× | training | over its training seeds, 1× / 16× |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, run in runs.items():
        bpb = run["bits_per_byte"]
        ratio = bpb["4"] / bpb["1"] if bpb.get("4") and bpb.get("1") else None
        seeds = run.get("seeds") or []
        spread = " / ".join(f"{min(v):.4f}–{max(v):.4f}" for v in
                            ([e["bits_per_byte"][m] for e in seeds] for m in ("1", "16"))) + f" ({len(seeds)} seeds)" \
            if len(seeds) > 1 else "one run"
        lines.append(f"| {name}{' (baseline)' if run['baseline'] else ''} | `{run['command']}` | {bpb['1']:.4f} | "
                     f"{bpb['4']:.4f} | {bpb['16']:.4f} | {ratio:.3f} | {run['train_seconds']:.0f} s | {spread} |")
    return "\n".join(lines)


def write(runs: dict) -> None:
    DATA.write_text(json.dumps(runs, indent=2) + "\n")
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{table(runs)}\n{END}{tail}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="run names (default: all)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[], metavar="S",
                    help="also train the baselines with these training seeds (runs/quick/<name>-seed<S>)")
    ap.add_argument("--write-only", action="store_true", help="only write the JSON and the table from runs/quick")
    args = ap.parse_args(argv)
    if not args.write_only:
        for name in RUNS_TO_TRAIN:
            if (args.only is None or name in args.only) and trained(name) is None:
                train(name)
        for seed in args.seeds:
            for name in BASELINES:  # whatever --only says (``--only --seeds 1 2``: the seeds alone)
                if trained(name, seed) is None:
                    train(name, seed)
    write(record())


if __name__ == "__main__":
    main()
