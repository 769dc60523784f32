"""BENCHMARKS.md from one run of the bench: the machine, one row per goal (each built by its own
``goal_*`` function, in ``GOAL_ROWS``' order), then one section per measurement.

Nothing here measures: ``report`` takes what ``bench.main`` measured (``bench_compute``,
``bench_browser``, ``bench_protocol``) and writes it out, so the tests can give it numbers of their own.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time
from pathlib import Path
from typing import Callable

import torch

from posviz.config import ModelConfig
from posviz.models.byte_gpt import GPT

from .bench_browser import COLD_GOALS, NEW_SETTING
from .bench_compute import (FLOOR_LABEL, GOALS, MULTIPLES, NEAR_BOUND, NEAR_BOUND_TIME, SECOND_PRODUCT,
                            TOKENS_PER_CALL)
from .bench_protocol import SLIDER_ANSWER_GOAL_S


def _slowest(values: dict[str, float]) -> str:
    """The key of the largest value; a page that failed (NaN) counts as the slowest."""
    return max(values, key=lambda k: values[k] if values[k] == values[k] else float("inf"))


def page_verdicts(renders: dict, labs: set[str], session_floor_s: float = 0.0) -> list[str]:
    """Goal rows for the page renders (``measure_first_render``'s {page: (first visitor complete, first
    content, later complete, later first content, warm-server complete, warm-server first content)}).

    No page can appear in a new browser session sooner than ``session_floor_s`` (a page with one
    metric), so the first-chart goals are 1 s on top of it; the complete goals stand as they are."""
    lines = []

    def column(i: int, only_labs: bool | None = None) -> dict[str, float]:
        return {k: v[i] for k, v in renders.items() if len(v) > i and (only_labs is None or (k in labs) == only_labs)}

    plus = (f" + the new-session floor ({session_floor_s:.2f} s: a page with one metric, in a new browser session "
            "on a running server; no page can appear sooner)") if session_floor_s else ""
    first_goal, done_goal = GOALS["lab_page_first_s"] + session_floor_s, GOALS["lab_page_complete_s"]

    def drawn_at_once(complete: dict[str, float]):
        """Why a page whose results are all stored shows its first chart no sooner: nothing is left to
        compute, so the server sends the whole page at once and the browser draws it in one go."""
        return lambda k: (f" (drawn in one go with the rest of the page, complete at {complete[k]:.2f} s: every result "
                          f"stored, so the time over the new-session floor is the browser drawing this page)"
                          if k in complete and complete[k] == complete[k] else "")

    for label, values, goal, why in (
            (f"every lab's first chart <= {GOALS['lab_page_first_s']:.0f} s{plus}, a new session on a warm server",
             column(5, True), first_goal, drawn_at_once(column(4, True))),
            (f"every lab complete <= {done_goal:.0f} s, a new session on a warm server", column(4, True), done_goal, None),
            (f"every other page complete <= {GOALS['render_s']:.0f} s, a new session on a warm server",
             column(4, False), GOALS["render_s"], None),
            (f"every lab's first chart <= {GOALS['lab_page_first_s']:.0f} s + the new-session floor, a later visitor "
             "(shared results, no warm-up)", column(3, True), first_goal, drawn_at_once(column(2, True))),
            (f"every page complete <= {done_goal:.0f} s, a later visitor (shared results, no warm-up)", column(2),
             done_goal, None)):
        if not values:
            continue
        slow = _slowest(values)
        late = [k for k, v in values.items() if not (v == v and v <= goal)]
        over = ", ".join(f"{k} {fmt(values[k], '.2f')} s{why(k) if why else ''}" for k in late) or "none"
        lines.append(f"| {label} | slowest: {slow} {fmt(values[slow], '.2f')} s; over: {over} | {verdict(not late)} |")
    # A server that has computed nothing: its first visitor of a lab computes the whole default view. Shown, not
    # a goal: that computation is what the warm-up and the shared store spare every visitor after it.
    first, later = column(0, True), column(2, True)
    if first:
        slow = _slowest(first)
        lines.append(f"| (measured, no goal) a lab's first visitor on a server that computed nothing (`POSVIZ_WARM=0`): "
                     f"it computes the default view | slowest: {slow} {fmt(first[slow], '.2f')} s complete; each lab "
                     "first visitor / later visitor: " + ", ".join(f"{k} {fmt(first[k], '.2f')} / {fmt(later.get(k), '.2f')} s"
                                                                   for k in first) + " | measured |")
    return lines


def cold_verdicts(visits: dict, floor_s: float = 0.0, session_floor_s: float = 0.0,
                  running: dict | None = None) -> list[str]:
    """Goal rows for the cold visits: explore pages complete, labs' first chart and complete, new settings.

    A cold visit cannot beat ``floor_s``, the cold floor (a page with nothing but the imports, started
    the same way), so the cold goals are the floor plus the time each goal allows a page itself. Where
    a page misses, its row says what the time is made of: the cold floor plus the page's own work
    (``running``: {page: (complete, first chart)} of its first visitor on a running server, less the
    new-session floor that visit also paid); for a new setting, the new-session floor plus computing it
    (the setting's time less that of a later visitor of the same setting, who gets it shared)."""
    explore = {k: v["cold"][0] for k, v in visits.items() if v["section"] != "Live labs"}
    labs_first = {k: v["cold"][1] for k, v in visits.items() if v["section"] == "Live labs"}
    labs_done = {k: v["cold"][0] for k, v in visits.items() if v["section"] == "Live labs"}
    new = {k: v["new"][0] for k, v in visits.items() if v["new"] is not None}
    plus = f" + the cold floor ({floor_s:.2f} s)" if floor_s else ""
    # a new setting opens in a new browser session: it cannot beat that session's own floor
    session_plus = f" + the new-session floor ({session_floor_s:.2f} s)" if session_floor_s else ""
    running = running or {}

    def page_work(page: str, i: int) -> str:
        if page not in running or running[page][i] != running[page][i]:
            return ""
        own = max(0.0, running[page][i] - session_floor_s)
        return (f" (= the cold floor {floor_s:.2f} s + {own:.2f} s of the page's own work, measured on a running "
                f"server: {floor_s + own:.2f} s)")

    def computing(page: str) -> str:
        later = visits[page].get("new_later")
        if not later:
            return ""
        return (f" (= a later visitor of the same setting {later[0]:.2f} s, who gets it shared, + "
                f"{max(0.0, new[page] - later[0]):.2f} s computing it)")

    rows = []
    for label, values, goal, why in (
            (f"every explore page complete < {COLD_GOALS['explore_complete']:.0f} s{plus}, cold", explore,
             COLD_GOALS["explore_complete"] + floor_s, lambda k: page_work(k, 0)),
            (f"every lab's first chart < {COLD_GOALS['lab_first']:.0f} s{plus}, cold", labs_first,
             COLD_GOALS["lab_first"] + floor_s, lambda k: page_work(k, 1)),
            (f"every lab complete < {COLD_GOALS['lab_complete']:.0f} s{plus}, cold", labs_done,
             COLD_GOALS["lab_complete"] + floor_s, lambda k: page_work(k, 0)),
            (f"a new setting < {COLD_GOALS['new_setting']:.0f} s (complete){session_plus}", new,
             COLD_GOALS["new_setting"] + session_floor_s, computing)):
        if values:
            worst = max(values, key=values.get)
            late = sorted(k for k, v in values.items() if not v < goal)
            rows.append(f"| {label} | slowest: {worst} {values[worst]:.2f} s"
                        + (f"; over: " + ", ".join(f"{k} {values[k]:.2f} s{why(k)}" for k in late) if late else "")
                        + f" | {verdict(not late)} |")
    return rows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"CPU": cpu, "cores": str(os.cpu_count()), "torch threads": str(torch.get_num_threads()),
            "torch": torch.__version__, "python": platform.python_version(), "OS": platform.platform()}


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**MISSED**")


def fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None or x != x else format(x, spec)


@dataclasses.dataclass
class Measured:
    """Everything one run measured (``main``'s measurements), as the report's row and section builders read it."""
    args: argparse.Namespace
    info: dict[str, str]
    peak: float
    models: dict[str, tuple[GPT, str]]
    peer_label: str
    fwd: dict
    share: dict
    vs_peer: dict
    extraction: dict
    cache: dict
    changes: dict
    renders: dict
    cold: float | None
    render_problem: str | None
    visits: dict | None = None
    visits_problem: str | None = None
    lab: tuple | None = None
    floor: dict | None = None
    floor_problem: str | None = None
    decode_floors: dict | None = None
    session_floor: float | None = None
    warmup: float | None = None
    slider_answer: dict | None = None

    @property
    def config(self) -> ModelConfig:
        return self.models["nope"][0].config

    @property
    def train_length(self) -> int:
        return self.config.train_length

    @property
    def top(self) -> int:
        return max(MULTIPLES)


def report(args, info, peak, models, peer_label, fwd, share, vs_peer, extraction, cache, changes, renders, cold,
           render_problem, visits=None, visits_problem=None, lab=None, floor=None, floor_problem=None,
           decode_floors=None, session_floor=None, warmup=None, slider_answer=None) -> str:
    """BENCHMARKS.md: the machine, one row per goal (each built by its own ``goal_*`` function), then
    one section per measurement."""
    run = Measured(args, info, peak, models, peer_label, fwd, share, vs_peer, extraction, cache, changes, renders,
                   cold, render_problem, visits, visits_problem, lab, floor, floor_problem, decode_floors,
                   session_floor, warmup, slider_answer)
    lines = machine_section(run) + goals_section(run)
    for section in (forward_section, extraction_section, cache_sections, length_change_section, lab_section,
                    render_section, cold_visits_section, cold_floor_section):
        lines += section(run)
    return "\n".join(lines) + "\n"


def machine_section(run: Measured) -> list[str]:
    cfg = run.config
    return ["# Benchmarks", "",
            f"Generated by `python -m posviz_tools.bench` on {time.strftime('%Y-%m-%d %H:%M')}. Every ratio compares two "
            "things measured in this one run on this machine; re-run it to get your machine's table.", "",
            "| machine | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in run.info.items()),
            f"| matmul peak (fp32 {run.args.matmul_n}² x {run.args.matmul_n}²) | {run.peak / 1e9:.1f} GFLOP/s |",
            f"| models | {cfg.n_layer} layers, {cfg.n_head} heads, width {cfg.n_embd}, train_length {run.train_length} "
            f"bytes, fp32, CPU |", f"| peer | {run.peer_label} |", ""]


