"""AppTest tests of the explore pages' sections on published models ($POSVIZ_MODELS): the learned tables
of GPT-2 and OPT, the frequencies of RoPE models under their own scaling, the ALiBi slopes of BLOOM and
Falcon. The numbers shown are checked against the model (``model.position``, its safetensors file) and
against numpy; a listed model that cannot be opened gives an error box and the rest of the page works.

The pages run without shipped checkpoints (an empty models folder): their own sections then show a
notice, and these tests do not wait for the tiny checkpoints to be built.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from hf_tiny import Family, _save, save_pickle_only
from posviz.models.interface import open_model
from test_pages_explore import ABSOLUTE, BIASES, ROPE, assert_clean, frame_with, metric, open_page

SECTIONS = {ABSOLUTE: "Learned tables of published models", ROPE: "Frequencies of published RoPE models",
            BIASES: "ALiBi in published models"}


@pytest.fixture()
def no_checkpoints(tmp_path, monkeypatch) -> None:
    empty = tmp_path / "no-checkpoints"
    empty.mkdir()
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(empty))


@pytest.fixture(scope="module")
def long_gpt2(tmp_path_factory) -> Path:
    """A tiny GPT-2 with GPT-2's own 1,024 positions: its similarity matrix is drawn pooled."""
    spec = Family("GPT2Config", dict(n_positions=1024, n_embd=32, n_layer=2, n_head=4), "learned", context=1024, seed=11)
    return _save(spec, tmp_path_factory.mktemp("published") / "gpt2-1024")


def list_models(monkeypatch, *refs) -> None:
    monkeypatch.setenv("POSVIZ_MODELS", ",".join(str(ref) for ref in refs))


def errors(at) -> list[str]:
    return [e.value for e in at.error]


def texts(elements) -> str:
    return "\n".join(e.value for e in elements)


def cosine_by_hand(table: np.ndarray) -> np.ndarray:
    norms = np.sqrt((table ** 2).sum(axis=1))
    return (table @ table.T) / np.outer(norms, norms)


def check_learned_section(at, table: np.ndarray) -> None:
    """The section's cosine heatmap and principal components are those of ``table`` (rows, C), by numpy."""
    heat = frame_with(at, "row", "col", "value", spec_has='"title": "cosine similarity"')
    shown = heat.pivot(index="row", columns="col", values="value").to_numpy()
    np.testing.assert_allclose(shown, cosine_by_hand(table), atol=1e-6)
    u, s, _ = np.linalg.svd(table - table.mean(axis=0), full_matrices=False)
    shares = s ** 2 / (s ** 2).sum()
    lines = frame_with(at, "position", "component", "value")
    for j in range(4):
        label = f"PC {j + 1} ({shares[j]:.0%} of variance)"
        got = lines[lines["component"] == label].sort_values("position")["value"].to_numpy()
        expected = u[:, j] * s[j]
        assert len(got) == table.shape[0], label
        assert np.allclose(got, expected, atol=1e-4) or np.allclose(got, -expected, atol=1e-4), label
    assert metric(at, "variance along the first 4 PCs") == f"{shares[:4].sum():.0%}"
    assert metric(at, "positions × width") == f"{table.shape[0]:,} × {table.shape[1]}"


