"""A visitor's words quoted on a page: every Markdown character escaped, so a formula, a label or a name is shown as
typed, never as emphasis, a link or an image. Its own module: the page's frame (``views._page``) and the slide
(``views._slide``) both quote, and neither imports the other's module for it."""
from __future__ import annotations

MARKDOWN_SPECIAL = "\\`*_{}[]()<>#+-.!|~:$"


def plain(text: str) -> str:
    """``text`` with every Markdown character escaped, for words that quote what a visitor typed (a formula's
    names, a string in it): shown as typed, never as emphasis, a link or an image."""
    return "".join("\\" + c if c in MARKDOWN_SPECIAL else c for c in str(text))