# ---------------------------------------------------------------------------------------------
# The goal rows: one function per goal, each returning its rows of the Goals table (none where the
# run did not measure it)
# ---------------------------------------------------------------------------------------------
def goals_section(run: Measured) -> list[str]:
    lines = ["## Goals", "",
             "Where a goal is out of reach by construction on this machine, the row names the bound (measured in "
             f"this run: what no implementation of the same work beats here) and holds us to {NEAR_BOUND:.0%} of "
             f"its speed, or {NEAR_BOUND_TIME:.2f}x its time, instead.", "",
             "| goal | measured | verdict |", "| --- | --- | --- |"]
    for goal in GOAL_ROWS:
        lines += goal(run)
    return lines


def _pairwise_note(run: Measured, short: list[str]) -> str:
    """Why a method whose bias is a function of each (query, key) pair, not of the distance alone,
    stays under a bound made for per-distance biases: the extra time its bias takes per pass."""
    top = run.top
    floor_speed = run.fwd.get(FLOOR_LABEL, {}).get(top)
    notes = []
    for m in short:
        position = run.models[m][0].position
        if not floor_speed or not run.fwd[m].get(top):
            continue
        tokens = TOKENS_PER_CALL * run.train_length
        extra = tokens / run.fwd[m][top] - tokens / floor_speed
        if position.reads_content:
            notes.append(f"{m} computes what counts as far from each block's own scores or inputs (gates and sums "
                         f"along the keys) in every layer: +{extra:.2f} s per {tokens:,}-byte pass over the free-bias floor")
            continue
        if position.is_shift_invariant():
            continue
        notes.append(f"{m}'s bias is not one value per distance but its MLP of each (query, key) pair's positions, in "
                     f"every layer (past its threshold the query's own position rescales the distance): +{extra:.2f} s "
                     f"per {tokens:,}-byte pass over the free-bias floor, the cost of that pairwise bias")
    return ("; " + "; ".join(notes)) if notes else ""


def _scores_explicitly(position) -> bool:
    """Whether attention must build the scores itself: a logit bias, or positions computed from the content
    (FoX, CoPE: a bias; stick-breaking: its own weights), sink logits or a sliding window (a layout's layers), which
    the fused causal kernel does not take. Held to the free-bias bound."""
    layers = [position.at_layer(i) for i in range(position.shape.n_layer)]  # a layout asks each layer's method
    return any(m.has_logit_bias or m.scores_itself or m.window is not None for m in layers)


def _vs_peer_at_top(run: Measured, logit_bias: bool | None = None) -> dict[str, float]:
    """{method: its speed over the peer's at the top multiple}, of the methods with (or without) a logit bias
    or content-computed positions."""
    top = run.top
    return {m: run.vs_peer[m][top] for m in run.models if run.vs_peer.get(m, {}).get(top) is not None
            and (logit_bias is None or _scores_explicitly(run.models[m][0].position) == logit_bias)}


def goal_forward_vs_peer(run: Measured) -> list[str]:
    """Forward >= the GPT-2 peer at the top multiple, for the methods without a logit bias."""
    top = run.top
    if not _vs_peer_at_top(run):
        return [f"| forward >= GPT-2 peer at {top}x | peer not measured | n/a |"]
    plain = _vs_peer_at_top(run, logit_bias=False)
    if not plain:
        return []
    return [f"| forward >= GPT-2 peer at {top}x train_length (methods without a logit bias: the same "
            f"attention work as GPT-2) | worst {min(plain, key=plain.get)} {min(plain.values()):.2f}x, best "
            f"{max(plain, key=plain.get)} {max(plain.values()):.2f}x | {verdict(min(plain.values()) >= GOALS['peer'])} |"]


def goal_forward_with_bias(run: Measured) -> list[str]:
    """Forward with an (H, T, T) logit bias >= 90% of its bound, the free bias (less for a bias that reads the query)."""
    top = run.top
    biased = _vs_peer_at_top(run, logit_bias=True)
    bias_floor = run.vs_peer.get(FLOOR_LABEL, {}).get(top)
    if not (biased and bias_floor):
        return []
    # a bias that reads the query needs a third query-key-sized product: its bound is the floor / 1.5
    bound = {m: bias_floor / (SECOND_PRODUCT if run.models[m][0].position.bias_depends_on_query else 1.0) for m in biased}
    share_of = {m: biased[m] / bound[m] for m in biased}
    worst = min(share_of, key=share_of.get)
    return [f"| forward with an (H, T, T) logit bias >= {NEAR_BOUND:.0%} of its bound at {top}x (bound: a free "
            f"bias, zeros made once, {bias_floor:.2f}x the peer: the fused causal kernel cannot take a bias; a bias "
            f"that reads the query, {SECOND_PRODUCT:g}x less for its extra query-key product) | worst {worst} "
            f"{biased[worst]:.2f}x the peer = {share_of[worst]:.0%} of its bound; "
            + ", ".join(f"{m} {share_of[m]:.0%}" for m in sorted(share_of, key=share_of.get))
            + _pairwise_note(run, [m for m in share_of if share_of[m] < NEAR_BOUND])
            + f" | {verdict(share_of[worst] >= NEAR_BOUND)} |"]


