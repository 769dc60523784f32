# Hugging Face Docker Space (see the YAML block at the top of README.md): the app on port 7860.
# torch==2.13.0 from requirements.lock (every package pinned, as make app and CI install them) is PyPI's Linux build, which runs on the CPU and uses a CUDA GPU
# when the Space has one (posviz.limits.default_device picks it). At run time only a published model a visitor
# picks from $POSVIZ_MODELS is downloaded (from the Hugging Face hub); the shipped checkpoints are in the image.
# Streamlit reads its settings (no file watcher, headless, no usage stats) from .streamlit/config.toml.
FROM python:3.11-slim

# POSVIZ_MODELS=proposed: the picker lists the published models the README proposes (GPT-2, OPT, Pythia,
# SmolLM2, Qwen2.5, BLOOM, Falcon) with their download sizes; none is downloaded until a visitor picks it, and
# offline a pick says the hub cannot be reached. A Space variable POSVIZ_MODELS replaces the list.
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/user \
    POSVIZ_MODELS=proposed

# The emoji font, so that page icons in the menu are drawn, not boxes (for a browser on the machine,
# e.g. screenshots taken in the image).
RUN apt-get update && apt-get install -y --no-install-recommends fonts-noto-color-emoji \
    && rm -rf /var/lib/apt/lists/*

# Spaces run the container as uid 1000.
RUN useradd --create-home --uid 1000 user
WORKDIR /home/user/app

# Dependencies first, so a code change does not reinstall them.
COPY requirements.lock ./
RUN pip install -r requirements.lock

COPY --chown=user app.py ./
COPY --chown=user menu.py ./
COPY --chown=user .streamlit ./.streamlit
COPY --chown=user views ./views
COPY --chown=user posviz ./posviz
COPY --chown=user models ./models

# Every page's default view computed once, here, into the result files (.posviz-store/, JSON + npz): the
# Space's first visitor, a talk's link on a restarted Space, gets them read back instead of computed (on the
# free CPU the labs' defaults took 10–25 s each). Built as the user the Space runs as, on the image's own
# files, so that the checkpoints' stamps in the keys are the ones the server sees. The Workshop's six examples
# are trained into its store of runs there too (about 3 minutes each), so a visitor's Train on one answers at once.
RUN chown user /home/user/app
USER user
RUN python -m views._build_store --defaults-only
EXPOSE 7860
CMD ["streamlit", "run", "app.py", "--server.port", "7860", "--server.address", "0.0.0.0"]
