"""posviz: a visual explorer of positional encodings in transformers. Run: ``streamlit run app.py``."""
import streamlit as st

st.set_page_config(page_title="posviz — positional encodings, visualised", page_icon="🧭", layout="wide")

PAGES = {
    "Explore": [
        st.Page("pages/home.py", title="Home", icon="🏠", default=True, url_path="home"),
        st.Page("pages/sinusoidal_learned.py", title="Sinusoidal & learned", icon="🌊", url_path="absolute"),
        st.Page("pages/rope.py", title="RoPE", icon="🔄", url_path="rope"),
        st.Page("pages/attention_biases.py", title="Attention biases", icon="📐", url_path="biases"),
    ],
    "Live labs": [
        st.Page("pages/extrapolation.py", title="Extrapolation lab", icon="📈", url_path="extrapolation"),
        st.Page("pages/kv_cache.py", title="KV cache & sliding window", icon="🗄️", url_path="kv-cache"),
        st.Page("pages/context_extension.py", title="Context extension", icon="🧵", url_path="context-extension"),
        st.Page("pages/retrieval.py", title="Far-context retrieval", icon="🔎", url_path="retrieval"),
        st.Page("pages/generation.py", title="Generation lab", icon="✍️", url_path="generation"),
        st.Page("pages/compare.py", title="Compare", icon="⚖️", url_path="compare"),
    ],
    "About": [
        st.Page("pages/about.py", title="Methods & checkpoints", icon="ℹ️", url_path="about"),
    ],
}

page = st.navigation(PAGES)
page.run()