def goal_matmul_peak(run: Measured) -> list[str]:
    """>= 50% of the matmul peak at the top multiple, or for a method with a logit bias 90% of the free-bias floor's."""
    top = run.top
    shares = {m: run.share[m][top] for m in run.models if run.share[m][top] is not None}
    if not shares:
        return []
    best = max(shares, key=shares.get)
    floor_share = run.share.get(FLOOR_LABEL, {}).get(top)

    def needed(m: str) -> float:
        """A method with a logit bias does the useful work of one without, in no less than the free-bias
        floor's time: its share of peak is bounded by the floor's (by 1.5x less for a bias that reads the query)."""
        position = run.models[m][0].position
        if not _scores_explicitly(position) or not floor_share:
            return GOALS["peak"]
        return min(GOALS["peak"], NEAR_BOUND * floor_share / (SECOND_PRODUCT if position.bias_depends_on_query else 1.0))

    short = sorted((m for m in shares if shares[m] < needed(m)), key=shares.get)
    bound = (f", or for a method with a logit bias >= {NEAR_BOUND:.0%} of its bound's (the free-bias floor's "
             f"{floor_share:.0%}; a bias that reads the query, {SECOND_PRODUCT:g}x less)" if floor_share else "")
    return [f"| >= {GOALS['peak']:.0%} of matmul peak at {top}x{bound} | best: {best} {shares[best]:.0%}, worst: "
            f"{min(shares, key=shares.get)} {min(shares.values()):.0%}"
            + (f"; under: " + ", ".join(f"{m} {shares[m]:.0%} (needs {needed(m):.0%})" for m in short) if short else "")
            + _pairwise_note(run, short) + f" | {verdict(not short)} |"]


def goal_extraction(run: Measured) -> list[str]:
    """Attention-map extraction <= 1.3x a plain forward (or 1.15x the bare map's cost), one row per multiple."""
    rows = []
    for multiple in MULTIPLES:
        at = {m: v[multiple][0] for m, v in run.extraction.items() if v.get(multiple)}
        if not at:
            continue
        worst = max(at, key=at.get)
        bare_map = at.get("nope")  # no position work at all: what writing out the map costs by itself
        allowed = max(GOALS["extraction"], NEAR_BOUND_TIME * bare_map) if bare_map else GOALS["extraction"]
        bound = (f" (or <= {NEAR_BOUND_TIME:.2f}x the bare map's {bare_map:.2f}x: nope, no position work, pays it "
                 "for the probabilities the fused kernel never writes)" if bare_map and allowed > GOALS["extraction"] else "")
        rows.append(f"| attention-map extraction <= {GOALS['extraction']}x a plain forward{bound}, {multiple}x "
                    f"train_length | worst: {worst} {at[worst]:.2f}x, best: {min(at, key=at.get)} "
                    f"{min(at.values()):.2f}x | {verdict(at[worst] <= allowed)} |")
    return rows


def goal_cached_decoding(run: Measured) -> list[str]:
    """Cached decoding >= 10x faster than re-encoding the window, or 90% of a bare eager step's speed-up."""
    train_length = run.train_length
    speedups = {m: v[1] / v[0] for m, v in run.cache[train_length].items() if v}
    if not speedups:
        return []
    worst = min(speedups, key=speedups.get)
    bare = (run.decode_floors or {}).get(train_length)
    if not bare:
        return [f"| cached decoding >= {GOALS['cache']:.0f}x faster than re-encoding (W = {train_length}) | "
                f"worst: {worst} {speedups[worst]:.1f}x | {verdict(speedups[worst] >= GOALS['cache'])} |"]
    ceiling = bare[1] / bare[0]
    need = min(GOALS["cache"], NEAR_BOUND * ceiling)
    short = sorted((m for m, v in speedups.items() if v < need), key=speedups.get)
    extra = {m: (run.cache[train_length][m][0] - bare[0]) * 1e3 for m in short}
    return [f"| cached decoding >= {GOALS['cache']:.0f}x faster than re-encoding (W = {train_length}), or "
            f">= {NEAR_BOUND:.0%} of a bare eager step's {ceiling:.1f}x (the bound: a step with no position "
            f"method, no cache bookkeeping, no checks) | worst: {worst} {speedups[worst]:.1f}x, best: "
            f"{max(speedups, key=speedups.get)} {max(speedups.values()):.1f}x"
            + (f"; under {need:.1f}x: " + ", ".join(f"{m} {speedups[m]:.1f}x (+{extra[m]:.2f} ms a step over "
                                                 "the bare step: its position hooks' eager dispatch)" for m in short)
               if short else "") + f" | {verdict(not short)} |"]


