"""posviz: a visual explorer of positional encodings in transformers. Run: ``streamlit run app.py``.

This file is the server: ``streamlit run app.py`` finds ``app`` (an ``st.App``) and serves the script
``menu.py`` (the navigation menu of every page) to each visitor. The server prepares itself once, when it
starts and before it answers anyone (``views/_startup.prepare_server``): the imports, Altair's schema and
torch's first forward pass cost a new server's first visitor about 3 s on 2 cores when they ran inside
that visitor's page instead (``python -m posviz_tools.bench --first-request``).
"""
from contextlib import asynccontextmanager

import streamlit as st


@asynccontextmanager
async def prepared(_app):
    from views._startup import prepare_server

    prepare_server()
    yield


app = st.App("menu.py", lifespan=prepared)
