"""AppTest of every live lab with each rotary tiny family under each training-free remap (issue #57): the deployer
lists the nine rotary families of ``tests/hf_tiny.py`` ($POSVIZ_MODELS), each picker lists every one under each
remap ("neox+self_extend", its defaults covering the longest length the labs run it at), and a visitor picks them
in the Extrapolation, Context extension, KV cache, Far-context retrieval, Generation and Compare labs. The numbers
shown are the labs' own on the models as ``open_model`` opens them; no page shows an error."""
from __future__ import annotations

import pytest
from test_pages_labs import metrics, page, run, texts

from posviz.labs import extrapolation, inputs as lab_inputs
from posviz.models.interface import open_model
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.training.data import load_corpus

FAMILIES = ("neox", "llama3", "llama_yarn", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3")
REMAPPED = [f"{family}+{remap}" for family in FAMILIES for remap in ROPE_REMAPS]


@pytest.fixture()
def listed(tiny_models, hf_family_dir, monkeypatch) -> dict:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("POSVIZ_ALLOW_ANY_MODEL", raising=False)
    folders = {name: hf_family_dir[name] for name in FAMILIES}
    monkeypatch.setenv("POSVIZ_MODELS", ",".join(str(f) for f in folders.values()))
    return folders


@pytest.fixture(scope="module")
def doc() -> bytes:
    return lab_inputs.prepare_text(load_corpus().eval_documents[0]).as_bytes()


def test_extrapolation_runs_every_family_under_every_remap_past_its_context(listed, doc):
    at = run(page("extrapolation", models=",".join(REMAPPED), M="4"))
    assert not at.error, texts(at.error)
    # a published model under a remap is shown "neox + Self-Extend" (posviz.display), metrics() maps the remap's id back
    shown = {label.replace(" + ", "+"): value for label, value in metrics(at).items()}
    assert set(shown) == set(REMAPPED)  # every one scored, none refused
    for name in ("neox+self_extend", "gemma3+dca", "phi3+string", "smollm3+leaky_rerope"):
        family, remap = name.split("+")
        plain = open_model(listed[family])
        model = open_model(listed[family], {"remap": remap, "factor": plain.length_cap / plain.train_length})
        assert shown[name] == f"{extrapolation.score_at_length(model, model.encode(doc), 4 * plain.train_length).bpb:.3f}"
    # the attention of a remapped published model, as every lab draws one
    at.selectbox(key="w_inspect").set_value("gemma2+rerope")
    at.selectbox(key="w_layer").set_value(1)
    at.selectbox(key="w_head").set_value("1")
    run(at)
    assert not at.error and "Head 1: mean attention distance" in texts(at.caption)


@pytest.mark.parametrize("family", FAMILIES)
def test_context_extension_applies_every_remap_to_each_family(listed, family):
    at = run(page("context_extension", base=family, factor="4.0", scalings="none," + ",".join(ROPE_REMAPS)))
    assert not at.error, texts(at.error)
    assert set(at.multiselect(key="w_scalings").value) >= set(ROPE_REMAPS)


def test_kv_cache_generation_retrieval_and_compare_take_the_remapped_published_models(listed):
    some = ["neox+self_extend", "qwen3+dca", "gemma3+string", "phi3+rerope", "smollm3+leaky_rerope"]
    at = run(page("kv_cache", models=",".join(some), W="16", n="40", dw="4", check="qwen3+dca", cl="24"))
    assert not at.error, texts(at.error)
    shown = " ".join(str(v) for d in at.dataframe for v in d.value.to_numpy().ravel()) + texts(at.markdown)
    # the remaps' verdicts: keys cached unrotated and turned when attended, so shifting the window is exact only
    # where the remap reads distances alone
    assert "rotates each pair when it is attended" in shown or "keeps its keys unrotated" in shown
    at = run(page("generation", models="llama3+self_extend,gemma2+dca", n="24", p="8", decode="greedy"))
    assert not at.error, texts(at.error)
    at = run(page("retrieval", models="qwen2+rerope,llama_yarn+string", gap="64", chunks="2"))
    assert not at.error, texts(at.error)
    at = run(page("compare", a="neox+self_extend", b="neox", L="256"))
    assert not at.error, texts(at.error)