def goal_length_change(run: Measured) -> list[str]:
    """One length change at the top multiple on one model < 1 s, or <= 1.15x its one forward pass with the map."""
    unbounded = {m: v for m, v in run.changes.items() if run.models[m][0].position.max_positions is None}
    if not unbounded:
        return []
    slow = max(unbounded, key=lambda m: unbounded[m][0])
    late = sorted(m for m, v in unbounded.items()
                  if not (v[0] < GOALS["length_change_s"] or (len(v) > 2 and v[0] <= NEAR_BOUND_TIME * v[2])))
    over = [m for m, v in unbounded.items() if v[0] >= GOALS["length_change_s"]]
    return [f"| one length change at {run.top}x train_length on one model < {GOALS['length_change_s']:.0f} s, or "
            f"<= {NEAR_BOUND_TIME:.2f}x its one forward pass with the map (the bound: the page cannot do less) | "
            f"slowest {slow} {unbounded[slow][0]:.2f} s; under 1 s: {len(unbounded) - len(over)} of {len(unbounded)}"
            + "".join(f"; {m} {unbounded[m][0]:.2f} s = {unbounded[m][0] / unbounded[m][2]:.2f}x its one pass "
                      f"({unbounded[m][2]:.2f} s)" for m in over if len(unbounded[m]) > 2)
            + f" | {verdict(not late)} |"]


def goal_lab_first_result(run: Measured) -> list[str]:
    """The Extrapolation lab with every checkpoint, a new length: the first checkpoint's result < 1 s."""
    if run.lab is None:
        return []
    seconds, length, parts, first_s, bare_s, flops = run.lab
    return [f"| Extrapolation lab, every shipped checkpoint, a new length ({length}): the first checkpoint's "
            f"result < {GOALS['lab_first_s']:.0f} s (each result is drawn as it comes) | {first_s:.2f} s | "
            f"{verdict(first_s < GOALS['lab_first_s'])} |"]


def goal_lab_all_results(run: Measured) -> list[str]:
    """The Extrapolation lab with every checkpoint, a new length: all of them < 4 s, or <= 1.15x the bare passes."""
    if run.lab is None:
        return []
    seconds, length, parts, first_s, bare_s, flops = run.lab
    flop_floor = flops / run.peak
    reachable = flop_floor < GOALS["lab_all_s"]
    return [f"| Extrapolation lab, every shipped checkpoint, a new length ({length}): all < "
            f"{GOALS['lab_all_s']:.0f} s, or <= {NEAR_BOUND_TIME:.2f}x the bare forward passes where even they "
            f"take longer (bound: the {len(parts)} passes alone, {bare_s:.2f} s; their "
            f"{flops / 1e9:.0f} GFLOP at this machine's matmul peak alone take {flop_floor:.2f} s) | "
            f"{seconds:.2f} s = {seconds / bare_s:.2f}x the bare passes | "
            f"{verdict(seconds < GOALS['lab_all_s'] or (not reachable or bare_s >= GOALS['lab_all_s']) and seconds <= NEAR_BOUND_TIME * bare_s)} |"]


def goal_slider_answer(run: Measured) -> list[str]:
    answer = run.slider_answer
    if not answer:
        return []
    met = answer["cpu_s"] <= SLIDER_ANSWER_GOAL_S
    return [f"| Extrapolation lab: server CPU per length-slider answer, results stored (≤ {SLIDER_ANSWER_GOAL_S} s) | "
            f"{answer['cpu_s']:.3f} s ({answer['messages']:.0f} messages, {answer['bytes'] / 1e3:.0f} kB; a protocol "
            f"session, no browser) | {'met' if met else 'MISSED'} |"]


def goal_page_renders(run: Measured) -> list[str]:
    """The pages on a warm server and for a later visitor (``page_verdicts``), or why they were not measured."""
    if not run.renders:
        return [f"| every page's first render < {GOALS['render_s']:.0f} s | {run.render_problem} | n/a |"]
    labs = {k for k, v in (run.visits or {}).items() if v["section"] == "Live labs"} or \
        {"extrapolation", "kv-cache", "context-extension", "retrieval", "generation", "compare"}
    return page_verdicts(run.renders, labs, run.session_floor or 0.0)


def goal_cold_visits(run: Measured) -> list[str]:
    """Cold first visits and new settings (``cold_verdicts``), over the cold floor."""
    if not run.visits:
        return []
    cold_floor = (run.floor or {}).get("+ pandas, altair, torch", 0.0)
    return cold_verdicts(run.visits, cold_floor, run.session_floor or 0.0,
                         {k: (v[0], v[1]) for k, v in (run.renders or {}).items()})


# The Goals table, in this order.
GOAL_ROWS: tuple[Callable[[Measured], list[str]], ...] = (
    goal_forward_vs_peer, goal_forward_with_bias, goal_matmul_peak, goal_extraction, goal_cached_decoding,
    goal_length_change, goal_lab_first_result, goal_lab_all_results, goal_slider_answer, goal_page_renders,
    goal_cold_visits)


