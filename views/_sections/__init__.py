"""Explore sections, drawn for whichever registered method offers them.

A position method names the extra sections it offers in its ``explore_sections`` (T5: ``"t5-buckets"``);
each name is drawn by the function registered here under it (``@section``), one module per section in
this package, imported on its own. A page asks ``sections_for(page)`` and draws them in their order, so
no page lists a method by name: a new method shows up through the pages' generic parts (its bias by
distance, its row in the tables), and through its own sections once it offers some. Sections marked
``always`` belong to the page itself (the Attention biases page's curves of every method) and are drawn
whatever the methods offer.

Every draw function takes the page's ``BiasPage`` (what the page-wide widgets set, and what earlier
sections hand on to later ones) and the name of the method that offered it.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Callable

import numpy as np


@dataclasses.dataclass
class BiasPage:
    """The Attention biases page as its sections see it."""

    n_keys: int  # visible keys n
    margin: float  # content margin in logits
    far: int  # distance of the relevant key
    grid: np.ndarray  # distances drawn
    no_bias: np.ndarray  # (n,) log bound without any bias
    train_length: int  # of the shipped checkpoints
    n_layer: int  # of the shipped checkpoints
    n_head: int  # of the shipped checkpoints
    summary: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # the side-by-side comparison
    summarised: set[str] = dataclasses.field(default_factory=set)  # methods a section put in the summary itself
    handed_on: dict[str, object] = dataclasses.field(default_factory=dict)  # from a section to later ones


@dataclasses.dataclass
class RopePage:
    """The RoPE page as its sections see it: the shipped rope checkpoint's facts (or the recipe's)."""

    train_length: int
    head_dim: int
    base: float


@dataclasses.dataclass
class ContentPage:
    """The Positions from content page as its sections see it: one layer of a checkpoint on a text."""

    view: object  # posviz.explore.content_positions.LayerView
    checkpoint: str
    layer: int
    head: int
    chars: list[str]  # the bytes shown, as characters
    key: tuple  # what the view depends on (for kept charts)


def show_head_bounds(page: "BiasPage", method: str, title: str, summary_label: str, log_weights: np.ndarray,
                     lenient: np.ndarray, key: tuple, name: str, caption: str) -> None:
    """A method's largest attention weight per head by distance, next to no bias, under ``title``; its most
    lenient head goes into the page's summary as ``summary_label`` (the method then needs no curve of its own
    there)."""
    import streamlit as st

    from posviz.explore import attention_biases
    from views._bias_charts import weight_chart
    from views._explore import chart

    heads = len(log_weights)
    page.summary[summary_label] = lenient
    page.summarised.add(method)
    st.markdown(f"**Largest weight per head: {title}, n = {page.n_keys:,} keys, margin Δ = {page.margin:g}**")

    def build():
        series = {f"head {h}": log_weights[h] for h in range(heads)}
        series["no bias"] = page.no_bias
        return weight_chart(attention_biases.max_weight_columns(series, page.grid), "head", page.n_keys, sort=list(series))

    chart("biases", key, build, name, caption)


@dataclasses.dataclass(frozen=True)
class Section:
    name: str
    page: str  # "biases", "rope" or "content"
    order: int  # place on its page, smallest first
    draw: Callable
    always: bool = False  # drawn whatever the methods offer (a part of the page itself)


SECTIONS: dict[str, Section] = {}


def section(name: str, page: str, order: int, always: bool = False):
    """Register the decorated ``draw(page, method)`` as the section ``name`` of ``page``."""
    def register(draw: Callable) -> Callable:
        SECTIONS[name] = Section(name, page, order, draw, always)
        return draw
    return register


def sections_for(page: str) -> list[tuple[Section, str | None]]:
    """(section, the method that offers it, None for the page's own) to draw on ``page``, in order.

    A section name a method offers but nobody registered is left out: the method's generic views
    still show."""
    from posviz.positions import POSITION_METHODS, method_names

    chosen: dict[str, tuple[Section, str | None]] = {s.name: (s, None) for s in SECTIONS.values()
                                                     if s.page == page and s.always}
    for method in method_names():
        for name in POSITION_METHODS[method].explore_sections:
            found = SECTIONS.get(name)
            if found is not None and found.page == page and name not in chosen:
                chosen[name] = (found, method)
    return sorted(chosen.values(), key=lambda pair: pair[0].order)


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")


_discover()