def test_published_learned_tables(hf_family_dir, long_gpt2, tmp_path, no_checkpoints, monkeypatch):
    pickled = save_pickle_only(tmp_path / "gpt2-pickle")
    list_models(monkeypatch, hf_family_dir["gpt2"], hf_family_dir["opt"], hf_family_dir["neox"], tmp_path / "missing",
                pickled, long_gpt2)
    at = open_page(ABSOLUTE)
    assert SECTIONS[ABSOLUTE] in [h.value for h in at.header]
    assert len(errors(at)) == 1 and "'" + str(tmp_path / "missing") + "' cannot be opened" in errors(at)[0]
    assert at.selectbox(key="pub").options == ["gpt2", "opt", "gpt2-pickle", "gpt2-1024"]
    assert "neox (rope: on the RoPE page)" in texts(at.caption)
    check_learned_section(at, open_model(hf_family_dir["gpt2"]).position.table.double().numpy())
    assert float(metric(at, "max |PE(p+k)")) < 1e-12  # the rest of the page as before

    at.selectbox(key="pub").set_value("opt").run()
    assert_clean(at)
    assert "2 rows before position 0" in texts(at.info) and at.query_params["pub"] == "opt"
    raw = load_file(str(hf_family_dir["opt"] / "model.safetensors"))["model.decoder.embed_positions.weight"]
    check_learned_section(at, raw[2:].double().numpy())  # position 0 is row 2 of OPT's table

    at.selectbox(key="pub").set_value("gpt2-1024").run()
    assert_clean(at)
    captions = [c for image in at.image for c in image.captions]
    assert len(captions) == 1 and "0–1,023" in captions[0] and "each pixel averages 2×2 entries" in captions[0]
    assert metric(at, "positions × width") == "1,024 × 32"

    at.selectbox(key="pub").set_value("gpt2-pickle").run()
    assert_clean(at)
    assert len(errors(at)) == 2 and "'gpt2-pickle' cannot be shown" in errors(at)[1] and "safetensors" in errors(at)[1]
    assert float(metric(at, "max |PE(p+k)")) < 1e-12


def test_published_rope_frequencies(hf_family_dir, tmp_path, no_checkpoints, monkeypatch):
    list_models(monkeypatch, hf_family_dir["neox"], hf_family_dir["llama3"], hf_family_dir["bloom"], tmp_path / "missing")
    at = open_page(ROPE)
    assert SECTIONS[ROPE] in [h.value for h in at.header]
    assert len(errors(at)) == 1 and "cannot be opened" in errors(at)[0]
    assert at.selectbox(key="pub").options == ["neox", "llama3"]
    assert "bloom (alibi: on the Attention biases page)" in texts(at.caption)
    assert metric(at, "rotary share of each head") == "25%" and metric(at, "θ (base)") == "10,000"
    assert metric(at, "scaling") == "none"
    assert "Only 4 of each head's 16 dimensions rotate" in texts(at.info)
    lines = frame_with(at, "series", "pair", "wavelength", "band")
    neox = open_model(hf_family_dir["neox"]).position
    own = lines[lines["series"].str.startswith("neox")].sort_values("pair")
    plain = lines[lines["series"].str.startswith("plain θ")].sort_values("pair")
    np.testing.assert_allclose(own["wavelength"], 2 * math.pi / neox.inv_freq.numpy())
    np.testing.assert_allclose(plain["wavelength"], [2 * math.pi / 10000.0 ** (-2 * i / 4) for i in range(2)])

    at.selectbox(key="pub").set_value("llama3").run()
    assert_clean(at)
    assert metric(at, "scaling") == "llama3, factor 8" and metric(at, "rotary share of each head") == "100%"
    assert metric(at, "θ (base)") == "100,000" and at.query_params["pub"] == "llama3"
    lines = frame_with(at, "series", "pair", "wavelength", "band")
    llama = open_model(hf_family_dir["llama3"]).position
    own = lines[lines["series"].str.startswith("llama3")].sort_values("pair")
    plain = lines[lines["series"].str.startswith("plain θ")].sort_values("pair")
    np.testing.assert_allclose(own["wavelength"], 2 * math.pi / llama.inv_freq.numpy())
    plain_wavelength = np.array([2 * math.pi / 1e5 ** (-2 * i / 16) for i in range(8)])
    np.testing.assert_allclose(plain["wavelength"], plain_wavelength)
    # Llama 3's rule: under 32/4 tokens kept, over 32/1 stretched by 8, smoothed in between
    bands = np.where(plain_wavelength < 8, "as θ gives", np.where(plain_wavelength > 32, "stretched ×8", "in between"))
    assert list(own["band"]) == list(bands) and len(set(bands)) == 3
    for y, label in ((64, "trained context 64"), (32, "original context 32")):
        assert list(frame_with(at, "y", "label", where=lambda f: label in set(f["label"]))["y"]) == [y]


def test_published_layer_layouts(hf_family_dir, tmp_path, no_checkpoints, monkeypatch):
    """Gemma 3's local and global layers with their two bases, SmolLM3's NoPE layer: drawn from their configs."""
    list_models(monkeypatch, hf_family_dir["gemma3"], hf_family_dir["smollm3"])
    at = open_page(ROPE)
    layout = frame_with(at, "layer", "label", "sinks")
    assert list(layout["label"]) == ["RoPE · θ 10k · W 16", "RoPE · θ 1M · full"]  # methods by display name
    at.selectbox(key="pub").set_value("smollm3").run()
    assert_clean(at)
    assert list(frame_with(at, "layer", "label", "sinks")["label"]) == ["RoPE · θ 5M · full", "NoPE · full"]


