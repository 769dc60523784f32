"""posviz: a visual explorer of positional encodings in transformers. Run: ``streamlit run app.py``.

The page scripts live in ``views/``, not ``pages/``: Streamlit treats a ``pages/`` folder beside the
entry script as a legacy multipage app until ``st.navigation`` has run once in the process, so a deep
link (``/rope?...``) as a newly started server's first request would run that file alone, outside
this menu and without the wide layout.
"""
import streamlit as st

from views._serving import visitor_run, warm_the_store
from views._slide import finish as finish_slide, install_widget_notes

st.set_page_config(page_title="posviz — positional encodings, visualised", page_icon="🧭", layout="wide")


def home_alias() -> None:
    """``/home`` (the Home page's name) opens the Home page, which Streamlit serves at ``/``."""
    st.switch_page("views/home.py", query_params=st.query_params.to_dict())


PAGES = {
    "Explore": [
        # url_path "": the default page is served at /, and "home" is left to the alias below
        st.Page("views/home.py", title="Home", icon="🏠", default=True, url_path=""),
        st.Page("views/sinusoidal_learned.py", title="Sinusoidal & learned", icon="🌊", url_path="absolute"),
        st.Page("views/rope.py", title="RoPE", icon="🔄", url_path="rope"),
        st.Page("views/attention_biases.py", title="Attention biases", icon="📐", url_path="biases"),
        st.Page("views/content_positions.py", title="Positions from content", icon="🧮", url_path="content"),
        st.Page(home_alias, title="Home", url_path="home", visibility="hidden"),
    ],
    "Live labs": [
        st.Page("views/extrapolation.py", title="Extrapolation lab", icon="📈", url_path="extrapolation"),
        st.Page("views/kv_cache.py", title="KV cache & sliding window", icon="🗄️", url_path="kv-cache"),
        st.Page("views/context_extension.py", title="Context extension", icon="🧵", url_path="context-extension"),
        st.Page("views/retrieval.py", title="Far-context retrieval", icon="🔎", url_path="retrieval"),
        st.Page("views/generation.py", title="Generation lab", icon="✍️", url_path="generation"),
        st.Page("views/compare.py", title="Compare", icon="⚖️", url_path="compare"),
    ],
    "Your method": [  # a visitor's own position method, trained on the server: not one of the shipped checkpoints
        st.Page("views/workshop.py", title="Workshop", icon="🛠️", url_path="workshop"),
    ],
    "About": [
        st.Page("views/about.py", title="Methods & checkpoints", icon="ℹ️", url_path="about"),
        st.Page("views/scoreboard.py", title="Scoreboard", icon="🏆", url_path="scoreboard"),
    ],
}

# What the server opens by itself, once, to have every default view ready: the labs first (their default
# views are the computations a visitor would wait for), then the rest.
# The Workshop is not warmed: a formula is drawn in a fraction of a second, and a training is each visitor's own.
WARM_ORDER = tuple(p.url_path for p in PAGES["Live labs"] + PAGES["Explore"] + PAGES["About"] if p.url_path != "home")

page = st.navigation(PAGES, expanded=True)  # every page listed: past ten, Streamlit folds the rest under "View more"
warm_the_store(WARM_ORDER)  # once per server, in the background, behind every visitor's computations
install_widget_notes()  # what each widget shows, noted for a slide's settings line (presentation mode only)
with visitor_run():  # the warm-up opens its next page only once no visitor's page is running or drawing
    try:
        page.run()
    finally:  # also after st.stop(): the slide states the settings its page was drawn at
        finish_slide()
