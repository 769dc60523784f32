"""What a new server does once, when it starts and before it answers anyone (``app.py``'s lifespan).

A page's first run on a new server used to pay for everything loaded for the first time: torch, pandas
and Altair imported (about 2.5 s on 2 cores), Altair's Vega-Lite schema read on the first chart, torch's
first forward pass. The first visitor after a talk's link is that page's first run, so the server pays
for them here instead, before its health check answers. Nothing here computes a result a page shows: the
result store stays as it was (empty on a fresh clone); filling it is the warm-up's work
(``_serving.warm_the_store``), which starts with the first visit.
"""
from __future__ import annotations

import importlib
import pkgutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Loaded on request only: a published model's libraries (transformers is ~3 s and 300 MB to import) and
# the command-line tools.
ON_REQUEST = ("posviz.models.hf", "posviz.train", "posviz.training", "posviz.evaluate", "posviz.evaluate_all")


def _modules(package: str, folder: Path, helpers_only: bool = False):
    """The modules of a package; ``helpers_only``: its ``_x`` modules and packages alone (views/: the pages
    themselves are scripts that draw when run, never imported)."""
    for info in pkgutil.walk_packages([str(folder)], prefix=package + "."):
        first = info.name.split(".")[1]
        if info.name.startswith(ON_REQUEST) or info.name.rsplit(".", 1)[-1].startswith("__"):
            continue
        if not helpers_only or (first.startswith("_") and not first.startswith("__")):
            yield info.name


def prepare_server() -> float:
    """Import what the pages import, draw one chart, run one forward pass; returns the seconds it took."""
    start = time.perf_counter()
    import altair as alt
    import pandas as pd
    import torch

    for name in [*_modules("posviz", ROOT / "posviz"), *_modules("views", ROOT / "views", helpers_only=True)]:
        importlib.import_module(name)
    # Altair reads and compiles the Vega-Lite schema the first time a chart is validated
    alt.Chart(pd.DataFrame({"x": [0, 1], "y": [0.0, 1.0]})).mark_line().encode(x="x:Q", y="y:Q").to_dict()
    # torch's first forward pass (its kernels' first call), on a model made here: no checkpoint is read
    from posviz.config import ModelConfig
    from posviz.models.byte_gpt import GPT

    with torch.inference_mode():
        GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, train_length=16, position="rope"))(torch.zeros(1, 16, dtype=torch.long))
    seconds = time.perf_counter() - start
    print(f"posviz: server prepared in {seconds:.1f} s (imports, the chart schema, a first forward pass)", flush=True)
    return seconds
