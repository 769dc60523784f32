"""Screenshots of every page for the README and for talks: ``make screenshots``.

``python -m posviz_tools.screenshots [--out docs/screenshots] [--width 1920 --height 1080] [--pages home rope]``
starts ``streamlit run app.py`` on 127.0.0.1 with the shipped checkpoints, opens every page of
app.py's menu in headless Chromium in presentation mode (``?present=1``: the page as a slide, its headline chart
large) at 1920×1080, waits until the page has run and its charts are drawn, and saves the slide as
``<out>/<url_path>.png``, the same slide at 1280×720 (the 1920×1080 layout drawn at 2/3 scale, as a browser zoomed
to fit shows it) as ``<out>/<url_path>-1280x720.png``, and the whole page
out of presentation mode (its main area, at most 6,000 px tall) as ``<out>/<url_path>-full.png`` (256-colour
PNGs: tens to a few hundred KB each). It also reads each page as
``posviz_tools.look`` does and reports anything cut off, any error box and any browser console error;
it exits with 1 when there is one, so a screenshot is never taken of a broken page unnoticed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .loadtest import (ROOT, StreamlitServer, app_pages, exception_texts, launch_chromium, screenshot_whole_main,
                       wait_rendered)
from .look import ConsoleWatch, look_at

OUT = ROOT / "docs" / "screenshots"
MAX_FULL_HEIGHT = 6000  # px: the whole-page shot of the longest pages stops here
# ``--published``: the shipped checkpoints exported to transformers (models/hf/) listed as published models,
# and each lab opened on an export beside its shipped original, saved as <out>/<url_path>-published.png.
PUBLISHED = "models/hf/rope-neox,models/hf/alibi-bloom,models/hf/learned-gpt2"
PUBLISHED_QUERIES = {
    "extrapolation": "models=rope,rope-neox,alibi,alibi-bloom&L=1024",
    "kv-cache": "models=rope,rope-neox,alibi,alibi-bloom",
    "context-extension": "base=rope-neox&refs=rope",
    "retrieval": "models=rope,rope-neox,alibi,alibi-bloom",
    "generation": "models=rope,rope-neox&decode=greedy",
    "compare": "a=rope&b=rope-neox",
    "rope": "", "absolute": "", "biases": "",
}


def save_png(raw: bytes, path: Path) -> int:
    """The screenshot as a 256-colour PNG (text and flat charts lose nothing visible); returns its size."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(raw)).convert("RGB")
    small = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, format="PNG", optimize=True)
    return path.stat().st_size


def take(out: Path, width: int, height: int, only: list[str] | None = None, models: str | None = None,
         published: bool = False) -> list[str]:
    """Screenshot every page; return the problems seen (empty when every page looked whole). ``published``:
    the pages of PUBLISHED_QUERIES with the exports listed and chosen beside their originals."""
    import os
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    pages = [p for p in app_pages() if (not only or p.url_path in only) and (not published or p.url_path in PUBLISHED_QUERIES)]
    problems = []
    env = {**os.environ, "POSVIZ_MODELS": PUBLISHED, "HF_HUB_OFFLINE": "1"} if published else None
    with StreamlitServer(models=models, env=env, log=ROOT / "test-output" / "server-screenshots.log") as server, \
            sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            for entry in pages:
                tab = browser.new_context(viewport={"width": width, "height": height}).new_page()
                tab.set_default_timeout(180_000)
                console = ConsoleWatch(tab)
                start = time.monotonic()
                query = PUBLISHED_QUERIES.get(entry.url_path, "") if published else ""
                tab.goto(server.url + entry.url + "?present=1" + (f"&{query}" if query else ""))
                wait_rendered(tab, 180_000, quiet_ms=1500)
                tab.wait_for_timeout(1000)  # charts draw after the script has finished
                name = f"{entry.url_path}-published" if published else entry.url_path
                size = save_png(tab.screenshot(), out / f"{name}.png")
                seen = look_at(tab, width, height)  # the whole page, not only what the window shows
                if not published:  # the same slide on a 1280×720 projector: the 1920×1080 layout at 2/3 scale
                    small = browser.new_context(viewport={"width": width, "height": height},
                                                device_scale_factor=1280 / width).new_page()
                    small.goto(tab.url)
                    wait_rendered(small, 180_000, quiet_ms=1500)
                    small.wait_for_timeout(1000)
                    size += save_png(small.screenshot(), out / f"{name}-1280x720.png")
                    small.context.close()
                # the whole page too (a lab's results are below its controls), at the same width, as a visitor opens it
                tab.goto(server.url + entry.url + "?present=0" + (f"&{query}" if query else ""))
                wait_rendered(tab, 180_000, quiet_ms=1500)
                size += save_png(screenshot_whole_main(tab, MAX_FULL_HEIGHT, settle_ms=1500),
                                 out / f"{name}-full.png")
                found = ([f"exception: {e[:200]}" for e in exception_texts(tab)]
                         + [f"error box: {e}" for e in seen.error_boxes] + seen.cut_off() + console.errors)
                print(f"{entry.url_path:>18}: {time.monotonic() - start:5.1f} s, {size / 1024:4.0f} KB, "
                      f"{seen.charts_with_data} chart(s) drawn" + (f"; {len(found)} problem(s)" if found else ""),
                      flush=True)
                problems += [f"{entry.url_path}: {p}" for p in found]
                tab.context.close()
        finally:
            browser.close()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--pages", nargs="*", help="url_path of the pages to take (default: all)")
    parser.add_argument("--models", default=None, help="checkpoint folder (default: $POSVIZ_CHECKPOINTS or models/)")
    parser.add_argument("--published", action="store_true",
                        help="the exports in models/hf beside their shipped originals, as <page>-published.png")
    args = parser.parse_args(argv)
    problems = take(args.out, args.width, args.height, args.pages, args.models, args.published)
    for problem in problems:
        print("  " + problem)
    print(f"screenshots in {args.out}" + (f"; {len(problems)} problem(s) above" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