# ---------------------------------------------------------------------------------------------
# The sections after the goals: one table per measurement
# ---------------------------------------------------------------------------------------------
def forward_section(run: Measured) -> list[str]:
    train_length, top, fwd, share, vs_peer = run.train_length, run.top, run.fwd, run.share, run.vs_peer
    lines = ["", f"## Forward pass (tokens/s; batch x length = {TOKENS_PER_CALL} x {train_length} bytes per call)", "",
             "n/a: the method has no positions that far (learned absolute ends at train_length). *vs peer*: the "
             "method's speed over the GPT-2 peer's on the same batch, the two timed back to back in alternation "
             "(median of the pairs). Share of peak: useful FLOP/s (weights and causal attention) over the fp32 "
             "matmul peak above.", "",
             "| method | weights | " + " | ".join(f"{m}x ({m * train_length}) tok/s" for m in MULTIPLES)
             + " | " + " | ".join(f"{m}x vs peer" for m in MULTIPLES) + f" | {top}x share of matmul peak |",
             "| --- | --- |" + " ---: |" * (2 * len(MULTIPLES) + 1)]
    peer = fwd.get("GPT-2 peer", {})
    for name, (_, source) in run.models.items():
        speed = [fmt(fwd[name][m], ",.0f") for m in MULTIPLES]
        vs = [fmt(vs_peer.get(name, {}).get(m), ".2f") + ("x" if vs_peer.get(name, {}).get(m) else "") for m in MULTIPLES]
        lines.append(f"| {name} | {source} | " + " | ".join(speed) + " | " + " | ".join(vs)
                     + f" | {fmt(share[name][top], '.0%')} |")
    if FLOOR_LABEL in fwd:
        lines.append(f"| {FLOOR_LABEL} | nope's weights | " + " | ".join(fmt(fwd[FLOOR_LABEL][m], ",.0f") for m in MULTIPLES)
                     + " | " + " | ".join(fmt(vs_peer[FLOOR_LABEL].get(m), ".2f") + "x" for m in MULTIPLES)
                     + f" | {fmt(share[FLOOR_LABEL][top], '.0%')} |")
    if peer:
        lines.append("| GPT-2 peer | random init | " + " | ".join(fmt(peer[m], ",.0f") for m in MULTIPLES)
                     + " | " + " | ".join("1.00x" for _ in MULTIPLES) + f" | {fmt(share['GPT-2 peer'][top], '.0%')} |")
    return lines


def extraction_section(run: Measured) -> list[str]:
    train_length = run.train_length
    return ["", "## Attention-map extraction (batch 1, last layer; forward with the map / plain forward)", "",
            "The plain forward uses the fused causal kernel; the map needs the (H, T, T) probabilities written "
            "out, which at 16x train_length is 256 MB for one layer of this 4-layer model.", "",
            "| method | " + " | ".join(f"{m}x ({m * train_length})" for m in MULTIPLES) + " |",
            "| --- |" + " ---: |" * len(MULTIPLES),
            *(f"| {m} | " + " | ".join("n/a" if v.get(k) is None else f"{v[k][0]:.2f}x" for k in MULTIPLES) + " |"
              for m, v in run.extraction.items())]


def cache_sections(run: Measured) -> list[str]:
    train_length, lines = run.train_length, []
    for window, rows in run.cache.items():
        lines += ["", f"## Sliding-window decoding, per byte (window W = {window}"
                  f"{' = train_length' if window == train_length else ''}, window already full)", "",
                  "| method | cached step (ms) | re-encode W bytes (ms) | speed-up |", "| --- | ---: | ---: | ---: |"]
        for m, v in rows.items():
            if v is None:
                lines.append(f"| {m} | n/a: positions end at train_length, so only re-encoding can slide | | |")
            else:
                lines.append(f"| {m} | {v[0] * 1e3:.2f} | {v[1] * 1e3:.2f} | {v[1] / v[0]:.1f}x |")
        bare = (run.decode_floors or {}).get(window)
        if bare:
            lines.append(f"| *bare eager step (floor)* | {bare[0] * 1e3:.2f} | {bare[1] * 1e3:.2f} | {bare[1] / bare[0]:.1f}x |")
            lines += ["", "*Bare eager step*: the least any eager step of this model runs (embedding; per layer two "
                      "LayerNorms, four matrix-vector products, one attention over the window, GELU; no position "
                      "method, no cache bookkeeping, no checks), timed against nope's re-encoding in the same run. "
                      "At this size a step is dispatch overhead, not arithmetic: the floor bounds what any eager "
                      "cached path can reach here."]
    return lines


def length_change_section(run: Measured) -> list[str]:
    return ["", "## One move of the Extrapolation lab's length slider, per model (uncached, median of 3)", "",
            "Score the text at that length + attention map of the last layer (all heads, pooled, with distance "
            "and entropy per query) + the growth curve read off the same pass, as the lab does it for the model "
            "it inspects (at the top length one forward pass gives score and map). learned stops at its table.", "",
            "*One pass*: the bound, one bare forward pass over that length that returns the map, timed beside it.", "",
            "| method | length | seconds | one pass (s) |", "| --- | ---: | ---: | ---: |",
            *(f"| {m} | {v[1]} | {v[0]:.2f} | {fmt(v[2] if len(v) > 2 else None, '.2f')} |" for m, v in run.changes.items())]


def lab_section(run: Measured) -> list[str]:
    if run.lab is None:
        return []
    seconds, length, parts, first_s, bare_s, flops = run.lab
    return ["", f"## The Extrapolation lab with every shipped checkpoint selected, one new length ({length} bytes)", "",
            "As the page does it: the inspected checkpoint (the first) gives score, attention map and growth curve "
            "from one pass; every other one is scored at that length; a method that cannot reach it answers with "
            f"its limit. Uncached, median of 3: **{seconds:.2f} s** in all; the first checkpoint's result after "
            f"**{first_s:.2f} s** (the page draws each as it comes). The bound, the {len(parts)} bare forward passes "
            f"alone (the first with its map): {bare_s:.2f} s; their {flops / 1e9:.0f} GFLOP at the matmul peak "
            f"alone: {flops / run.peak:.2f} s. Parts of the last pass:", "",
            "| checkpoint | seconds |", "| --- | ---: |", *(f"| {m} | {t:.2f} |" for m, t in parts.items())]


