"""p-RoPE (posviz/positions/p_rope.py) against transformers' "proportional" rope type, and its properties:
p = 1 is RoPE, p = 0 is NoPE, the stopped pairs carry no position, and scores stay relative."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from conftest import tiny_model
from posviz.positions import build_position_method
from posviz.positions.base import ModelShape


def shape(head_dim: int, train_length: int = 64) -> ModelShape:
    return ModelShape(n_layer=2, n_head=2, head_dim=head_dim, n_embd=2 * head_dim, train_length=train_length)


@pytest.mark.parametrize("head_dim,base,p", [(32, 10000.0, 0.25), (64, 1e6, 0.25), (32, 500.0, 0.5), (16, 1e4, 0.3),
                                             (32, 1e4, 1.0), (32, 1e4, 0.0)])
def test_frequencies_are_transformers_proportional(head_dim, base, p):
    config = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                         rope_parameters={"rope_type": "proportional", "rope_theta": base, "partial_rotary_factor": p})
    theirs, attention_theirs = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    method = build_position_method("p_rope", shape(head_dim), {"p": p, "base": base})
    ours, attention = method.rotation_frequencies(64)
    assert ours.shape == theirs.shape == (head_dim // 2,)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-6, atol=0)
    assert attention == attention_theirs == 1.0
    assert int((ours > 0).sum()) == method.rotating_pairs == int(p * head_dim // 2)


def test_the_rotating_pairs_are_ropes_fastest_and_the_rest_stand_still():
    rope = build_position_method("rope", shape(32), {}).rotation_frequencies(64)[0]
    p_rope = build_position_method("p_rope", shape(32), {}).rotation_frequencies(64)[0]
    assert torch.equal(p_rope[:4], rope[:4]) and (p_rope[4:] == 0).all()  # 0.25 of 16 pairs turn


def test_stopped_pairs_carry_no_position_and_scores_stay_relative():
    torch.manual_seed(0)
    method = build_position_method("p_rope", shape(32), {})
    q, k = torch.randn(1, 2, 40, 32), torch.randn(1, 2, 40, 32)
    pos = torch.arange(40)
    q1, k1 = method.rotate_qk(q, k, pos)
    q2, k2 = method.rotate_qk(q, k, pos + 1000)
    # the same offsets at other absolute positions: the same scores
    torch.testing.assert_close(q1 @ k1.transpose(-1, -2), q2 @ k2.transpose(-1, -2), rtol=1e-4, atol=1e-4)
    # features of the stopped pairs (GPT-NeoX halves: pairs 4..15 are features 4..15 and 20..31) are untouched
    still = torch.cat((torch.arange(4, 16), torch.arange(20, 32)))
    assert torch.equal(q1[..., still], q[..., still]) and torch.equal(k2[..., still], k[..., still])
    assert not torch.allclose(q1[..., :4], q[..., :4])


def test_p_one_is_rope_and_p_zero_is_nope():
    ids = torch.randint(0, 256, (2, 48))
    for p, twin in ((1.0, "rope"), (0.0, "nope")):
        ours = tiny_model("p_rope", seed=3, position_options={"p": p})
        theirs = tiny_model(twin, seed=3)
        theirs.load_state_dict(ours.state_dict())  # neither has position parameters: the same weights
        with torch.no_grad():
            torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=0, atol=1e-6)


def test_bad_options_are_refused():
    with pytest.raises(Exception, match="p must be in"):
        build_position_method("p_rope", shape(32), {"p": 1.5})
    with pytest.raises(Exception, match="rotary_fraction"):
        build_position_method("p_rope", shape(32), {"rotary_fraction": 0.5})
