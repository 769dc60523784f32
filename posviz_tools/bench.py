"""Speed table of posviz on this machine: ``python -m posviz_tools.bench`` (``make bench``, writes BENCHMARKS.md).

Everything is measured side by side in one run, so every number is a ratio against something
measured on the same machine at the same moment. The parts, by what they measure:

* ``bench_compute``: the models with no server: forward tokens/s against a GPT-2 peer and the matmul
  peak, attention-map extraction, cached decoding, one move of the Extrapolation lab's length slider;
* ``bench_browser``: pages in headless Chromium: first render on a warm server, cold first visits and
  new settings, the floors no page goes below, a new server's first request as a deep link;
* ``bench_protocol``: the server alone, with sessions that speak Streamlit's protocol and draw
  nothing: server CPU per stored answer, for the Extrapolation lab's slider and for every page;
* ``bench_report``: BENCHMARKS.md from what was measured: one row per goal, one section per measurement.

Goals (issues #5 and #6): forward >= the GPT-2 peer and >= 50% of matmul peak at 16 x train_length;
attention-map extraction <= 1.3 x; cache >= 10 x faster than re-encoding; one length change at
16 x train_length < 1 s; every page's first render < 3 s; server CPU per stored answer <= 0.1 s on
every page; a new server's first request (a deep link) complete <= 5 s, the warm-up slowing it by at
most 20 %. Misses are printed as misses.

Three measurements also run on their own and rewrite only their section of BENCHMARKS.md:
``--pages-cpu`` (server CPU per stored answer, every page), ``--first-request`` (a new server's
first request, every page or ``--page``) and ``--streaming`` (StreamingLLM's step against a plain cached
step, ``bench_streaming``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import bench_browser, bench_compute, bench_protocol, bench_streaming
from .bench_compute import MULTIPLES
from .bench_report import (first_request_section, kept_marked_sections, machine, marked, pages_cpu_section,
                           report, write_marked)

ROOT = Path(__file__).resolve().parent.parent


def _before(path: Path) -> dict[str, float]:
    """{page: complete s as served} from the first-request section already in ``path``, to show beside a new run."""
    import re

    text = path.read_text() if path.exists() else ""
    section = text.split("<!-- first-request: begin -->", 1)[-1].split("<!-- first-request: end -->", 1)[0]
    if "<!-- first-request: begin -->" not in text:
        return {}
    before = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 7 and re.fullmatch(r"\d+\.\d\d", cells[-5]):
            before[cells[0].split(" ")[0]] = float(cells[-5])
    return before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="posviz speed table; writes BENCHMARKS.md")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds spent timing each measurement")
    parser.add_argument("--matmul-n", type=int, default=2048)
    parser.add_argument("--cache-steps", type=int, default=64)
    parser.add_argument("--models", default=None, help="checkpoint folder for the page renders (default models/)")
    parser.add_argument("--no-pages", action="store_true", help="skip the browser page-render timings")
    parser.add_argument("--pages-cpu", action="store_true",
                        help="only the server CPU per stored answer of every page, into its section of --out")
    parser.add_argument("--first-request", action="store_true",
                        help="only a new server's first request (each page's deep link), into its section of --out")
    parser.add_argument("--streaming", action="store_true",
                        help="only StreamingLLM's step against a plain cached step, into its section of --out")
    parser.add_argument("--page", action="append", help="with --first-request: only this url path (repeatable)")
    parser.add_argument("--repeats", type=int, default=1, help="with --first-request: new servers per page and way")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    out = Path(args.out)

    info = machine()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    if args.streaming:
        models = bench_compute.bench_models()
        window = models["nope"][0].config.train_length
        rows = bench_streaming.measure(models, window, args.cache_steps)
        write_marked(out, "streaming", bench_streaming.section(rows, window, args.cache_steps, info))
        print(f"wrote {out}")
        return 0
    if args.pages_cpu or args.first_request:
        if args.pages_cpu:
            write_marked(out, "pages-cpu", pages_cpu_section(bench_protocol.measure_pages_cpu(args.models), info))
        if args.first_request:
            rows, problem = bench_browser.measure_first_requests(args.models, args.repeats, pages=args.page)
            if problem:
                print(problem, file=sys.stderr)
                return 1
            write_marked(out, "first-request", first_request_section(rows, info, _before(out)))
        print(f"wrote {out}")
        return 0

    peak = bench_compute.matmul_peak_flops(args.matmul_n, args.min_time)
    print(f"  matmul peak: {peak / 1e9:.1f} GFLOP/s", flush=True)
    models = bench_compute.bench_models()
    train_length = models["nope"][0].config.train_length
    peer, peer_label = bench_compute.gpt2_peer(models["nope"][0].config, max(MULTIPLES) * train_length)
    fwd, share, vs_peer = bench_compute.measure_forward(models, peer, train_length, args.min_time, peak)
    extraction = bench_compute.measure_extraction(models, train_length, args.min_time)
    cache = {w: bench_compute.measure_cache(models, w, args.cache_steps) for w in (train_length, 4 * train_length)}
    floors = {w: bench_compute.measure_decode_floor(models["nope"][0], w, args.cache_steps) for w in cache}
    changes = bench_compute.measure_length_change(models, train_length)
    shipped = {m: v for m, v in models.items() if v[1].startswith("models/")}
    lab = bench_compute.measure_lab_all_models(shipped, train_length) if shipped else None
    streaming = bench_streaming.measure(models, train_length, args.cache_steps)
    extra = [marked("streaming", bench_streaming.section(streaming, train_length, args.cache_steps, info))]
    # ^ sections also measured on their own, written between their markers
    if args.no_pages:
        renders, cold, render_problem, warmup = {}, None, "not measured (--no-pages)", None
        visits, visits_problem = {}, "not measured (--no-pages)"
        floor, floor_problem = {}, "not measured (--no-pages)"
        session_floor = slider_answer = None
    else:
        floor, floor_problem = bench_browser.measure_cold_floor()
        session_floor = bench_browser.measure_new_session_floor()
        visits, visits_problem = bench_browser.measure_cold_visits(args.models)
        renders, cold, render_problem, warmup = bench_browser.measure_first_render(args.models)
        slider_answer = bench_protocol.measure_slider_answer(args.models)
        extra.append(marked("pages-cpu", pages_cpu_section(bench_protocol.measure_pages_cpu(args.models), info)))
        rows, problem = bench_browser.measure_first_requests(args.models)
        if not problem:
            extra.append(marked("first-request", first_request_section(rows, info, _before(out))))
    text = report(args, info, peak, models, peer_label, fwd, share, vs_peer, extraction, cache, changes, renders, cold,
                  render_problem, visits, visits_problem, lab, floor, floor_problem, floors, session_floor, warmup,
                  slider_answer)
    text = "\n\n".join([text.rstrip(), *extra]) + "\n"
    out.write_text(kept_marked_sections(out.read_text() if out.exists() else "", text))
    print("\n" + text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