def render_section(run: Measured) -> list[str]:
    lines = ["", "## First render of each page (headless Chromium, "
             f"checkpoints from {run.args.models or 'models/'})", ""]
    if not run.renders:
        return lines + [run.render_problem or "not measured"]
    lines += [f"*Warm server*: a server started as the README does; its first visit (the home page) starts its "
              "warm-up, which opens every page at its defaults itself, then computes the Extrapolation lab's other "
              f"slider stops (done {fmt(run.warmup, '.0f')} s after that first visit, median); then each page opens in a new "
              "browser session, as for a visitor of a demo that has been up a while. *First visitor*: a server that "
              "computes nothing ahead (`POSVIZ_WARM=0`), whose first visit took "
              f"{fmt(run.cold, '.2f')} s (imports of torch, Streamlit and the app included; not counted below); each page "
              "opens in a new browser session and computes all it shows. *Later visitor*: then another new session "
              "opens the same page and gets that visitor's shared results. Medians of three passes, each on new "
              "servers. *Complete*: the page script is done (every live number shown) and the browser has drawn it. "
              "*First chart*: the first chart, image, table or metric appeared (labs draw what needs no model first, "
              "then each live result as it comes).", "",
              "| page | warm server: complete (s) | warm server: first chart (s) | first visitor: complete (s) | "
              "first visitor: first chart (s) | later visitor: complete (s) | later visitor: first chart (s) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {p} | {fmt(v[4] if len(v) > 4 else None, '.2f')} | {fmt(v[5] if len(v) > 5 else None, '.2f')} | "
              f"{fmt(v[0], '.2f')}{'' if v[0] == v[0] else ' (exception on the page)'} | {fmt(v[1], '.2f')} | "
              f"{fmt(v[2] if len(v) > 2 else None, '.2f')} | {fmt(v[3] if len(v) > 3 else None, '.2f')} |"
              for p, v in run.renders.items()]
    return lines


def cold_visits_section(run: Measured) -> list[str]:
    lines = ["", "## Cold first visits and new settings (a new server per page, as `streamlit run app.py` starts it)", ""]
    if not run.visits:
        return lines + [run.visits_problem or "not measured"]
    lines += ["Each page is the very first visit of a newly started server (`POSVIZ_WARM=0`: the page alone, not "
              "beside the server's warm-up of the others): imports, checkpoint loading and every computation "
              "included, nothing warm. *New setting*: then, on that server, a new browser "
              "session opens the page with a value it has not computed (`" + "`, `".join(
                  f"{k}?{v}" for k, v in NEW_SETTING.items()) + "`), as moving a widget does. "
              f"Goals: explore pages complete < {COLD_GOALS['explore_complete']:g} s; labs' first chart < "
              f"{COLD_GOALS['lab_first']:g} s and complete < {COLD_GOALS['lab_complete']:g} s; a new setting < "
              f"{COLD_GOALS['new_setting']:g} s.", "",
              "| page | section | cold: first chart (s) | cold: complete (s) | new setting: first chart (s) | "
              "new setting: complete (s) | the same setting, a later visitor: complete (s) |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for page, v in run.visits.items():
        new = v["new"] or (float("nan"), float("nan"))
        again = v.get("new_later") or (float("nan"), float("nan"))
        flag = " (exception on the page)" if v["exception"] else ""
        lines.append(f"| {page}{flag} | {v['section']} | {v['cold'][1]:.2f} | {v['cold'][0]:.2f} | "
                     f"{fmt(new[1], '.2f')} | {fmt(new[0], '.2f')} | {fmt(again[0], '.2f')} |")
    return lines


def cold_floor_section(run: Measured) -> list[str]:
    lines = ["", "**The floor under a cold visit** (a page that draws one metric, a new server started the same "
             "way): what the browser, Streamlit's start and the imports cost before any posviz code runs. Every "
             "posviz page imports all three (torch for the position methods, pandas and Altair for the charts).", ""]
    if not run.floor:
        return lines + [run.floor_problem or "not measured"]
    return lines + ["| minimal page | cold: complete (s) |", "| --- | ---: |",
                    *(f"| {label} | {seconds:.2f} |" for label, seconds in run.floor.items())]


# ---------------------------------------------------------------------------------------------
# Sections measured on their own (``--pages-cpu``, ``--first-request``), kept between markers so that
# each command rewrites its own section and the full run keeps the ones it did not measure
# ---------------------------------------------------------------------------------------------
def marked(name: str, text: str) -> str:
    return f"<!-- {name}: begin -->\n{text.strip()}\n<!-- {name}: end -->"


def write_marked(path: Path, name: str, text: str) -> None:
    """Put ``text`` in ``path`` between ``name``'s markers, in place of what was there (or at the end)."""
    import re

    old = path.read_text() if path.exists() else ""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    if begin in old and end in old:
        new = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda m: marked(name, text), old, flags=re.S)
    else:
        new = old.rstrip() + "\n\n" + marked(name, text) + "\n"
    path.write_text(new)


