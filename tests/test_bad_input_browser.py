"""Bad input, as a visitor (or a shared link) would give it, against the real server in Chromium.

Each case must end in a clear message on the page, and the app must keep serving: the health
endpoint answers and another page renders. Covered: empty text, 10 MB of text, control and binary
bytes, emoji and right-to-left text, an XSS payload pasted as text, lengths 0 / negative / past the
cap / past the learned table, a missing checkpoint folder, and damaged checkpoints (truncated safetensors, a config with an unknown key, a missing
weights file, metrics that are not JSON). 10 MB of text runs through Streamlit's AppTest (a real
textarea costs Chromium minutes of layout first), and invalid UTF-8, which no widget can deliver,
through the text preparation every lab uses. Junk in every URL query parameter of every page is
checked in test_browser.py, on the tab that has just rendered that page (it knows the page's parameters).
"""
from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from browser_support import (MAIN, OUTPUT, ROOT, StreamlitServer, alert_texts, app_pages, assert_no_script_ran,  # noqa: F401
                             assert_serving, browser, exception_texts, main_text, new_tab, protocol_visit,
                             wait_for_change, wait_rendered)
from posviz.limits import MAX_TEXT_BYTES

pytestmark = pytest.mark.browser
PAGES = app_pages()
LAB = next(p.url for p in PAGES if p.url_path == "extrapolation")
FILLER = "def add(x, y):\n    return x + y\n\n\nclass Point:\n    x: int = 0\n    y: int = 0\n\n" * 4
XSS = ["<img src=x onerror=window.__xss=1>", "<script>window.__xss=1</script>"]


# What a bad input does is the same whatever the checkpoints, so these servers hold a few of the tiny ones: each paste
# and each page is scored by 3 checkpoints rather than the Extrapolation lab's 7 (every page on the whole set is
# test_browser.py's). learned has a table to run past; alibi and rope are the others that keep running.
FEW = ("learned", "alibi", "rope")


def few_models(tiny_models_dir: Path, target: Path, names=FEW) -> Path:
    import shutil

    for name in names:
        shutil.copytree(tiny_models_dir / name, target / name)
    return target


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    models = few_models(tiny_models_dir, tmp_path_factory.mktemp("few") / "models")
    with StreamlitServer(models=models, log=OUTPUT / "server-bad-input.log") as server:
        yield server


@pytest.fixture(scope="module")
def paste_tab(browser, server):
    """One tab on the lab's paste box for the texts below: each paste replaces the last, as a visitor trying several
    does, and a new tab per text was a page load (5 s of Chromium's CPU) that checked nothing about the text."""
    tab = open_page(browser, server, LAB, {"src": "paste"})
    yield tab
    tab.close()


def open_page(browser, server, path: str, query: dict | None = None):
    tab = new_tab(browser)
    tab.goto(server.url + path + ("?" + urllib.parse.urlencode(query) if query else ""))
    wait_rendered(tab)
    return tab


SET_TEXTAREA = """(text) => {
    // What a paste does: set the value through the native setter, then tell React with an input event.
    const box = document.querySelector('[data-testid="stMain"] textarea');
    box.focus();
    Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, "value").set.call(box, text);
    box.dispatchEvent(new Event("input", {bubbles: true}));
}"""


def paste(tab, text: str) -> str:
    """Put ``text`` into the lab's paste box and submit it (Ctrl+Enter); return the new main text.

    Short texts are typed with Playwright's fill; long ones are pasted in one input event, as a
    person would (fill types them one by one).
    """
    before = (tab.url, main_text(tab))
    box = tab.locator(f"{MAIN} textarea").first
    if len(text) < 10_000:
        box.fill(text)
    else:
        box.wait_for(state="visible")  # evaluate, unlike fill, does not wait for the box
        tab.evaluate(SET_TEXTAREA, text)
    box.press("Control+Enter")
    return wait_for_change(tab, before)[1]


def assert_no_exception(tab, what: str) -> None:
    assert not exception_texts(tab), f"{what}: {exception_texts(tab)}"


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------
def test_empty_and_blank_text_say_what_to_do(browser, server):
    tab = open_page(browser, server, LAB, {"src": "paste"})
    try:
        assert_no_exception(tab, "empty paste box")
        assert any("empty" in a.lower() for a in alert_texts(tab)), alert_texts(tab)
        paste(tab, "x" * 10)
        text = paste(tab, "   \n\t  \n")
        assert_no_exception(tab, "blank text")
        assert any("empty" in a.lower() and "paste" in a.lower() for a in alert_texts(tab)), text
    finally:
        tab.close()
    assert_serving(server)


