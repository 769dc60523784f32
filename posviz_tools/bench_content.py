"""The methods that compute positions from the content, against ALiBi and RoPE, side by side in one run
(``python -m posviz_tools.bench_content``; rewrites its own section of BENCHMARKS.md).

* **Forward at 16x train_length** (4,096 bytes, batch 1, one thread): each content method's seconds over ALiBi's,
  timed in alternation (``paired_ratio``). Goal: within 3x.
* **The bound a content method cannot beat here:** a method that scores its blocks itself and adds nothing (no gate,
  no count, no transform): the passes every content method makes over rows x keys (its scores, their softmax or
  gates, the weights times the values) with nothing of its own. Its ratio to ALiBi is the floor; what a method pays
  over it is its own work.
* **The KV cache lab's answer**: the lab's cached-window strategy over 512 bytes with a 256-byte window (256 cached
  steps), each method's seconds over RoPE's. Goal: within 2x.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from posviz.models.byte_gpt import GPT
from posviz.models.shipped import as_lab_model
from posviz.positions import POSITION_METHODS, method_names
from posviz.positions.base import PositionMethod
from posviz.training.train import TrainConfig

from .bench_compute import bench_models, paired_ratio
from .bench_report import machine, write_marked

ROOT = Path(__file__).resolve().parent.parent
FORWARD_GOAL, CACHE_GOAL, MULTIPLE = 3.0, 2.0, 16


class ScoredPlainly(PositionMethod):
    """Scores its blocks itself (a content hook that adds nothing): the content path's own cost, no method's work."""

    name = "content floor"
    kind = "content"

    def content_bias(self, layer, scores, q, k, seen):
        return None


def floor_model(reference: GPT) -> GPT:
    """A model of the recipe's shape whose attention takes the content path with nothing of a method in it."""
    net = GPT(dataclasses.replace(reference.config, position="nope")).eval()
    net.position = ScoredPlainly(net.position.shape)
    return net


def content_methods() -> list[str]:
    return [m for m in method_names() if POSITION_METHODS[m].kind == "content"]


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@torch.inference_mode()
def measure(min_time: float, cache_bytes: int, window: int, multiple: int = MULTIPLE) -> dict:
    models = bench_models()
    recipe = TrainConfig()
    length = multiple * recipe.train_length
    ids = torch.randint(0, 256, (1, length))
    alibi, rope = models["alibi"][0], models["rope"][0]
    rows = {}
    names = content_methods()
    for name in ["content floor", *names]:
        net = floor_model(alibi) if name == "content floor" else models[name][0]
        ratio = paired_ratio(lambda: net(ids), lambda: alibi(ids), min_time)
        rows[name] = {"forward_ratio": ratio, "source": "built here" if name == "content floor" else models[name][1]}
    rows["alibi"] = {"forward_s": seconds(lambda: alibi(ids))}
    from posviz.labs.kv_cache import sliding_score

    text = torch.randint(0, 256, (cache_bytes,))
    rope_lab = as_lab_model(rope, "rope")
    for name in names:
        lab = as_lab_model(models[name][0], name)
        rows[name]["cache_ratio"] = paired_ratio(
            lambda: sliding_score(lab, text, window, "cached_window", timed_steps=None),
            lambda: sliding_score(rope_lab, text, window, "cached_window", timed_steps=None), min_time, min_pairs=3)
    return rows


def section(rows: dict, info: dict, length: int, cache_bytes: int, window: int, multiple: int = MULTIPLE) -> str:
    floor = rows["content floor"]["forward_ratio"]
    lines = [f"## The content methods against ALiBi's forward and RoPE's KV-cache answer (`python -m posviz_tools.bench_content`)", "",
             f"{info.get('CPU', 'this CPU')}, one thread. Forward: {length:,} bytes ({multiple}x the training length), "
             f"batch 1, each method's seconds over ALiBi's in alternation (ALiBi: {rows['alibi']['forward_s']:.2f} s a pass). "
             f"Goal: within {FORWARD_GOAL:g}x. The floor is a method that scores its blocks itself and adds nothing: "
             f"{floor:.2f}x ALiBi, the passes over rows x keys every content method makes (scores, softmax, weights "
             "times values, block by block, where ALiBi's bias rides the fused kernel). KV cache lab: the cached-window "
             f"strategy over {cache_bytes} bytes with a {window}-byte window, over RoPE's; goal within {CACHE_GOAL:g}x.", "",
             "| method | forward / ALiBi | over the floor | goal 3x | KV cache lab / RoPE | goal 2x |",
             "| --- | ---: | ---: | --- | ---: | --- |"]
    for name, r in rows.items():
        if name in ("alibi", "content floor"):
            continue
        f, c = round(r["forward_ratio"], 2), round(r["cache_ratio"], 2)  # judged as shown: "3.00x" is within 3x
        lines.append(f"| {name} | {f:.2f}x | {f - floor:+.2f}x | {'met' if f <= FORWARD_GOAL else '**MISSED**'} | "
                     f"{c:.2f}x | {'met' if c <= CACHE_GOAL else '**MISSED**'} |")
    lines.append(f"| content floor | {floor:.2f}x | | | | |")
    over = [(n, r["forward_ratio"]) for n, r in rows.items() if n not in ("alibi", "content floor")
            and r["forward_ratio"] > FORWARD_GOAL]
    if over:
        lines += ["", "Over the goal, what stops each one: the floor takes " f"{floor:.2f}x of the {FORWARD_GOAL:g}x, "
                  f"leaving {FORWARD_GOAL - floor:.2f}x for a method's own passes over rows x keys; "
                  + "; ".join(f"{n}'s own take {f - floor:.2f}x, {(f - floor) / max(FORWARD_GOAL - floor, 1e-9):.1f} "
                              "times that room" for n, f in over)
                  + ". Below the goal such a method needs its gates, counts or sums along the keys fused into the "
                    "kernel that makes the scores, which PyTorch's CPU kernels do not offer."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="content methods against ALiBi's forward and RoPE's KV-cache answer")
    ap.add_argument("--min-time", type=float, default=3.0, help="seconds of paired timing per method (at least 5 pairs)")
    ap.add_argument("--cache-bytes", type=int, default=512)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--multiple", type=int, default=MULTIPLE, help="forward length, x the training length (the goal: 16)")
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = measure(args.min_time, args.cache_bytes, args.window, args.multiple)
    text = section(rows, machine(), args.multiple * TrainConfig().train_length, args.cache_bytes, args.window, args.multiple)
    write_marked(Path(args.out), "content-forward", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
