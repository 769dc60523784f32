"""Every live lab on this machine's device, timed and read back, for ``scripts/gpu_check.sh`` (issue #36).

    python -m posviz_tools.bench_device --out DIR            # on the default device (CUDA where present)
    CUDA_VISIBLE_DEVICES= python -m posviz_tools.bench_device --out DIR --tag cpu   # the same on the CPU

Two measurements, each written to ``DIR/<tag>.json`` (and a Markdown table to ``DIR/<tag>.md``):

* **every lab's default view**: the page script run as the app runs it (Streamlit's ``AppTest``), on a fresh
  result store, so every number is computed, not read back; its wall time and what it shows (the
  default-view fingerprint of ``tests/default_views.py``: charts, tables, metrics, generated text). Once on
  the shipped checkpoints, once opened by a link on the exports in ``models/hf`` (transformers' forward). Two
  runs of this tool, on the GPU and on the CPU of the same machine, show the same numbers where the device
  changes nothing, and ``compare`` says where they differ;
* **the Extrapolation lab at 1x, 4x and 16x** the trained context, for every shipped checkpoint and every
  export, in the dtype the app picks on this device: the first call (kernels chosen, memory allocated) and
  the median of three more.

Run by the GPU check on a GPU machine; it runs anywhere (the CPU rows of BENCHMARKS.md's GPU section come
from the same machine, in the same script).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MULTIPLES = (1, 4, 16)


def _synchronise() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_pages() -> dict:
    """{"pages"|"exports": {page: {"seconds", "fingerprint"}}}: each lab's default view, computed afresh."""
    sys.path.insert(0, str(ROOT / "tests"))  # the default-view fingerprint is the tests' reading of a page
    import default_views

    out: dict = {"pages": {}, "exports": {}}
    for group, read in (("pages", default_views.fingerprint), ("exports", default_views.export_fingerprint)):
        for page in default_views.LABS:
            os.environ["POSVIZ_STORE"] = tempfile.mkdtemp(prefix=f"posviz-bench-{page}-")  # nothing read back
            start = time.perf_counter()
            try:
                shown, error = read(page), None
            except Exception as exc:  # noqa: BLE001 (a page that fails is a row saying how, not the end of the run)
                shown, error = None, f"{type(exc).__name__}: {exc}"[:2000]
            out[group][page] = {"seconds": time.perf_counter() - start, "fingerprint": shown, "error": error}
            print(f"{group:8s} {page:18s} {out[group][page]['seconds']:7.2f} s  {error or ''}", flush=True)
    return out


def time_extrapolation() -> list[dict]:
    """One row per model and multiple: the Extrapolation lab's score at that length, first call and warm."""
    from posviz.errors import PosvizError
    from posviz.labs import extrapolation
    from posviz.models.checkpoint_files import shipped_checkpoints
    from posviz.models.interface import open_model
    from posviz.training.data import load_corpus

    text = load_corpus().eval_documents[0]
    refs = {name: str(folder) for name, folder in shipped_checkpoints().items()}
    refs.update({f"hf/{p.name}": str(p) for p in sorted((ROOT / "models" / "hf").iterdir()) if (p / "config.json").is_file()})
    rows = []
    for name, ref in refs.items():
        model = open_model(ref)
        ids = model.tokenize(text).ids
        for multiple in MULTIPLES:
            length = extrapolation.length_at_multiple(model, multiple)
            row = {"model": name, "multiple": multiple, "length": length, "device": str(model.device),
                   "dtype": str(model.dtype).removeprefix("torch."), "n_ids": int(ids.numel())}
            try:
                _synchronise()
                start = time.perf_counter()
                score = extrapolation.score_at_length(model, ids, length)
                row["first_s"] = time.perf_counter() - start
                warm = []
                for _ in range(3):
                    start = time.perf_counter()
                    extrapolation.score_at_length(model, ids, length)
                    warm.append(time.perf_counter() - start)
                row.update(warm_s=statistics.median(warm), bpb=float(score.bpb), scored_ids=int(score.n_ids))
            except PosvizError as exc:  # past a learned table, past the device's cap: said, not timed
                row["refused"] = str(exc).split(".")[0]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def use_the_gpu_caps() -> None:
    """On a CPU, the caps a GPU has (lengths, new bytes, a published model's work per call): a CPU run then
    does the very work a GPU run does, so the two show the same numbers where the device changes nothing."""
    import posviz.labs.generation as generation
    import posviz.limits as limits
    import posviz.models.hf.model as hf_model
    from posviz.models.hf import settings

    for module in (limits, hf_model):
        module.MAX_LENGTH_MULTIPLE_CPU = limits.MAX_LENGTH_MULTIPLE_GPU
    for module in (limits, generation):
        module.MAX_GENERATE_MULTIPLE_CPU = limits.MAX_GENERATE_MULTIPLE_GPU
    os.environ["POSVIZ_CPU_FLOP_BUDGET"] = str(settings.flop_budget("cuda"))


