"""Each position method owns its parameters' initialisation, as its paper does: the model's GPT-2 init
(N(0, 0.02) weights, zero biases) is for the model's own layers and must not overwrite a method's.

Until this was tested, ``GPT.__init__`` re-initialised every ``nn.Linear`` in the model, FIRE's MLP
included: every hidden unit then switched at u = 0, the units with a negative weight were dead for
every input FIRE ever gives (u in [0, 1]), and the live ones were scaled copies of relu(u), so the
MLP started linear and all heads learned one and the same curve.
"""
from __future__ import annotations

import pytest
import torch

from posviz.config import ModelConfig
from posviz.models.byte_gpt import GPT
from posviz.positions import POSITION_METHODS, ModelShape, build_position_method
from posviz.positions.fire import THRESHOLD_FRACTION
from posviz.positions.kerple import MIN_PARAMETER
from posviz.training.train import TrainConfig, train

CONFIG = dict(n_layer=4, n_head=4, n_embd=128, train_length=256)  # the shipped shape


@pytest.mark.parametrize("method", sorted(POSITION_METHODS))
def test_the_model_keeps_what_the_method_initialised(method):
    """The model builds its position method first, so with the same seed the method's parameters
    inside a GPT are exactly the ones the method makes on its own."""
    torch.manual_seed(11)
    alone = build_position_method(method, ModelShape(4, 4, 32, 128, 256))
    torch.manual_seed(11)
    inside = GPT(ModelConfig(position=method, **CONFIG)).position
    expected, got = alone.state_dict(), inside.state_dict()
    assert set(expected) == set(got)
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{method}: {name} was re-initialised by the model"


def test_the_model_still_initialises_its_own_layers_as_gpt2():
    model = GPT(ModelConfig(position="fire", **CONFIG))
    assert abs(float(model.wte.weight.detach().std()) - 0.02) < 0.002
    for name, p in model.named_parameters():
        if name.startswith("blocks.") and name.endswith(".bias") and ".ln_" not in name:
            assert torch.count_nonzero(p) == 0, name  # Linear biases start at zero


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fire_starts_with_live_units_spread_over_its_input_range(seed):
    torch.manual_seed(seed)
    fire = GPT(ModelConfig(position="fire", **CONFIG)).position
    assert len(fire.functions) == CONFIG["n_layer"]  # one FIRE per layer, the paper's main setting
    u = torch.linspace(0, 1, 2001)  # every input FIRE can see: psi(d) / psi(max(L, i)) is in [0, 1]
    for fn in fire.functions:
        hidden = fn.mlp[0]
        w, b = hidden.weight[:, 0].detach(), hidden.bias.detach()
        active = torch.relu(u[:, None] * w[None, :] + b[None, :]) > 0  # (u, unit)
        assert bool(active.any(dim=0).all()), "a unit is zero for every u in [0, 1]: it would never learn"
        switches = (-b / w).sort().values
        assert switches.min() >= 0 and switches.max() <= 1
        assert switches.min() < 0.2 and switches.max() > 0.8  # spread over the range, not bunched at 0
        # the heads start with different curves (a linear MLP makes them one curve up to scale)
        with torch.no_grad():
            curves = fn.bias_of(u)  # (H, U)
        bend = curves.diff(n=2, dim=1).abs().sum(dim=1) / (u[1] - u[0])  # total change of slope over [0, 1]
        assert bool((bend > 0.1).all()), f"some head's curve starts as a straight line: {bend}"
        corr = torch.corrcoef(curves)
        assert float(corr.abs().triu(1).max()) < 0.999
        assert float(fn.threshold) == THRESHOLD_FRACTION * CONFIG["train_length"]
    # the layers are separate functions
    assert not torch.equal(fire.functions[0].mlp[0].bias, fire.functions[1].mlp[0].bias)


def test_fire_reference_init_is_nn_linear_default_and_shared_has_one_function():
    torch.manual_seed(3)
    reference = build_position_method("fire", ModelShape(2, 2, 4, 8, 16), {"mlp_init": "reference"})
    torch.manual_seed(3)
    plain = torch.nn.Linear(1, 32)
    torch.testing.assert_close(reference.functions[0].mlp[0].bias, plain.bias)
    shared = build_position_method("fire", ModelShape(2, 2, 4, 8, 16), {"shared_across_layers": True})
    assert len(shared.functions) == 1 and shared.function(0) is shared.function(1)
    assert float(build_position_method("fire", ModelShape(2, 2, 4, 8, 16), {"threshold_init": 512.0}).function(0).threshold) == 512


def test_transformer_xl_projection_keeps_its_small_init():
    torch.manual_seed(0)
    txl = GPT(ModelConfig(position="transformer_xl", **CONFIG)).position
    for proj in txl.proj:
        w = proj.weight.detach()
        assert abs(float(w.std()) - 0.02) < 0.002 and abs(float(w.mean())) < 0.002


def test_kerple_training_keeps_its_stored_parameters_at_the_floor(monkeypatch, tmp_path):
    """The authors clamp r1, r2 after every update, so a value pushed below the floor sits there and
    can rise again; the shipped v2 kerple has stored r1 = -2 in two heads, used as 0.01."""
    kerple = build_position_method("kerple", ModelShape(2, 2, 4, 8, 16))
    with torch.no_grad():
        kerple.r1[0, 0], kerple.r2[1, 1] = -2.0, -0.5
    kerple.after_optimizer_step()
    assert float(kerple.r1[0, 0]) == float(kerple.r2[1, 1]) == pytest.approx(MIN_PARAMETER)
    assert bool((kerple.r1 >= MIN_PARAMETER).all()) and bool((kerple.r2 >= MIN_PARAMETER).all())

    calls = []
    cls = type(kerple)
    original = cls.after_optimizer_step
    monkeypatch.setattr(cls, "after_optimizer_step", lambda self: (calls.append(1), original(self)))
    cfg = TrainConfig(method="kerple", n_layer=1, n_head=2, n_embd=16, train_length=16, batch_size=2, tokens=2 * 16 * 3,
                      warmup_steps=1, eval_bytes=64, precision="fp32", repeat_probability=0.0)
    train(cfg, out=None, progress=False, state_dir=tmp_path / "state")
    assert len(calls) == cfg.steps == 3  # once after every optimizer step
