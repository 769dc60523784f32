"""The app's own typeface for the slide PNG: Streamlit's Source Sans, cut from the file Streamlit serves.

Streamlit ships Source Sans 3 only as a variable WOFF2 (``static/static/media/SourceSansVF-Upright*.woff2``, one
``wght`` axis, 200-900). Vega's renderer (vl-convert 1.9's font database) reads neither WOFF2 nor a variable font's
axis: given the variable font as TrueType it drew every weight alike, as the default instance, ExtraLight 200
(measured on 2026-12-05: a title at weights 300, 400, 700 and 900 drew the same pixels). So, once a machine, fontTools (with Brotli, for WOFF2) decompresses it, keeps the scripts and
symbols a slide writes (Latin, Greek, Cyrillic, punctuation, arrows, mathematical operators: 668 of its 2,478
glyphs; a character outside them is drawn in another font, as one outside Source Sans always was) and cuts the two
weights a slide draws: 400 (text, tick labels) and 700 (Vega's bold: the title, axis and legend titles). About 8 s
on 2 cores, against 35-40 s for the whole font; each file is written aside, then renamed into place. The family
name is the file's own (its ``name`` table), never assumed. The renderer draws a character its font lacks as a box,
with no fallback to another font: a text with a character the cut does not hold (a visitor's Hebrew document named in
the settings line) is drawn in the fallback instead (``font_for``), the rest of the slide in Source Sans.

Where the file or fontTools is missing (another Streamlit release renamed it), the PNG falls back to the renderer's
"sans-serif" and ``slide_font_source`` says why; tests/test_slides.py fails there, so the change is seen.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import tempfile
import threading
from pathlib import Path

FALLBACK = "sans-serif"  # vl-convert's bundled Liberation Sans
STREAMLIT_FONT = "SourceSansVF-Upright*.woff2"  # where Streamlit's build puts its upright Source Sans
FOLDER_ENV = "POSVIZ_FONT_DIR"  # where the TrueType copy is kept (default: the system's temporary folder)

_lock = threading.Lock()
_found: tuple[str, str, frozenset] | None = None  # (family, where it came from or why not, the characters it draws)


def streamlit_font_file() -> Path | None:
    """Streamlit's upright Source Sans WOFF2, found without importing Streamlit (posviz never does)."""
    spec = importlib.util.find_spec("streamlit")
    if spec is None or not spec.submodule_search_locations:
        return None
    media = Path(spec.submodule_search_locations[0]) / "static" / "static" / "media"
    found = sorted(media.glob(STREAMLIT_FONT))
    return found[0] if found else None


# What a slide writes: Basic Latin to Latin Extended-B, Greek, Cyrillic, General Punctuation, super- and subscripts,
# currency, letterlike symbols, number forms, arrows, mathematical operators, geometric shapes
KEPT_CHARACTERS = [*range(0x20, 0x250), *range(0x370, 0x530), *range(0x2000, 0x2300), *range(0x25A0, 0x2600)]
WEIGHTS = (400, 700)  # Vega's "normal" and "bold"


def _static_copies(woff2: Path) -> tuple[Path, dict]:
    """The folder holding one TrueType file per weight in ``WEIGHTS`` cut from ``woff2``, and what it holds
    ({"family": its name, "characters": the code points it draws}); made once per version of the file."""
    stat = woff2.stat()
    digest = hashlib.sha1(f"{woff2.name}:{stat.st_size}:{stat.st_mtime_ns}:{WEIGHTS}".encode()).hexdigest()[:12]
    folder = Path(os.environ.get(FOLDER_ENV) or tempfile.gettempdir()) / f"posviz-font-{digest}"
    about = folder / "family.json"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".cutting", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes (a server's, a test worker's) cut it once: the second waits
        try:
            held = json.loads(about.read_text())
            if isinstance(held["family"], str) and isinstance(held["characters"], list):
                return folder, held
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return folder, _cut(woff2, folder, about)


def _cut(woff2: Path, folder: Path, about: Path) -> dict:
    """Cut ``woff2``'s weights into ``folder`` (the caller holds its lock); what they hold."""
    from fontTools import subset  # imported only the first time a machine draws a slide
    from fontTools.ttLib import TTFont
    from fontTools.varLib import instancer

    font = TTFont(str(woff2))
    family = font["name"].getDebugName(16) or font["name"].getDebugName(1)  # typographic family, else legacy
    options = subset.Options()
    options.name_IDs, options.notdef_outline = ["*"], True  # every name (the family read above stays)
    cutter = subset.Subsetter(options)
    cutter.populate(unicodes=KEPT_CHARACTERS)
    cutter.subset(font)
    font.flavor = None  # WOFF2 -> plain TrueType
    for weight in WEIGHTS:
        part = folder / f"{weight}.part-{os.getpid()}-{threading.get_ident()}"
        instancer.instantiateVariableFont(font, {"wght": weight}, inplace=False).save(str(part))
        os.replace(part, folder / f"SourceSans-{weight}.ttf")
    held = {"family": family, "characters": sorted(font.getBestCmap()), "weights": list(WEIGHTS), "from": str(woff2)}
    about.write_text(json.dumps(held))
    return held


def slide_font() -> str:
    """The font family every text of a slide PNG is drawn in: the app's Source Sans, registered with vl-convert
    (once a process), else ``FALLBACK``."""
    return _font()[0]


def font_for(text: str) -> str:
    """The slide font where it draws every character of ``text``, else ``FALLBACK``: the renderer draws a character
    its font lacks as an empty box, with no fallback to another font, and a visitor's text (a document's first words
    in the settings line) may be Hebrew or Arabic, which Liberation Sans draws and Source Sans does not."""
    family, _, characters = _font()
    return family if all(ord(c) in characters for c in text if not c.isspace()) else FALLBACK


def slide_font_source() -> str:
    """Where the slide font came from, or why the fallback is drawn."""
    return _font()[1]


def _font() -> tuple[str, str, frozenset]:
    global _found
    with _lock:
        if _found is None:
            woff2 = streamlit_font_file()
            if woff2 is None:
                _found = (FALLBACK, f"no {STREAMLIT_FONT} in the installed Streamlit's static files", frozenset())
            else:
                try:
                    import vl_convert as vlc

                    folder, held = _static_copies(woff2)
                    vlc.register_font_directory(str(folder))
                    _found = (held["family"], str(folder), frozenset(held["characters"]))
                except Exception as exc:  # no fontTools or Brotli, or a file or release it cannot read: the PNG still draws
                    _found = (FALLBACK, f"{woff2.name} could not be read as a font ({type(exc).__name__}: {exc})",
                              frozenset())
        return _found