def test_text_past_the_cap_is_cut_with_a_notice(paste_tab, server):
    """Just past the cap, through the browser's websocket; 10 MB is checked below with AppTest.

    (10 MB in a real textarea costs Chromium itself a minute or two of layout, before the
    server sees a byte, so it is not worth the suite's time here.)
    """
    tab = paste_tab
    size = MAX_TEXT_BYTES + 4096
    paste(tab, (FILLER * (size // len(FILLER) + 1))[:size])
    assert_no_exception(tab, "text past the cap")
    notices = " ".join(alert_texts(tab))
    assert f"{size:,} bytes" in notices and f"{MAX_TEXT_BYTES:,}" in notices, notices
    assert "Bits per byte at" in main_text(tab)
    assert_serving(server)


def test_control_bytes_and_lone_surrogates_are_scored_with_a_notice(paste_tab, server):
    tab = paste_tab
    paste(tab, "\x00\x01\x02\x1b[31m\x7f\ud800 binary-looking bytes\n" + FILLER)
    assert_no_exception(tab, "control bytes")
    assert any("control" in a for a in alert_texts(tab)), alert_texts(tab)
    assert "Bits per byte at" in main_text(tab), "the lab did not score the text"
    assert_serving(server)


def test_emoji_and_right_to_left_text_are_scored_and_shown(paste_tab, server):
    sample = "שלום עולם 🙂👍🏽 مرحبا بالعالم 🇺🇦 e\u0301 "
    tab = paste_tab
    shown = paste(tab, sample * 12 + FILLER)
    assert_no_exception(tab, "emoji / RTL")
    assert "Bits per byte at" in shown
    for piece in ("שלום", "🙂", "مرحبا"):
        assert piece in shown, f"{piece!r} not shown in the coloured text"
    assert_serving(server)


@pytest.mark.parametrize("payload", XSS, ids=["img-onerror", "script"])
def test_xss_payload_pasted_into_the_lab_is_shown_as_text(paste_tab, server, payload):
    tab = paste_tab
    shown = paste(tab, (payload + "\n") * 3 + FILLER)
    assert_no_exception(tab, "XSS paste")
    assert_no_script_ran(tab)
    assert payload in shown, "the payload is not shown as literal text"
    assert_serving(server)


# ---------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", ["0", "-256", "999999999"])
def test_length_out_of_range_in_the_link_falls_back_with_a_notice(server, length):
    """The server's answer to the link (its protocol; a junk link drawn in Chromium is test_browser.py's)."""
    answer = protocol_visit(server, LAB.lstrip("/"), urllib.parse.urlencode({"L": length}))
    assert answer.ok, f"L={length}: {answer.status} {answer.exceptions}"
    assert any("L=" in t and "Ignored" in t for t in answer.texts), answer.texts
    assert any("Bits per byte at" in t for t in answer.texts), "the lab did not fall back to its default length"


def test_learned_past_its_table_says_why_and_the_others_still_run(browser, server, tiny_models_dir):
    train_length = json.loads((tiny_models_dir / "learned" / "config.json").read_text())["model"]["train_length"]
    tab = open_page(browser, server, LAB, {"L": str(4 * train_length)})
    try:
        assert_no_exception(tab, "learned past its length")
        errors = [a for a in alert_texts(tab) if "learned" in a]
        assert errors and f"{train_length:,} rows" in errors[0], alert_texts(tab)
        assert "cannot run" in main_text(tab)
        # the others' numbers, once drawn (a fresh server may still be drawing them when the error box shows)
        tab.wait_for_function("""() => [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stMetricValue"]')]
                                   .filter(e => /^[0-9]+[.][0-9]+$/.test(e.innerText.trim())).length >= 2""",
                              timeout=60_000)
        metrics = tab.locator(f'{MAIN} [data-testid="stMetricValue"]').all_inner_texts()
        assert sum(v.replace(".", "", 1).isdigit() for v in metrics) >= 2, f"other checkpoints did not run: {metrics}"
    finally:
        tab.close()
    assert_serving(server)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------
def visit_every_page(browser, server, check) -> None:
    """Every page as the server answers a new visitor (its protocol: no exception, something written), then the
    lab, whose message ``check(alerts, shown)`` reads, in a browser tab as a visitor sees it. The server's answer is
    what bad checkpoints can break; drawing all 14 pages in Chromium (4-5 s each) checked nothing more about them."""
    for entry in PAGES:
        answer = protocol_visit(server, entry.url.lstrip("/"))
        assert answer.ok, f"{entry.title}: {answer.status} {answer.exceptions}"
        assert answer.texts, f"{entry.title} rendered nothing"
        if entry.url == LAB:
            check(" ".join(answer.texts), " ".join(answer.texts))  # the answer's texts: alerts and the rest together
    tab = new_tab(browser)
    try:
        tab.goto(server.url + LAB)
        wait_rendered(tab)
        assert_no_exception(tab, "the lab")
        check(" ".join(alert_texts(tab)), main_text(tab))
    finally:
        tab.close()


def test_missing_checkpoint_folder(browser, tmp_path):
    def check(alerts: str, shown: str):
        assert "make checkpoints" in alerts, alerts[:800]

    with StreamlitServer(models=tmp_path / "no-such-models", log=OUTPUT / "server-missing-models.log") as server:
        visit_every_page(browser, server, check)
        assert server.healthy()


def damage(models: Path) -> dict[str, str]:
    """Break four checkpoints four ways; return {method: words the message must contain}."""
    weights = models / "rope" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    config_path = models / "alibi" / "config.json"
    config = json.loads(config_path.read_text())
    config["model"]["max_distnace"] = 128  # the typo the strict configs exist for
    config_path.write_text(json.dumps(config))
    (models / "t5" / "model.safetensors").unlink()
    (models / "shaw" / "metrics.json").write_text("{not json")
    return {"rope": "truncated or corrupt", "alibi": "max_distnace", "t5": "missing"}


def test_damaged_checkpoints_are_named_and_the_rest_keep_working(browser, tiny_models_dir, tmp_path):
    # the four damaged ones and two that must keep working (nope and learned: the lab's first view holds both)
    models = few_models(tiny_models_dir, tmp_path / "models", ("rope", "alibi", "t5", "shaw", "nope", "learned"))
    expected = damage(models)

    def check(alerts: str, shown: str):
        for method, words in expected.items():
            assert method in alerts and words in alerts, f"no clear message for {method}: {alerts[:800]}"
        assert "Bits per byte at" in shown, "the undamaged checkpoints stopped working"

    with StreamlitServer(models=models, log=OUTPUT / "server-damaged-models.log") as server:
        visit_every_page(browser, server, check)
        assert_serving(server)


# ---------------------------------------------------------------------------------------------
# Through Streamlit's AppTest: raw bytes a browser cannot send, and 10 MB without a browser's layout cost
# ---------------------------------------------------------------------------------------------
def lab_with_pasted_text(text: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "views" / "extrapolation.py"), default_timeout=60)
    at.query_params["src"] = "paste"
    at.run()
    at.text_area(key="w_paste").input(text).run()
    assert not at.exception, at.exception
    return at


def test_ten_megabytes_of_text_is_cut_to_the_cap_with_a_notice(tiny_models):
    at = lab_with_pasted_text((FILLER * (10_000_000 // len(FILLER) + 1))[:10_000_000])
    notices = [i.value for i in at.info]
    assert any("10,000,000 bytes" in n and f"{MAX_TEXT_BYTES:,}" in n for n in notices), notices
    assert any("Bits per byte at" in s.value for s in at.subheader)


def test_invalid_utf8_bytes_are_scored_with_a_notice():
    """No widget can deliver invalid UTF-8 (browsers, and AppTest, send valid Unicode only), so the
    bytes go straight to the function every lab passes its text through, and to the display helper."""
    from posviz.labs.inputs import characters_with_bits, prepare_text

    raw = b"\xff\xfe\x80 not utf-8 \xc3\x28 \x00\x01" + FILLER.encode()
    text = prepare_text(raw)
    assert text.as_bytes() == raw, "the bytes must be scored as they are"
    assert any("not valid UTF-8" in n for n in text.notices) and any("control" in n for n in text.notices)
    shown = characters_with_bits(text.ids, np.zeros(len(raw)))
    assert "".join(c for c, _ in shown[:3]) == "\ufffd" * 3 and len(shown) <= len(raw)