def markdown(result: dict) -> str:
    lines = [f"device: {result['device']}, torch {result['torch']}", "",
             "| page | shipped checkpoints (s) | exports in models/hf (s) |", "| --- | ---: | ---: |"]
    for page, row in result["pages"]["pages"].items():
        exported = result["pages"]["exports"][page]
        cell = lambda r: "failed" if r["error"] else f"{r['seconds']:.2f}"  # noqa: E731
        lines.append(f"| {page} | {cell(row)} | {cell(exported)} |")
    lines += ["", "| model | x | length | dtype | first call (s) | warm (s) | bits per byte |",
              "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in result["extrapolation"]:
        if "refused" in r:
            lines.append(f"| {r['model']} | {r['multiple']} | {r['length']:,} | {r['dtype']} | refused: {r['refused']} | | |")
        else:
            lines.append(f"| {r['model']} | {r['multiple']} | {r['length']:,} | {r['dtype']} | {r['first_s']:.3f} "
                         f"| {r['warm_s']:.4f} | {r['bpb']:.4f} |")
    return "\n".join(lines) + "\n"


DEVICE_NAMED = ("Cap on this device", "Caps on this device", "Computed now on", "device cap of")


def shown_differences(a: dict, b: dict) -> list[str]:
    """Where two runs' pages show different numbers (1e-4), leaving out the captions that name the device."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_default_views

    test_default_views.TOLERANCE = 1e-4
    out = []
    for group in ("pages", "exports"):
        for page, row in a["pages"][group].items():
            other = b["pages"][group][page]
            if row["error"] or other["error"]:
                out.append(f"{group}/{page}: failed ({row['error'] or other['error']})")
                continue
            out += [f"{group}/{page}{d}" for d in test_default_views.differences(row["fingerprint"], other["fingerprint"])
                    if not any(s in d for s in DEVICE_NAMED)]
    return out


def report(folder: Path) -> str:
    """BENCHMARKS.md's GPU section from one run of scripts/gpu_check.sh (cuda.json, cpu.json, cpu-gpu-caps.json)."""
    gpu, cpu = (json.loads((folder / f"{t}.json").read_text()) for t in ("cuda", "cpu"))
    same = folder / "cpu-gpu-caps.json"
    differences = shown_differences(gpu, json.loads(same.read_text())) if same.is_file() else None
    log = (folder / "log").read_text() if (folder / "log").is_file() else ""
    passed = re.findall(r"=+ (\d+ passed.*? in [\d.]+s) =+", log)
    lines = [f"## On a GPU: {gpu['device'].removeprefix('CUDA (').rstrip(')')}", "",
             f"`scripts/gpu_check.sh` on {time.strftime('%Y-%m-%d')}. GPU: {gpu['device']}, torch {gpu['torch']}, "
             f"Python {gpu['python']}; CPU: the same machine's {cpu['device']}. "
             f"`make gpu-check` (the tests marked `cuda`): {passed[-1] if passed else 'not in this run'}.", "",
             "Each lab's default view, run as the app runs it (AppTest) on an empty result store, in one process "
             "per device (the first page also loads the checkpoints). The GPU's caps are larger (32 x the trained "
             "context, not 16), so it scores more of the text at the same link.", "",
             "| page | GPU, checkpoints (s) | CPU, checkpoints (s) | GPU, exports (s) | CPU, exports (s) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    cell = lambda r: "failed" if r["error"] else f"{r['seconds']:.2f}"  # noqa: E731
    for page in gpu["pages"]["pages"]:
        lines.append(f"| {page} | {cell(gpu['pages']['pages'][page])} | {cell(cpu['pages']['pages'][page])} "
                     f"| {cell(gpu['pages']['exports'][page])} | {cell(cpu['pages']['exports'][page])} |")
    if differences is not None:
        lines += ["", f"What the pages show on the GPU against the same pages on the CPU with the GPU's caps "
                  f"(`--gpu-caps`: the very same work): {len(differences)} differences beyond 1e-4 outside the "
                  "captions that name the device" + (": " + "; ".join(differences[:6]) if differences else "") + ". "
                  "(A coloured text's markup holds its colours, which a loss on a colour's rounding boundary can flip "
                  "from one shade to the next; its tooltips, the numbers, are compared to their shown 0.01.)"]
    lines += ["", "The Extrapolation lab's score at 1, 4 and 16 x the trained context (warm: median of 3 after a first "
              "call). Each device scores up to its own cap, so the speed is compared in ids scored per second.", "",
              "| model | x | length | GPU ms | GPU ids | CPU ms | CPU ids | GPU / CPU ids per s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    cpu_rows = {(r["model"], r["multiple"]): r for r in cpu["extrapolation"]}
    for r in gpu["extrapolation"]:
        c = cpu_rows.get((r["model"], r["multiple"]), {})
        if "warm_s" not in r or "warm_s" not in c:
            lines.append(f"| {r['model']} | {r['multiple']} | {r['length']:,} | refused (past its table) | | | | |")
            continue
        ratio = (r["scored_ids"] / r["warm_s"]) / (c["scored_ids"] / c["warm_s"])
        lines.append(f"| {r['model']} | {r['multiple']} | {r['length']:,} | {1e3 * r['warm_s']:.1f} | {r['scored_ids']:,} "
                     f"| {1e3 * c['warm_s']:.1f} | {c['scored_ids']:,} | {ratio:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for <tag>.json and <tag>.md")
    parser.add_argument("--tag", default=None, help="file name (default: cuda or cpu, whichever runs)")
    parser.add_argument("--skip-pages", action="store_true", help="only the Extrapolation timings")
    parser.add_argument("--skip-extrapolation", action="store_true", help="only the pages")
    parser.add_argument("--gpu-caps", action="store_true",
                        help="on a CPU, a GPU's caps: the work a GPU run does, for comparing what the pages show")
    parser.add_argument("--report", action="store_true", help="write BENCHMARKS.md's GPU section from --out's files")
    args = parser.parse_args(argv)
    if args.report:
        from posviz_tools.bench_report import write_marked

        write_marked(ROOT / "BENCHMARKS.md", "gpu", report(args.out))
        print(report(args.out), end="")
        return 0

    import torch

    from posviz.limits import default_device, device_label

    tag = args.tag or default_device().type
    result = {"device": device_label(), "torch": torch.__version__, "python": sys.version.split()[0],
              "threads": torch.get_num_threads()}
    if args.gpu_caps:
        use_the_gpu_caps()
    result["gpu_caps"] = args.gpu_caps
    result["extrapolation"] = [] if args.skip_extrapolation else time_extrapolation()
    result["pages"] = {"pages": {}, "exports": {}} if args.skip_pages else time_pages()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{tag}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out / f"{tag}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
