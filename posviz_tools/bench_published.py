"""`make bench-published`: what the published-model path costs, into BENCHMARKS.md's published section.

Two rows per model and length, each a ratio timed side by side in one run (``bench_compute.paired_ratio``:
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
import time
from pathlib import Path

import torch

from .bench_compute import paired_ratio
from .bench_report import machine

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
    from posviz.models.interface import open_model

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


# The README's default list for a Space, with the shapes of their config.json files (checked against copies
# of each on the hub's pages): built here with random weights, which cost what the real ones do.
DEFAULT_LIST = {
    "openai-community/gpt2": ("gpt2", dict(n_positions=1024, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)),
    "facebook/opt-125m": ("opt", dict(max_position_embeddings=2048, hidden_size=768, num_hidden_layers=12,
                                      num_attention_heads=12, ffn_dim=3072, vocab_size=50272, word_embed_proj_dim=768)),
    "EleutherAI/pythia-160m": ("gpt_neox", dict(max_position_embeddings=2048, hidden_size=768, num_hidden_layers=12,
                                                num_attention_heads=12, intermediate_size=3072, vocab_size=50304,
                                                rotary_pct=0.25, use_parallel_residual=True)),
    "HuggingFaceTB/SmolLM2-135M": ("llama", dict(max_position_embeddings=8192, hidden_size=576, num_hidden_layers=30,
                                                 num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                                                 vocab_size=49152, tie_word_embeddings=True,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    "Qwen/Qwen2.5-0.5B": ("qwen2", dict(max_position_embeddings=32768, hidden_size=896, num_hidden_layers=24,
                                        num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                                        vocab_size=151936, tie_word_embeddings=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "bigscience/bloom-560m": ("bloom", dict(hidden_size=1024, n_layer=24, n_head=16, vocab_size=250880, seq_length=2048)),
    "tiiuae/falcon-rw-1b": ("falcon", dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, alibi=True,
                                           new_decoder_architecture=False, parallel_attn=False, bias=True,
                                           multi_query=False, vocab_size=50304, max_position_embeddings=2048)),
}


@torch.inference_mode()
def measure_default_list(only: list[str] | None = None) -> list[dict]:
    """Per model of the default list, built with random weights from its published shape: parameters, fp32
    weights, its CPU length cap and why, and the seconds of one forward pass at its context (capped there)."""
    import resource

    from transformers import AutoConfig, AutoModelForCausalLM

    from posviz.models.hf.settings import CPU_FLOP_BUDGET, tokens_within
    from posviz.models.hf.families import FAMILIES, UNSTATED_CONTEXT
    from posviz.limits import MAX_LENGTH_MULTIPLE_CPU

    rows = []
    for ref, (model_type, shape) in DEFAULT_LIST.items():
        if only and ref not in only:
            continue
        config = AutoConfig.for_model(model_type, **shape)
        net = AutoModelForCausalLM.from_config(config).eval()
        n_params = sum(p.numel() for p in net.parameters())
        family = FAMILIES[model_type]
        context = family.context(config) or UNSTATED_CONTEXT
        layers, hidden = config.num_hidden_layers, config.hidden_size
        cap = max(min(MAX_LENGTH_MULTIPLE_CPU * context, tokens_within(CPU_FLOP_BUDGET, n_params, layers, hidden)),
                  min(context, 64))
        length = min(context, cap)
        x = torch.randint(0, config.vocab_size, (1, length))
        net(input_ids=x[:, :16])
        start = time.perf_counter()
        net(input_ids=x)
        seconds = time.perf_counter() - start
        rows.append({"model": ref, "method": family.method(config), "context": context, "params": n_params,
                     "weights_gb": 4 * n_params / 1e9, "cap": cap, "length": length, "forward_s": seconds,
                     "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6})
        print(f"  {ref:>28}: {n_params / 1e6:.0f} M, forward at {length:,} tokens {seconds:.1f} s", flush=True)
        del net
    return rows


def default_list_section(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    return ["", "### The README's default list on this CPU (random weights with each model's published shape)", "",
            "One forward pass at the model's trained context (or its CPU length cap, if lower) with transformers' "
            "default attention, fp32: what the Extrapolation lab's default view costs per model, and what a cached "
            "lab pays per window. Peak RSS is the process's, growing as models are built one after another.", "",
            "| model | method | context | parameters | fp32 weights | CPU length cap | forward at context |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
            *(f"| {r['model']} | {r['method']} | {r['context']:,} | {r['params'] / 1e6:.0f} M | {r['weights_gb']:.2f} GB | "
              f"{r['cap']:,} | {r['forward_s']:.1f} s at {r['length']:,} |" for r in rows)]


def section(rows: list[dict], info: dict, default_rows: list[dict] | None = None) -> str:
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
    return "\n".join(lines + default_list_section(default_rows or []) + ["", END])


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
    parser.add_argument("--default-list", action="store_true",
                        help="also time the README's default list, built with random weights from their published shapes")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    info = machine()
    rows = []
    for label, folder in candidate_models(not args.no_tiny).items():
        rows += measure(label, folder, args.min_time)
    text = section(rows, info, measure_default_list() if args.default_list else None)
    write_section(Path(args.out), text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
