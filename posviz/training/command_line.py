"""Command line: ``python -m posviz.train --method rope [--set tokens=N] [--out models/rope]``, or a formula:
``python -m posviz.train --formula "-(2**(-8*(h+1)/H))*d" [--param a=1.0] [--floor a=0.01] [--quick] [--out DIR]``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch

from posviz.config import strict_from_dict
from posviz.errors import PosvizError
from posviz.models.checkpoint_files import write_metrics
from posviz.training.quick import QUICK_RECIPE, QUICK_RECIPE_WHY, check_scored_lengths, quick_eval
from posviz.training.train import TrainConfig, initial_model, train


def parse_pairs(items: list[str]) -> dict:
    """KEY=VALUE strings to a dict; values are JSON where they parse (numbers, true, null), else text."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def formula_options(formula: str, params: list[str], floors: list[str]) -> dict:
    """The formula method's options from the command line: --param a=1.0 (or a range a=0:2), --floor a=0.01."""
    specs: dict = {}
    for item in params:
        name, sep, raw = item.partition("=")
        low, colon, high = raw.partition(":")
        try:
            specs[name.strip()] = {"init": [float(low), float(high)] if colon else float(raw)}
        except ValueError:
            raise SystemExit(f"error: --param {item!r}: expected NAME=NUMBER or NAME=LOW:HIGH") from None
        if not sep:
            raise SystemExit(f"error: --param {item!r}: expected NAME=NUMBER or NAME=LOW:HIGH")
    for item in floors:
        name, sep, raw = item.partition("=")
        try:
            specs.setdefault(name.strip(), {})["floor"] = float(raw)
        except ValueError:
            raise SystemExit(f"error: --floor {item!r}: expected NAME=NUMBER") from None
    return {"formula": formula, "parameters": specs}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Train one posviz checkpoint with the shared recipe.")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--method", help="position method name, e.g. rope, alibi, t5")
    what.add_argument("--formula", help='a logit bias written as a formula, e.g. "-(2**(-8*(h+1)/H))*d" (the Workshop\'s '
                                       "language: posviz/positions/formula_language.py)")
    ap.add_argument("--param", nargs="*", default=[], action="extend", metavar="NAME=INIT",
                    help="a learned parameter's initial value, a number or a uniform range LOW:HIGH, e.g. a=1.0 b=0:2")
    ap.add_argument("--floor", nargs="*", default=[], action="extend", metavar="NAME=MIN", help="a learned parameter's floor, e.g. a=0.01")
    ap.add_argument("--quick", action="store_true", help=f"the Workshop's short recipe: {QUICK_RECIPE_WHY}")
    ap.add_argument("--out", default=None,
                    help="output folder (default models/<method>; a formula or --quick run: runs/<name>, never models/)")
    ap.add_argument("--set", nargs="*", default=[], action="extend", metavar="KEY=VALUE",
                    help="override a recipe field, e.g. tokens=100000 n_embd=64 (unknown keys are an error)")
    ap.add_argument("--option", nargs="*", default=[], action="extend", metavar="KEY=VALUE", help="position method option")
    ap.add_argument("--seed", type=int, default=None, metavar="S",
                    help="another training seed (the initial weights and the data order together; the recipe otherwise "
                         "the shipped one): trained into runs/seeds/<method>-seed<S>, never models/; record its scores "
                         "beside the checkpoint with python -m posviz.training.seeds")
    ap.add_argument("--resume", action="store_true",
                    help="continue from the state a stopped run left in runs/<out name>.state (saved every checkpoint_every steps)")
    args = ap.parse_args(_formula_joined(sys.argv[1:] if argv is None else list(argv)))
    if (args.param or args.floor) and not args.formula:
        raise SystemExit("error: --param and --floor set a formula's learned parameters; give --formula")
    values = {**(QUICK_RECIPE if args.quick else {}), "method": args.method or "formula", **parse_pairs(args.set)}
    if args.seed is not None:
        if "seed" in values:
            raise SystemExit("error: give the seed once: --seed S or --set seed=S")
        values["seed"] = args.seed
    values["position_options"] = (formula_options(args.formula, args.param, args.floor) if args.formula
                                  else parse_pairs(args.option))
    out, made = None, False
    try:
        cfg = strict_from_dict(TrainConfig, values, "training recipe")
        # unknown method, bad shape, option or formula: said before loading any data; and a run scored past its
        # context is checked at every length it is scored at, before any step, on the run's own initial draw
        scored = args.quick or args.formula
        with torch.random.fork_rng():
            net = initial_model(cfg)
        if scored:
            check_scored_lengths(net.position, cfg)
        out = args.out or default_out(cfg, args.quick, seeded=args.seed is not None)
        made = not Path(out).exists()
        metrics = train(cfg, out, resume=args.resume)
        if scored and "stopped_at_step" not in metrics:
            metrics["eval"] = quick_eval(out, cfg)
            write_metrics(out, metrics)
            scores = ", ".join(f"{m:g}x {v:.4f}" if v is not None else f"{m:g}x -" for m, v in
                               zip(metrics["eval"]["lengths_x_train"].values(), metrics["eval"]["nonoverlapping_bpb"].values()))
            print(f"bits per byte on {metrics['eval']['eval_bytes']:,} validation bytes: {scores}")
    except PosvizError as exc:  # one line for the person at the terminal, not a traceback, and no half-made folder
        if made and out is not None:
            shutil.rmtree(out, ignore_errors=True)
        raise SystemExit("error: " + " ".join(str(exc).split())) from None


def _formula_joined(argv: list[str]) -> list[str]:
    """``--formula -a*d`` as ``--formula=-a*d``: argparse would take a formula that starts with a minus for an option."""
    out, k = [], 0
    while k < len(argv):
        if argv[k] == "--formula" and k + 1 < len(argv):
            out.append(f"--formula={argv[k + 1]}")
            k += 2
        else:
            out.append(argv[k])
            k += 1
    return out


def default_out(cfg: TrainConfig, quick: bool, seeded: bool = False) -> str:
    """models/<method> for the shipped recipe; a formula, a quick run or another seed never writes into models/:
    runs/<name> (a seed keeps its scores beside the checkpoint, not its weights: models/ has no room for them)."""
    if seeded and cfg.method != "formula":
        return f"runs/seeds/{cfg.method}{'-quick' if quick else ''}-seed{cfg.seed}"
    if cfg.method != "formula" and not quick:
        return f"models/{cfg.method}"
    if cfg.method == "formula":
        digest = hashlib.sha1(json.dumps(cfg.position_options, sort_keys=True).encode()).hexdigest()[:8]
        return f"runs/formula-{digest}{'-quick' if quick else ''}{f'-seed{cfg.seed}' if seeded else ''}"
    return f"runs/quick/{cfg.method}"


if __name__ == "__main__":
    main()
