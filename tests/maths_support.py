"""Helpers shared by the unit tests of the pages' maths modules: ``sharp``, ``full_forward_bits`` and the
``text_ids`` fixture for the live labs' modules (test_extrapolation.py, test_attention_maps.py,
test_kv_cache.py, test_context_extension.py, test_compare.py); ``fake_metrics`` for the Home and
About tables (test_home.py, test_about.py).

A test module uses the ``text_ids`` fixture by importing it (``from maths_support import text_ids``),
as the browser tests do with browser_support's fixtures.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posviz.labs import inputs as lab_inputs


def sharp(model, gain: float = 12.0):
    """Scale the query/key projections so a random model's attention is peaked, not uniform (a GPT, or
    the GPT inside a shipped-kind LabModel)."""
    net = getattr(model, "net", model)
    with torch.no_grad():
        for block in net.blocks:
            C = net.config.n_embd
            if block.attn is not None and block.attn.c_attn is not None:
                block.attn.c_attn.weight[: 2 * C] *= gain
    if net.position.projects_heads:  # the method makes q, k, v itself (MLA): its queries scaled, as the rows above
        project = net.position.project_heads

        def sharpened(layer, x):
            q, k, v = project(layer, x)
            return q * gain * gain, k, v

        net.position.project_heads = sharpened
    return model


@pytest.fixture(scope="module")
def text_ids(corpus):
    return lab_inputs.prepare_text(corpus.eval_documents[0][:4096]).ids


def full_forward_bits(model, ids):
    """Per-byte loss (bits) of one causal forward pass: entry t predicts byte t + 1."""
    with torch.no_grad():
        logits = model(ids[None, :-1]).logits[0].float()
    return (F.cross_entropy(logits, ids[1:], reduction="none") / math.log(2)).numpy()


def fake_metrics(b1, b16, train=256):
    table = {str(train * m): (b1 if m == 1 else None if b16 is None else b1 + (b16 - b1) * math.log2(m) / 4)
             for m in (1, 2, 4, 8, 16)}
    return {"eval": {"nonoverlapping_bpb": table, "lengths_x_train": {str(train * m): float(m) for m in (1, 2, 4, 8, 16)}},
            "train_curve": [{"step": 0, "tokens": 10, "train_bpb": 8.0}, {"step": 1, "tokens": 20, "train_bpb": 4.0}],
            "parameters": 123, "tokens": 20, "steps": 2, "val_bpb_at_train_length": b1}
