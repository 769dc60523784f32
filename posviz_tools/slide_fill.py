"""How much of a slide's PNG its chart fills, per page: ``python -m posviz_tools.slide_fill [--pages rope compare]``.

Each page runs in presentation mode (Streamlit's AppTest, the shipped checkpoints, ``?present=1``); its slide's PNG
is drawn as the "PNG 1920×1080" and "PNG 1280×720" buttons draw it (``views._slide._png_now``), and measured: the
box of every non-white pixel below the slide's head (title and settings line), as a share of the canvas's width
and of the height below the head. The goal (issue #72): at least 75 % of the width and 70 % of that height.
Prints a Markdown table; ``--out FOLDER`` also writes each PNG into that folder.
"""
from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GOAL_WIDTH, GOAL_HEIGHT = 0.75, 0.70
SIZES = ((1920, 1080), (1280, 720))


def filled(png: bytes, head_height: int) -> tuple[float, float]:
    """(share of the width, share of the height below ``head_height``) that the non-white pixels below the head
    span."""
    from PIL import Image

    picture = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    body = picture[head_height:] < 245
    rows, cols = np.flatnonzero(body.any(1)), np.flatnonzero(body.any(0))
    if not rows.size:
        return 0.0, 0.0
    return (cols[-1] - cols[0] + 1) / picture.shape[1], (rows[-1] - rows[0] + 1) / body.shape[0]


def page_slide(page: str, query: dict | None = None):
    """(specs, run, sentence) of the slide ``views/<page>.py`` draws in presentation mode, as its PNG buttons get
    them; None when the page draws no chart."""
    from streamlit.testing.v1 import AppTest

    import views._slide as slide

    caught = {}
    original = slide.offer_png

    def catch(specs, name, sentence):
        caught.update(specs=specs, run=slide.current(), sentence=sentence, name=name)
        original(specs, name, sentence)

    slide.offer_png = catch
    try:
        at = AppTest.from_file(str(ROOT / "menu.py"), default_timeout=600)  # the app, its menu and settings notes
        at.run()
        at.switch_page(f"views/{page}.py")
        at.query_params = {"present": "1", **(query or {})}
        at.run()
    finally:
        slide.offer_png = original
    if at.exception:
        raise RuntimeError(f"{page}: {[e.value for e in at.exception]}")
    return (caught["specs"], caught["run"], caught["sentence"]) if caught else None


def measure(pages: list[str], out: Path | None = None) -> list[dict]:
    from posviz.slides import head_height
    import views._slide as slide

    slide.install_widget_notes()
    rows = []
    for page in pages:
        got = page_slide(page)
        if got is None:
            continue
        specs, run, sentence = got
        for width, height in SIZES:
            png = slide._png_now(specs, run, sentence, width, height)
            w, h = filled(png, head_height(run.title, slide.settings_of(run), width))
            rows.append({"page": page, "size": f"{width}×{height}", "width": w, "height": h})
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{page}-{width}x{height}.png").write_bytes(png)
    return rows


def main(argv=None) -> int:
    from posviz_tools.loadtest import app_pages

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", nargs="*", help="script stems in views/ (default: every page of the menu)")
    ap.add_argument("--out", type=Path, help="a folder for the PNGs")
    args = ap.parse_args(argv)
    pages = args.pages or [Path(p.script).stem for p in app_pages()]
    rows = measure(pages, args.out)
    print("| page | PNG | width filled | height filled below the head |\n| --- | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['page']} | {r['size']} | {r['width']:.0%} | {r['height']:.0%} |")
    short = [r for r in rows if r["width"] < GOAL_WIDTH or r["height"] < GOAL_HEIGHT]
    print(f"{len(rows) - len(short)} of {len(rows)} PNGs meet {GOAL_WIDTH:.0%} × {GOAL_HEIGHT:.0%}")
    return 1 if short else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
