"""StreamingLLM's step against a plain cached step, per shipped checkpoint, as the KV cache lab runs them
(``python -m posviz_tools.bench --streaming`` writes this section of BENCHMARKS.md alone; ``make bench`` too).

Past the window, StreamingLLM moves its sinks before every step. Where a key's position is only a rotation fixed
for every length (``PositionMethod.shift_cached_keys``: RoPE, p-RoPE, static scalings, layouts of rotary layers)
the cached sink keys are turned; every other method runs the sink ids again. Goal (issue #45): for the methods
whose keys turn, a StreamingLLM step within 1.3x a plain cached step.
"""
from __future__ import annotations

import statistics

import torch

GOAL = 1.3  # a StreamingLLM step over a plain cached step, for the methods whose sink keys turn
STEPS = 64  # steps past the window, each timed as the lab times it (ms per byte of the loop)
REPEATS = 5  # the two strategies alternate, and the median of the pairs' ratios is kept


def turns(lab) -> bool:
    """Whether the model's StreamingLLM moves turn the cached keys (a trial on an empty key of each layer)."""
    position = lab.net.position
    probe = torch.zeros(1, 1, 0, position.shape.head_dim)
    return all(position.shift_cached_keys(layer, probe, 1) is not None for layer in range(position.shape.n_layer))


def measure(models, window: int, steps: int = STEPS, repeats: int = REPEATS) -> dict[str, tuple | None]:
    """{name: (ms per byte cached, ms per byte StreamingLLM, whether its sinks turn, median ratio)} at ``window``, on
    held-out text; None for a model that cannot hold the window past its positions."""
    from posviz.labs import inputs as lab_inputs, kv_cache
    from posviz.models.shipped import as_lab_model
    from posviz.training.data import load_corpus

    ids = lab_inputs.prepare_text(b"".join(load_corpus().eval_documents)[: window + steps + 1]).ids
    out = {}
    for name, (model, _) in models.items():
        lab = as_lab_model(model, name)
        limit = model.position.max_positions
        if limit is not None and limit < window + steps:
            out[name] = None
            continue
        plain, streaming = [], []
        for _ in range(repeats):
            plain.append(kv_cache.sliding_score(lab, ids, window, "cached_window", window + steps).ms_per_byte)
            streaming.append(kv_cache.sliding_score(lab, ids, window, "streaming", window + steps).ms_per_byte)
        ratio = statistics.median(s / p for s, p in zip(streaming, plain))
        out[name] = (statistics.median(plain), statistics.median(streaming), turns(lab), ratio)
        print(f"  streaming {name:>16}: {out[name][1]:.2f} ms/byte against {out[name][0]:.2f} cached "
              f"({ratio:.2f}x; sinks {'turned' if out[name][2] else 'run again'})", flush=True)
    return out


def section(rows: dict, window: int, steps: int, info: dict[str, str]) -> str:
    """BENCHMARKS.md's StreamingLLM section: the goal's verdict, then one row per checkpoint."""
    import time

    measured = {m: r for m, r in rows.items() if r}
    turned = {m: r[3] for m, r in measured.items() if r[2]}
    worst = max(turned, key=turned.get) if turned else None
    over = sorted(m for m, v in turned.items() if v > GOAL)
    goal = (f"Goal: a StreamingLLM step <= {GOAL}x a plain cached step where the sinks turn. "
            + (f"Worst: {worst} {turned[worst]:.2f}x" if worst else "No checkpoint turns its sinks")
            + (f"; over: {', '.join(f'{m} {turned[m]:.2f}x' for m in over)}" if over else "")
            + (". met" if turned and not over else ". **MISSED**"))
    lines = [f"## StreamingLLM step against a plain cached step (W = {window}, 4 sinks, window already full)", "",
             f"Measured by `python -m posviz_tools.bench --streaming` on {time.strftime('%Y-%m-%d %H:%M')} "
             f"({info.get('CPU', '')}, {info.get('torch threads', '')} threads): ms per byte of the KV cache lab's loop, "
             f"{steps} steps past the window, the two strategies alternating {REPEATS} times (median of the pairs' "
             "ratios). *Sinks*: turned (the cached sink keys rotate to their new positions) or run again (the sink "
             "bytes run through the model at every step: a method whose keys carry more than a rotation).", "",
             goal, "",
             "| checkpoint | sinks | cached step (ms/byte) | StreamingLLM step (ms/byte) | ratio |",
             "| --- | --- | ---: | ---: | ---: |"]
    for name, r in rows.items():
        if r is None:
            lines.append(f"| {name} | n/a | n/a | n/a | n/a: its positions end before the window slides |")
        else:
            lines.append(f"| {name} | {'turned' if r[2] else 'run again'} | {r[0]:.2f} | {r[1]:.2f} | {r[3]:.2f}x |")
    return "\n".join(lines)