def test_published_alibi_slopes(hf_family_dir, tmp_path, no_checkpoints, monkeypatch):
    list_models(monkeypatch, hf_family_dir["bloom"], hf_family_dir["falcon"], hf_family_dir["gpt2"], tmp_path / "missing")
    at = open_page(BIASES)
    assert SECTIONS[BIASES] in [h.value for h in at.header]
    assert len(errors(at)) == 1 and "cannot be opened" in errors(at)[0]
    assert at.selectbox(key="pub").options == ["bloom", "falcon"]
    assert "gpt2 (learned: on the Sinusoidal & learned page)" in texts(at.caption)
    paper = np.array([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])  # the ALiBi paper's slopes for 4 heads

    def bars() -> tuple[np.ndarray, np.ndarray]:
        frame = frame_with(at, "series", "head", "slope", "ratio")
        own = frame[~frame["series"].str.startswith("ALiBi paper")].sort_values("head")["slope"].to_numpy()
        return own, frame[frame["series"] == "ALiBi paper, 4 heads"].sort_values("head")["slope"].to_numpy()

    own, shown_paper = bars()
    np.testing.assert_allclose(shown_paper, paper, rtol=1e-6)
    np.testing.assert_allclose(own, open_model(hf_family_dir["bloom"]).position.slopes.numpy())
    np.testing.assert_allclose(own, paper, rtol=1e-6)
    assert metric(at, "slope / the paper's") == "1"

    at.selectbox(key="pub").set_value("falcon").run()
    assert_clean(at)
    own, shown_paper = bars()
    np.testing.assert_allclose(own, open_model(hf_family_dir["falcon"]).position.slopes.numpy())
    np.testing.assert_allclose(own, paper / math.sqrt(8), rtol=1e-6)  # head_dim 32 / 4 = 8
    assert metric(at, "slope / the paper's") == f"{1 / math.sqrt(8):.3g}"
    notes = texts(at.info)
    from posviz.models.hf.probes import measured
    from hf_tiny import family_config

    twice = abs(measured(family_config("falcon"), "alibi").alibi_eager_multiple - 2.0) < 0.05  # as transformers does
    assert "√(head dim)" in notes and "bfloat16" in notes and ("twice" in notes) == twice
    # the rest of the page: the ALiBi section's own slopes, for its heads control
    assert len(frame_with(at, "head", "slope", "one_logit_distance")) == at.number_input(key="heads").value


@pytest.mark.parametrize("page", [ABSOLUTE, ROPE, BIASES])
def test_no_published_section_without_posviz_models(page, no_checkpoints, monkeypatch):
    monkeypatch.setenv("POSVIZ_MODELS", " , ")
    at = open_page(page)
    assert SECTIONS[page] not in [h.value for h in at.header]
    # no picker of published models (the page's own pickers, such as the RoPE page's remap, stay)
    assert not [s for s in at.selectbox if s.key == "pub"] and not at.error and "pub" not in at.query_params


def test_the_proposed_hub_models_are_named_not_fetched_on_the_explore_pages(no_checkpoints, monkeypatch, tmp_path):
    """The Docker image's default list (POSVIZ_MODELS=proposed), offline with an empty hub cache: no page fetches
    a model nobody picked, and none shows an error box for it; the section says they are fetched when picked."""
    import views._models as listing

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("POSVIZ_MODELS", "proposed")
    monkeypatch.setattr("posviz.models.interface.open_model", lambda *a, **k: pytest.fail("opened a hub model"))
    for page in (ABSOLUTE, ROPE, BIASES):
        at = open_page(page)
        assert not at.error, errors(at)
        waiting = [c.value for c in at.caption if c.value.startswith("Listed but not fetched yet")]
        assert waiting and "openai-community/gpt2" in waiting[0] and "tiiuae/falcon-rw-1b" in waiting[0], page
    assert not listing.described_without_download("openai-community/gpt2")