def kept_marked_sections(old: str, new: str) -> str:
    """``new`` with every marked section of ``old`` that ``new`` does not hold appended (the published
    models' section, a section measured on its own): a full run does not erase what it did not measure."""
    import re

    for match in re.finditer(r"<!-- ([\w-]+): begin -->.*?<!-- \1: end -->", old, flags=re.S):
        if f"<!-- {match.group(1)}: begin -->" not in new:
            new = new.rstrip() + "\n\n" + match.group(0) + "\n"
    return new


def pages_cpu_section(rows: dict, info: dict[str, str]) -> str:
    """Server CPU per stored answer, one row per page (``bench_protocol.measure_pages_cpu``)."""
    from .bench_protocol import PAGE_ANSWER_GOAL_S

    lines = ["## Server CPU per stored answer, every page (a protocol session, no browser)", "",
             f"`python -m posviz_tools.bench --pages-cpu` on {time.strftime('%Y-%m-%d %H:%M')}, {info['CPU']}, "
             f"{info['cores']} cores. One server with no warm-up (`POSVIZ_WARM=0`); per page a session that speaks "
             "Streamlit's WebSocket protocol and draws nothing opens the page, waits for its default view, moves its "
             "main widget (the one the warm-up and the load test drag) to the next stop and back, then back and forth "
             "between the two: every answer timed is one whose results are stored. *Server CPU*: user + system CPU "
             "of the server process (`/proc/<pid>/stat`) over those answers, per answer; *wall*: the session's wait "
             "for each.", "",
             "| page | widget moved | server CPU per stored answer (s) | wall per answer (s) | messages | kB "
             "| goal | verdict |", "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for page, r in rows.items():
        ok = r["problem"] is None and r["cpu_s"] == r["cpu_s"] and r["cpu_s"] <= PAGE_ANSWER_GOAL_S
        moved = (f"{r['widget']}: {r['stops'][0]} ↔ {r['stops'][1]}" if r["widget"] else "none")
        cpu = fmt(r["cpu_s"], ".3f") + (f" ({r['problem']})" if r["problem"] else "")
        lines.append(f"| {page} | {moved} | {cpu} | {fmt(r['wall_s'], '.2f')} | {r['messages']:.0f} | "
                     f"{r['bytes'] / 1e3:.0f} | ≤ {PAGE_ANSWER_GOAL_S} s | {'met' if ok else '**MISSED**'} |")
    return "\n".join(lines)


def first_request_section(rows: dict, info: dict[str, str], before: dict | None = None) -> str:
    """A newly started server whose first request is a page's deep link (``bench_browser.measure_first_requests``):
    complete within the goal as served, and the warm-up's cost to that visitor. ``before``: an earlier run's
    {page: complete s as served}, shown beside this one."""
    from .bench_browser import FIRST_REQUEST_GOAL_S, FIRST_REQUEST_VIEWPORT, WARM_UP_SLOWDOWN

    width, height = FIRST_REQUEST_VIEWPORT
    lines = ["## A new server's first request is a page's deep link (headless Chromium)", "",
             f"`python -m posviz_tools.bench --first-request` on {time.strftime('%Y-%m-%d %H:%M')}, {info['CPU']}, "
             f"{info['cores']} cores. Per page, a newly started server (`streamlit run app.py`, healthy, nothing "
             "asked of it yet, its result store empty as on a fresh clone: `POSVIZ_STORE` a new empty folder) gets "
             f"the page's link as its very first request, in a new {width}x{height} browser tab. The server prepares "
             "itself before its health check answers (app.py: imports, a first forward pass of every shipped "
             "checkpoint); it computes no result a page shows. Runs before 2026-11-28 started on the store an "
             "earlier warm-up had filled, not a fresh clone's. *Complete*: the page script has finished and the "
             "browser has drawn it; medians of the repeats. *As served*: as the "
             "README starts it, so that first visit also starts the server's warm-up beside it; *alone*: "
             "`POSVIZ_WARM=0`, the page's own cold cost. Goals: complete as served "
             f"≤ {FIRST_REQUEST_GOAL_S:g} s; the warm-up slows it by at most {WARM_UP_SLOWDOWN - 1:.0%} "
             "(as served / alone).", ""]
    head = "| page | section |" + (" before: complete as served (s) |" if before else "") + \
        " complete as served (s) | first chart as served (s) | complete alone (s) | as served / alone | verdict |"
    lines += [head, "| --- | --- |" + (" ---: |" if before else "") + " ---: | ---: | ---: | ---: | --- |"]
    for page, r in rows.items():
        served, alone = r["served"][0], r["alone"][0]
        ratio = served / alone if alone else float("nan")
        ok = not r["exception"] and served <= FIRST_REQUEST_GOAL_S and ratio <= WARM_UP_SLOWDOWN
        lines.append(f"| {page}{' (exception on the page)' if r['exception'] else ''} | {r['section']} |"
                     + (f" {fmt((before or {}).get(page), '.2f')} |" if before else "")
                     + f" {served:.2f} | {r['served'][1]:.2f} | {alone:.2f} | {ratio:.2f}x | {verdict(ok)} |")
    return "\n".join(lines)
