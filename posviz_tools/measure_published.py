"""Measure a published model past its context, plain, under a RoPE scaling and under each remap, and store it.

    python -m posviz_tools.measure_published --model path/to/SmolLM2-135M-Instruct.Q4_1.gguf --multiples 1 2

writes ``results/published/<name>.json`` (the model's file or folder name, or its hub id with ``/`` as ``--``):

* ``eval.nonoverlapping_bpb``: bits per byte on the first ``--ids`` ids of the shipped checkpoints' evaluation text
  (the held-out standard library, ``Corpus.eval_stream``), in non-overlapping windows of each multiple of the
  model's trained context, as ``python -m posviz.evaluate`` scores a checkpoint;
* ``eval.rope_scalings.<scaling>``: the same under ``--scaling`` (YaRN) at the factor of each length;
* ``eval.rope_remaps.<remap>``: the same under each remap, its defaults covering each length (``remap_options``);
* ``eval.effective_length.<as_trained|remap>``: the planted-pair probe and rule of the checkpoints
  (``labs.key_value.effective_length_block``) at the multiples given, with ``--trials`` trials per depth;
* ``seconds``: the wall time of every entry, with the machine's threads, so a reader knows what a number costs.

Each entry is written as soon as it is measured; a run that stops is started again with the same command and
skips what the file holds (``--again`` measures it anew). The scoreboard lists a published model of
``$POSVIZ_MODELS`` with what its file holds, and ``posviz_tools.published_table`` writes docs/published_models.md's
table from it.

A published model's length cap on a CPU holds one forward pass to ``$POSVIZ_CPU_FLOP_BUDGET`` (SmolLM2-135M:
4,652 tokens, under its 8,192-token context); ``--flop-budget`` raises it for this run only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from posviz.labs.published_results import read_results, result_file

def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    part.write_text(json.dumps(record, indent=1) + "\n")
    part.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a GGUF file, a folder or a hub id")
    ap.add_argument("--multiples", type=float, nargs="+", default=[1, 2], help="lengths, in trained contexts")
    ap.add_argument("--ids", type=int, default=None,
                    help="ids of the evaluation text scored (default: the longest length + 1: one window there)")
    ap.add_argument("--scaling", default="yarn", help="a frequency scaling at each length's factor ('' for none)")
    ap.add_argument("--remaps", nargs="*", default=None, help="remaps to measure (default: all the model takes)")
    ap.add_argument("--effective", nargs="*", default=["as_trained", "self_extend"],
                    help="variants whose effective length is measured (as_trained, or a remap)")
    ap.add_argument("--trials", type=int, default=1, help="effective length: planted pairs per depth and length")
    ap.add_argument("--flop-budget", type=float, default=None, help="POSVIZ_CPU_FLOP_BUDGET for this run")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--again", action="store_true", help="measure every entry anew")
    args = ap.parse_args(argv)
    args.multiples = [int(m) if float(m).is_integer() else m for m in args.multiples]  # "1", not "1.0", as stored keys
    if args.flop_budget:
        os.environ["POSVIZ_CPU_FLOP_BUDGET"] = repr(args.flop_budget)
    if args.threads:
        torch.set_num_threads(args.threads)

    from posviz.labs.key_value import effective_length_block
    from posviz.models.interface import open_model
    from posviz.training.data import load_corpus
    from posviz.training.evaluate import published_eval_table

    model = open_model(args.model, None, "cpu")
    model.load()
    L = model.train_length
    lengths = [int(round(m * L)) for m in args.multiples]
    corpus = load_corpus()
    n_ids = args.ids or max(lengths) + 1
    ids = model.encode(corpus.eval_stream(min(len(corpus.validation), 8 * n_ids)).tobytes())[:n_ids]
    path = result_file(args.model)
    record = {} if args.again else read_results(args.model)
    record.update({"model": Path(args.model).name if Path(args.model).exists() else args.model, "unit": model.unit,
                   "train_length": L, "method": model.method, "eval_ids": int(ids.numel()),
                   "eval_bytes": int(model.bytes_per_id(ids).sum()), "threads": torch.get_num_threads(),
                   "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"})
    ev = record.setdefault("eval", {})
    seconds = record.setdefault("seconds", {})
    command = "python -m posviz_tools.measure_published " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    record["command"] = command

    def measured(key: str, compute):
        group, _, name = key.partition(".")
        place = ev.setdefault(group, {}) if name else ev
        slot = name or group
        if slot in place and not args.again:
            return
        start = time.time()
        place[slot] = compute()
        seconds[key] = round(time.time() - start, 1)
        _write(path, record)
        print(f"{key}: {json.dumps(place[slot])[:200]} ({seconds[key]:.0f} s)", flush=True)

    def per_length(overrides_at):
        table, options = {}, {}
        for n in lengths:
            variant = model.with_position_options(overrides_at(n / L))
            table[str(n)] = published_eval_table(variant, ids, [n], progress=False)[str(n)]
            if "remap_options" in variant.position_options:
                options[str(n)] = variant.position_options["remap_options"]
        return {"nonoverlapping_bpb": table, **({"remap_options": options} if options else {})}

    measured("nonoverlapping_bpb", lambda: published_eval_table(model, ids, lengths, progress=False))
    if args.scaling:
        measured(f"rope_scalings.{args.scaling}",
                 lambda: {**per_length(lambda f: {"scaling": args.scaling, "factor": max(1.0, f)}),
                          "factor": "each length's multiple"})
    for remap in (model.remaps if args.remaps is None else args.remaps):
        measured(f"rope_remaps.{remap}", lambda remap=remap: per_length(
            lambda f: {"remap": remap, "factor": max(1.0, f)}))
    text = corpus.validation
    for variant in args.effective:
        target = model if variant == "as_trained" else model.with_position_options(
            {"remap": variant, "factor": float(max(args.multiples))})
        measured(f"effective_length.{variant}",
                 lambda target=target: effective_length_block(target, text, multiples=args.multiples, trials=args.trials))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
