"""`make bench-published`: what the published-model path costs, into BENCHMARKS.md's published section.

Two rows per model and length, each a ratio timed side by side in one run (``bench.paired_ratio``:
back-to-back pairs, so the drifts of a shared machine cancel):

* **posviz over bare transformers**: ``open_model(folder)(ids)`` (what every lab calls) against the same
  transformers model called directly, ``net(input_ids=ids)``, on the same ids. Goal <= 1.10x.
* **an attention map**: the same call with ``attention_layer`` (eager attention for that pass, one layer's
  probabilities kept) against the plain call, the cost a visitor pays for a map.

The models: the exports of the shipped checkpoints (models/hf/, trained weights) and the tiny random
families of the tests (tests/hf_tiny.py), at 1, 4 and 16 x each model's trained context where it runs.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import torch

from .bench import machine, paired_ratio

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.10
MULTIPLES = (1, 4, 16)
BEGIN, END = "<!-- published-models: begin -->", "<!-- published-models: end -->"


def candidate_models(tiny: bool = True) -> dict[str, Path]:
    """{label: folder}: the exports in models/hf, and the tiny families saved to a temporary folder."""
    found = {f"{p.name} (export)": p for p in sorted((ROOT / "models" / "hf").glob("*")) if (p / "config.json").is_file()}
    if tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        import hf_tiny

        root = Path(tempfile.mkdtemp(prefix="posviz-bench-tiny-"))
        for name in ("gpt2", "neox", "llama3", "bloom", "mpt"):
            found[f"{name} (tiny)"] = hf_tiny.save_family(name, root / name)
    return found


@torch.inference_mode()
def measure(label: str, folder: Path, min_time: float) -> list[dict]:
    from posviz.lab_model import open_model

    model = open_model(folder, device="cpu")
    net = model.net
    rows = []
    text = (ROOT / "posviz" / "model.py").read_bytes() * 8
    ids = model.encode(text)
    for multiple in MULTIPLES:
        length = multiple * model.train_length
        row = {"model": label, "family": model.family_name, "method": model.method, "context": model.train_length,
               "length": length, "multiple": multiple}
        why = model.cannot_run(length) or (None if length <= min(model.length_cap, ids.numel()) else "past the length cap or the text")
        if why:
            rows.append({**row, "skipped": why})
            continue
        x = ids[None, :length]
        try:
            model._check_work(length, length, attention_map=False)
        except Exception as exc:  # refused in words (memory): what a visitor would read
            rows.append({**row, "skipped": str(exc)})
            continue
        row["over_bare"] = paired_ratio(lambda: model(x), lambda: net(input_ids=x), min_time)
        try:
            row["map_over_plain"] = paired_ratio(lambda: model(x, attention_layer=model.n_layer - 1), lambda: model(x),
                                                 min_time)
        except Exception as exc:  # a map over the memory estimate is refused in words: report it
            row["map_problem"] = str(exc)
        print(f"  {label:>24} {length:>6}: {row['over_bare']:.3f}x bare"
              + (f", map {row['map_over_plain']:.2f}x" if "map_over_plain" in row else ""), flush=True)
        rows.append(row)
    return rows


def section(rows: list[dict], info: dict) -> str:
    measured = [r for r in rows if "over_bare" in r]
    worst = max(measured, key=lambda r: r["over_bare"]) if measured else None
    lines = [BEGIN, "", "## Published models: posviz over a bare transformers forward, and the cost of a map", "",
             "`python -m posviz_tools.bench_published` on " + ", ".join(f"{k} {v}" for k, v in info.items()) + ". "
             "Each ratio is the median of back-to-back pairs in one run. *posviz / bare*: `open_model(folder)(ids)`, "
             "what every lab calls, against the same transformers model called directly on the same ids. *Map / "
             "plain*: the call with one layer's attention probabilities (eager attention for that pass) against the "
             "plain call. Exports: the shipped checkpoints in transformers' architectures (trained weights, "
             "context 256); tiny: the test suite's random families (context 64).", ""]
    if worst is not None:
        ok = worst["over_bare"] <= GOAL
        lines += ["| goal | measured | verdict |", "| --- | --- | --- |",
                  f"| posviz <= {GOAL:.2f}x a bare transformers forward, every model and length | worst: "
                  f"{worst['model']} at {worst['length']:,} tokens, {worst['over_bare']:.3f}x | {'MET' if ok else 'MISSED'} |", ""]
    lines += ["| model | method | length (x context) | posviz / bare | map / plain |", "| --- | --- | --- | ---: | ---: |"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['method']} | {r['length']:,} ({r['multiple']}x) | cannot run: {r['skipped']} | |")
        else:
            lines.append(f"| {r['model']} | {r['method']} | {r['length']:,} ({r['multiple']}x) | {r['over_bare']:.3f}x | "
                         + (f"{r['map_over_plain']:.2f}x" if "map_over_plain" in r else r.get("map_problem", "")) + " |")
    return "\n".join(lines + ["", END])


def write_section(path: Path, text: str) -> None:
    old = path.read_text() if path.is_file() else ""
    if BEGIN in old and END in old:
        new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda m: text, old, flags=re.S)
    else:
        new = old.rstrip() + "\n\n" + text + "\n"
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="posviz's published-model path against a bare transformers forward")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds spent timing each ratio")
    parser.add_argument("--no-tiny", action="store_true", help="only the exports in models/hf")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    info = machine()
    rows = []
    for label, folder in candidate_models(not args.no_tiny).items():
        rows += measure(label, folder, args.min_time)
    text = section(rows, info)
    write_section(Path(args.out), text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
