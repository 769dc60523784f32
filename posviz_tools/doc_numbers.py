"""Which measured numbers in a Markdown write-up have no source: ``python -m posviz_tools.doc_numbers FILE...``.

A measured number in docs/results.md or the README must be one of:

* a value span ``<!--v NAME-->shown<!--/v-->``, written from the data by ``posviz_tools.report`` (and held to
  it by a test);
* in a table that ``posviz_tools.report`` or ``posviz_tools.bench`` writes (those tables are compared whole);
* in a paragraph or list item that names the command measuring it (inline code that starts with
  ``python -m``, ``make``, ``git show``, ``bash`` or ``pytest``): it stands beside its command.

What counts as measured, read from the text alone: a number with a decimal point, a percentage, a time
(seconds, minutes, hours), a ratio written ``N×`` with a decimal point, and a count of checkpoints, methods or
models, in digits or in words. Settings (4×, 256 bytes, seed 1337, anything after ``=``), goals and bounds
(after ``≤``, ``≥``, ``<``, ``>``), an interval's confidence (95 % interval), versions (Python 3.11, GPT-2,
Llama 3) and years are not measurements and are left alone; so are the numbers inside inline code and links'
targets.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

COMMAND = re.compile(r"`(?:python3?\s+-m\s|\.venv/bin/python\s+-m\s|make\s|git\s+show\s|bash\s|pytest|CI=true\s)[^`]*`")
SPAN = re.compile(r"<!--v [^>]*?-->.*?<!--/v-->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
# versions and names with digits in them: not measurements
NAMES = re.compile(r"(?:Python|python|GPT|Llama|Qwen|Gemma|SmolLM\d*|Phi|H100|H200|v|fp|bf|int|Q\d_|L)[- ]?\d+(?:\.\d+)*"
                   r"|\b(?:19|20)\d\d\b|\d+(?:\.\d+)?(?:-[A-Za-z]+)?[A-Za-z_]*\d*[A-Za-z_]+\w*|[A-Za-z_]+\d+\w*")
# a setting, a goal or a bound (p = 0.25, ≤ 0.5, < 1 s) and an interval's confidence (95 % interval): not measured
SETTING = re.compile(r"(?:[=≤≥<>]|&lt;|&gt;)\s*[−-]?\d[\d,]*(?:\.\d+)?\s*(?:%|×|s\b|ms\b|M\b)?|\d+\s*%\s*(?=(?:paired\s+)?interval)")
COUNT_WORDS = ("two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
               "seventeen eighteen nineteen twenty").split()
MEASURED = re.compile(
    r"(?<![\w.])(?:\d[\d,]*\.\d+(?:\s*[–-]\s*\d[\d,]*(?:\.\d+)?)?\s*%?×?"  # a decimal (or a range of them)
    r"|\d[\d,]*(?:\s*[–-]\s*\d[\d,]*)?\s*%"  # a percentage
    r"|\d[\d,]*(?:\s*[–-]\s*\d[\d,]*)?\s*(?:s|ms|seconds?|minutes?|min|hours?|h)\b"  # a time
    r"|\d[\d,]*\s+(?:shipped\s+|other\s+|more\s+)?(?:checkpoints?|methods|models|fine-tunes)\b)"  # a count
    r"|\b(?:" + "|".join(COUNT_WORDS) + r")\s+(?:shipped\s+|other\s+)?(?:checkpoints|methods|models|fine-tunes)\b",
    re.I)


def blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph and list item of Markdown ``text``, outside code fences
    and tables (which the tools that write them compare whole)."""
    out, current, start, fenced = [], [], 0, False
    for n, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            line = ""
        item = re.match(r"\s*(?:[-*]|\d+\.)\s", line)
        if fenced or not stripped or stripped.startswith("|") or stripped.startswith("#") or item:
            if current:
                out.append((start, "\n".join(current)))
            current = []
            if item and not fenced:
                current, start = [line], n
            continue
        if not current:
            start = n
        current.append(line)
    if current:
        out.append((start, "\n".join(current)))
    return out


def unsourced(text: str) -> list[tuple[int, str, str]]:
    """(line, number, the block's first words) of every measured number of ``text`` that is neither a value span
    nor beside the command that measures it."""
    found = []
    for line, block in blocks(text):
        if COMMAND.search(block):
            continue
        bare = SPAN.sub(" ", block)
        bare = COMMENT.sub(" ", bare)
        bare = LINK_TARGET.sub("]", CODE.sub(" ", bare))
        bare = NAMES.sub(" ", bare)
        bare = SETTING.sub(" ", bare)
        for match in MEASURED.finditer(bare):
            found.append((line, match.group(0).strip(), " ".join(block.split())[:70]))
    return found


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    bad = 0
    for path in paths or ["docs/results.md", "README.md"]:
        for line, number, where in unsourced(Path(path).read_text()):
            print(f"{path}:{line}: {number!r} has no source (a value span, or the command beside it): {where}")
            bad += 1
    print(f"{bad} measured numbers without a source")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
