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
# Imported by libraries on their first use inside a page, not when they are imported: pandas' Styler (0.5 s,
# the first styled table), Streamlit's emoji table (0.4 s, the first alert with an icon), Pillow's PNG writer
# (the first attention map), found by diffing sys.modules before and after every page's first run; and the
# corpus reader behind every lab's text picker.
FIRST_USE = ("pandas.io.formats.style", "streamlit.emojis", "PIL.Image", "PIL.PngImagePlugin", "PIL.ImageDraw",
             "PIL.ImageFont", "posviz.training.data")
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
    """Import what the pages import, validate one chart, read the validation documents, read and run every
    shipped checkpoint once; returns the seconds it took."""
    start = time.perf_counter()
    import altair as alt
    import pandas as pd
    import torch

    for name in [*_modules("posviz", ROOT / "posviz"), *_modules("views", ROOT / "views", helpers_only=True),
                 *FIRST_USE]:
        importlib.import_module(name)
    # the held-out validation documents every lab's text picker offers (reading the corpus: 1.7 s on 2 cores)
    from posviz.training.data import load_corpus

    try:
        load_corpus().eval_documents
    except (OSError, ValueError) as exc:  # the pages say what is wrong with the corpus, and go on
        print(f"posviz: the validation documents were not read ({type(exc).__name__})", flush=True)
    # Altair reads and compiles the Vega-Lite schema the first time a chart is validated
    alt.Chart(pd.DataFrame({"x": [0, 1], "y": [0.0, 1.0]})).mark_line().encode(x="x:Q", y="y:Q").to_dict()
    # torch's first forward pass (its kernels' first call), on a model made here: no checkpoint is read
    from posviz.config import ModelConfig
    from posviz.models.byte_gpt import GPT

    with torch.inference_mode():
        GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, train_length=16, position="rope"))(torch.zeros(1, 16, dtype=torch.long))
    opened = _open_shipped_checkpoints()
    seconds = time.perf_counter() - start
    print(f"posviz: server prepared in {seconds:.1f} s (imports, the chart schema, {opened} shipped checkpoints "
          "read and run once)", flush=True)
    return seconds


def _open_shipped_checkpoints() -> int:
    """Read every shipped checkpoint's weights and run each once on 16 bytes: a lab's first run otherwise read
    them and paid each method's first call (0.45 s and about 0.6 s for the 18 pretrained ones on 2 cores). The
    models are the ones the pages get (``open_model`` keeps them, ``CACHE_ENTRIES`` at most). A checkpoint
    that cannot be read is skipped here: the pages name it and say what to do."""
    import torch

    from posviz.errors import PosvizError
    from posviz.models.checkpoint_files import shipped_checkpoints
    from posviz.models.interface import open_model

    opened = 0
    for folder in shipped_checkpoints().values():
        try:
            model = open_model(str(folder))
            model(torch.zeros(1, 16, dtype=torch.long, device=model.device))
            opened += 1
        except (PosvizError, OSError, ValueError, RuntimeError) as exc:
            print(f"posviz: {folder} not prepared ({type(exc).__name__}); the pages will say why", flush=True)
    return opened
