"""FIRE's set-up candidates side by side: the same bytes, the same seed, a short budget.

    python scripts/fire_candidates.py                      # every candidate, one after the other
    python scripts/fire_candidates.py --only per-layer     # one (run two shells for two cores)
    python scripts/fire_candidates.py --table              # the table of what has finished

Each candidate is the shipped recipe (posviz.training.train.TrainConfig defaults) at ``--tokens`` bytes with
other FIRE options, so only the option differs. Scored as docs/results.md's tables are: bits/byte on the
whole validation split at the training length, the repeat probe's second/first at gap 0, and
bits/byte at 16x over 1x on the same evaluation bytes. Results go to runs/fire-candidates/.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posviz.models.checkpoint_files import load_checkpoint  # noqa: E402
from posviz.training.data import load_corpus  # noqa: E402
from posviz.training.evaluate import DEFAULT_EVAL_BYTES, bits_per_byte  # noqa: E402
from posviz.labs.retrieval import _held_out  # noqa: E402
from posviz.labs.probes import repeat_probe
from posviz.training.train import TrainConfig, train  # noqa: E402

# name -> FIRE options; the first is the paper's reference code as it is
CANDIDATES = {
    "reference": {"threshold_init": 512.0, "mlp_init": "reference"},  # per layer, L = 512, nn.Linear's init
    "quarter-L": {"mlp_init": "reference"},  # L starts at train_length / 4 (the reference's 512 of 2,048)
    "per-layer": {},  # quarter-L and switch points spread over [0, 1]: the defaults
    "shared": {"shared_across_layers": True},  # the defaults, one FIRE for every layer
}
OUT = Path("runs/fire-candidates")


def run(name: str, tokens: int) -> dict:
    cfg = TrainConfig(method="fire", position_options=CANDIDATES[name], tokens=tokens)
    folder = OUT / name
    start = time.perf_counter()
    train(cfg, folder, progress=False)
    seconds = time.perf_counter() - start
    model = load_checkpoint(folder)
    corpus = load_corpus()
    data = corpus.eval_stream(DEFAULT_EVAL_BYTES)
    L = cfg.train_length
    copy = repeat_probe(model, _held_out(corpus.validation), [0], chunks=16, seed=0)[0]
    result = {
        "candidate": name, "options": CANDIDATES[name], "tokens": tokens, "train_seconds": round(seconds),
        "validation_bpb": round(bits_per_byte(model, corpus.validation, L), 4),
        "bpb_1x": round(bits_per_byte(model, data, L), 4),
        "bpb_16x": round(bits_per_byte(model, data, 16 * L), 4),
        "copy_ratio_gap0": copy.ratio,
    }
    result["ratio_16x_1x"] = round(result["bpb_16x"] / result["bpb_1x"], 3)
    (folder / "candidate.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def table() -> str:
    rows = [json.loads(p.read_text()) for p in sorted(OUT.glob("*/candidate.json"))]
    order = list(CANDIDATES)
    rows.sort(key=lambda r: order.index(r["candidate"]) if r["candidate"] in order else len(order))
    lines = ["| candidate | options | validation bits/byte | second/first at gap 0 | 16× / 1× |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "defaults"
        lines.append(f"| {r['candidate']} | {opts} | {r['validation_bpb']:.3f} | {r['copy_ratio_gap0']:.2f} | "
                     f"{r['ratio_16x_1x']:.2f} ({r['bpb_1x']:.3f} → {r['bpb_16x']:.3f}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=list(CANDIDATES), default=None)
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: run two candidates at once on 2 cores)")
    ap.add_argument("--table", action="store_true", help="only print the table of finished candidates")
    args = ap.parse_args()
    if not args.table:
        torch.set_num_threads(args.threads)
        for name in args.only or CANDIDATES:
            print(json.dumps(run(name, args.tokens)), flush=True)
    print(table())


if __name__ == "__main__":
    main()
