"""What a Workshop formula costs, whatever its shape (issue #55): ``python -m posviz_tools.bench_formula [--write]``.

For each formula, in a process of its own (so that its peak memory is its own), on the shipped shape (4 layers,
4 heads, a 256-byte context) with one torch thread:
- the check a run does before training (``check_up_to`` every position below 4,096, 16x the context), and
- one eval forward pass of 4,096 bytes (the check already done, as the labs' second pass is),
their seconds (median of 3), and the process's peak memory above what it held before the first check. The plain
formulas first, then the worst ones under the caps on a formula's parts and depth (``posviz.limits``): every
operation on values of every pair and head, pow and transcendental functions, the deepest nesting, and a formula of
the pairs that differs by layer (walked once per layer, so capped at 64 / 4 = 16 parts). ``--write`` puts the table
in BENCHMARKS.md between its markers.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LENGTH = 4096  # 16x the shipped context: the longest a quick run is scored at, and the CPU labs' cap

PLAIN = {
    "ALiBi as a formula (d alone: checked per distance)": "-(2**(-8*(h+1)/H))*d",
    "a plain formula of i and j": "-0.01 * d * (1 + i / L)",
}
WORST = {
    "pow and sums of every pair and head":
        "-((((j*h+1)**0.5+(j*h+1)**0.5)+((j*h+1)**0.5+(j*h+1)**0.5))+(((j*h+1)**0.5+(j*h+1)**0.5)+((j*h+1)**0.5+"
        "(j*h+1)**0.5)))",
    "a pow of two pair values in every term":
        "-(((j+1)**(0.1*h)+(i+1)**(0.1*h))+((j+2)**(0.1*h)+(i+2)**(0.1*h))+((j+3)**(0.1*h)+(i+3)**(0.1*h)))*0.001",
    "nested 16 deep (log1p, abs, products)": "log1p(abs(log1p(abs(log1p(abs(j*h)*j*h))*j*h))*j*h)",
    "where, nested, three operands each": "where(j*h > i, where(j*h > i, where(j*h > i, where(j*h > i, i*h, j*h-i), "
                                          "j*h-i), j*h-i), j*h-i)",
    "of the pairs and the layer (walked in each of the 4 layers)": "-abs(j * h - i) * 0.001 * (layer + 1)",
    "a chain of 62 comparisons (the red team's)": "<".join(["h", "d"] * 31) + "<i",
}

CHILD = r"""
import json, resource, statistics, sys, time, torch
torch.set_num_threads(1)
from posviz.config import ModelConfig
from posviz.models.byte_gpt import GPT
formula, n = sys.argv[1], int(sys.argv[2])
ids = torch.zeros(1, n, dtype=torch.long)
torch.manual_seed(0)
with torch.no_grad():
    GPT(ModelConfig(position="formula", position_options={"formula": "-d"})).eval()(ids[:, :64])  # warm the kernels
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
checks, forwards = [], []
for _ in range(3):
    net = GPT(ModelConfig(position="formula", position_options={"formula": formula})).eval()
    start = time.perf_counter()
    net.position.check_up_to(n)
    checks.append(time.perf_counter() - start)
check_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.no_grad():
    for _ in range(3):
        start = time.perf_counter()
        net(ids)
        forwards.append(time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"check_s": statistics.median(checks), "forward_s": statistics.median(forwards),
                  "check_mb": (check_peak - base) / 1024, "peak_mb": (peak - base) / 1024,
                  "parts": net.position.formula.size}))
"""


def measure(formula: str, length: int = LENGTH) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, formula, str(length)], cwd=ROOT, capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: dict, length: int = LENGTH) -> str:
    plain = rows[next(iter(PLAIN.values()))]
    pairs = rows[list(PLAIN.values())[1]]
    lines = [f"## A Workshop formula's cost at {length:,} bytes (16x the context), by shape", "",
             "`python -m posviz_tools.bench_formula --write`: the shipped shape, one torch thread, each formula in a "
             "process of its own. Check: every position below 4,096, as a run does before training. Forward: one eval "
             "pass of 4,096 bytes after the check. Memory: the process's peak above what it held before the first "
             "check (the forward's attention maps included). Ratios: check + forward against the same of the plain "
             "formula of i and j, and of ALiBi as a formula.", "",
             "| formula | parts | check (s) | forward (s) | check + forward vs i and j | vs ALiBi | peak memory (MB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, formula in {**PLAIN, **WORST}.items():
        r = rows[formula]
        total = r["check_s"] + r["forward_s"]
        shown = formula if len(formula) <= 140 else formula[:60] + " … " + formula[-20:]
        lines.append(f"| {name}: `{shown}` | {r['parts']} | {r['check_s']:.2f} | {r['forward_s']:.2f} | "
                     f"{total / (pairs['check_s'] + pairs['forward_s']):.1f}x | "
                     f"{total / (plain['check_s'] + plain['forward_s']):.1f}x | {r['peak_mb']:.0f} |")
    worst = max((rows[f] for f in WORST.values()), key=lambda r: r["check_s"] + r["forward_s"])
    lines += ["", f"The worst under the caps: {worst['check_s'] + worst['forward_s']:.2f} s for check and forward, "
                  f"{max(rows[f]['peak_mb'] for f in WORST.values()):.0f} MB at most."]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="put the table in BENCHMARKS.md")
    args = parser.parse_args(argv)
    rows = {}
    for formula in {**PLAIN, **WORST}.values():
        rows[formula] = measure(formula)
        print(formula, rows[formula], flush=True)
    text = table(rows)
    print(text)
    if args.write:
        from posviz_tools.bench_report import write_marked

        write_marked(ROOT / "BENCHMARKS.md", "workshop-formulas", text)


if __name__ == "__main__":
    main()
