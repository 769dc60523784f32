"""Per-layer position layouts: each layer its own method, options, window and sink logits.

Today's open models place position per layer, not per model:

* Llama 4's iRoPE: three RoPE layers, then one NoPE layer with a query temperature (``irope``);
* Gemma 3: five sliding-window layers with RoPE base 10 k to one full layer with base 1 M (``local_global``);
* GPT-OSS: sliding-window and full layers alternating, RoPE, a learned sink logit per head (``rope_sinks``).

A layout is one ``PositionMethod`` holding one method per layer; attention asks ``at_layer(layer)`` for the
one acting in each layer and reads its ``window`` and ``sink_logits`` (``positions.base``), so attention
still never asks which method it has. Each preset is one file naming its ``layers``; a config may give any
list instead (``{"position": "rope_sinks", "position_options": {"layers": [{"method": "alibi", "sinks":
true}]}}`` is ALiBi with sinks): the list repeats until every layer has one, as the pattern of a model's
``layer_types``. Methods that add to the input (learned, sinusoidal) act once for the whole model and
cannot be given per layer.

Sink logits: GPT-OSS (OpenAI 2025, https://arxiv.org/abs/2508.10925), ``eager_attention_forward`` in
transformers' ``modeling_gpt_oss.py``: one logit per head joins every softmax row as an extra key and is
dropped after it, initialised N(0, 0.02) as there. StreamingLLM (Xiao et al. 2024,
https://arxiv.org/abs/2309.17453) found that trained models pour attention onto the first tokens instead.
Shapes: H heads; everything else as in ``positions.base``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from posviz.config import require, strict_from_dict
from posviz.errors import ConfigError
from posviz.positions.base import PositionMethod

SINK_INIT_STD = 0.02  # GPT-OSS's init of its sinks (``GptOssPreTrainedModel._init_weights``: the initializer range)


@dataclasses.dataclass
class LayerSpec:
    """One layer's place in a layout."""

    method: str = "rope"  # a name in POSITION_METHODS
    options: dict = dataclasses.field(default_factory=dict)  # that method's own options
    window: int | None = None  # a sliding window of this many keys (the query's own included); None: full
    sinks: bool = False  # learn one sink logit per head in this layer (GPT-OSS)

    def __post_init__(self):
        require(self.window is None or (isinstance(self.window, int) and self.window >= 1),
                f"a layer's window must be a positive integer or None, got {self.window!r}")
        require(isinstance(self.options, dict), "a layer's options must be a mapping")


@dataclasses.dataclass
class LayoutOptions:
    layers: list | None = None  # LayerSpec mappings, repeated over the layers; None: the preset's own
    # a training-free RoPE remap for every rotary layer (``rope_remaps``), as a RoPE model takes one: given to each
    # layer whose method takes remaps, with the factor its defaults cover; the layers' pinned options keep it
    remap: str = "none"
    remap_options: dict | None = None
    factor: float = 1.0

    def __post_init__(self):
        require(self.layers is None or (isinstance(self.layers, list) and len(self.layers) >= 1),
                "a layout's layers must be a list of at least one layer, or left out for the preset's own")
        if self.layers is not None:
            self.layers = [_spec(s, i) for i, s in enumerate(self.layers)]


def _spec(values, i: int) -> dict:
    """One layer's spec as a plain mapping, every key checked (unknown keys are an error)."""
    return dataclasses.asdict(strict_from_dict(LayerSpec, values, f"layer {i} of the layout"))


class LayerLayout(PositionMethod):
    """A method per layer (see the module docstring); the presets subclass it with their own ``layers``."""

    name = ""  # not a method by itself: each preset names itself
    acts_on = "q/k"
    takes_remaps = True  # handed on to its rotary layers (a layout without one ignores it)
    kind = "relative"
    Options = LayoutOptions
    explore_sections = ("layer-layout",)

    def __init__(self, shape, options: dict[str, Any] | None = None):
        from posviz.positions import POSITION_METHODS, build_position_method  # the registry holds this module

        super().__init__(shape, options)
        pattern = self.options.layers or [_spec(s, i) for i, s in enumerate(self.preset_layers(shape))]
        self.specs = [pattern[i % len(pattern)] for i in range(shape.n_layer)]
        methods = []
        for i, spec in enumerate(self.specs):
            cls = POSITION_METHODS.get(spec["method"])
            if cls is not None and (issubclass(cls, LayerLayout) or cls.acts_on == "input"):
                raise ConfigError(f"layer {i}: {spec['method']!r} cannot act in one layer alone (it "
                                  f"{'is a layout' if issubclass(cls, LayerLayout) else 'adds to the input of the whole model'})")
            options = spec["options"]
            if self.options.remap != "none" and cls is not None and cls.takes_remaps:
                options = {**options, "remap": self.options.remap, "remap_options": self.options.remap_options,
                           "factor": self.options.factor}
            method = build_position_method(spec["method"], shape, options)
            method.window = spec["window"]
            if spec["sinks"] and method.computes_own_weights:
                raise ConfigError(f"layer {i}: {spec['method']!r} cannot take sinks: it computes its own attention "
                                  "weights, so a sink logit would join no softmax and nothing would read it")
            if spec["sinks"]:
                method.sink_logits = nn.Parameter(torch.randn(shape.n_head) * SINK_INIT_STD)
            methods.append(method)
        self.layer_methods = nn.ModuleList(methods)
        if any(m.acts_on == "pairs" for m in methods):  # its rotary layers turn each pair when it is attended
            self.acts_on = "pairs"

    @classmethod
    def preset_layers(cls, shape) -> list[dict]:
        """The preset's pattern of layers for a model of ``shape`` (windows scale with its training length).
        Read only when a model is first built from the preset's name: a checkpoint stores ``pinned_options``."""
        return [{"method": "rope"}]

    def pinned_options(self) -> dict:
        """{"layers": one entry per layer, fully written out}: each layer's method, every option it was built
        with (a rotary layer's base, the NoPE layer's temperature), its window (None: full) and sinks. A
        checkpoint trained from a preset stores this, so an edit to the preset never changes a shipped model."""
        return {"layers": [{"method": m.name, "options": m.pinned_options(), "window": spec["window"],
                            "sinks": spec["sinks"]} for m, spec in zip(self.layer_methods, self.specs)]}

    def at_layer(self, layer: int) -> PositionMethod:
        return self.layer_methods[layer]

    # -- what acts on the whole model: the layers' methods, each ----------------------------------
    def check_positions(self, pos: torch.Tensor) -> None:
        for method in self.layer_methods:
            method.check_positions(pos)

    def shift_cached_keys(self, layer: int, k: torch.Tensor, shift: int) -> torch.Tensor | None:
        # only when every layer can: one that cannot (a NoPE layer reading the query's position) changes what
        # the ids pass on to the layers after it, so their keys must be computed again
        if getattr(self, "_every_layer_turns", None) is None:  # a fact of the layout: asked once
            probe = k[..., :0, :]
            self._every_layer_turns = all(self.at_layer(i).shift_cached_keys(i, probe, 0) is not None
                                          for i in range(len(self.specs)))
        return self.at_layer(layer).shift_cached_keys(layer, k, shift) if self._every_layer_turns else None

    def forget(self) -> None:
        super().forget()
        for method in self.layer_methods:
            method.forget()

    def after_optimizer_step(self) -> None:
        for method in self.layer_methods:
            method.after_optimizer_step()

    @property
    def max_positions(self) -> int | None:
        limits = [m.max_positions for m in self.layer_methods if m.max_positions is not None]
        return min(limits) if limits else None

    def is_shift_invariant(self) -> bool:
        return all(m.is_shift_invariant() for m in self.layer_methods)

    @property
    def reads_content(self) -> bool:
        return any(m.reads_content for m in self.layer_methods)

    # -- what the explore pages draw: the layer's own ---------------------------------------------
    def bias_by_distance(self, layer: int, n_keys: int) -> torch.Tensor | None:
        return self.at_layer(layer).bias_by_distance(layer, n_keys)

    def extra_repr(self) -> str:
        return ""  # the layers' own modules say it


def layer_rows(method: PositionMethod, n_layer: int) -> list[dict]:
    """What each layer of a model with ``method`` does with positions, in the rows of
    ``models.hf.families.layer_layout`` (so a page draws a checkpoint and a published model alike): {layer,
    position (the method acting there), base (θ of a rotation; None without), rotary share (of each head's
    features that turn), window, sinks, options (the layer's method options that differ from its defaults)}."""
    rows = []
    for i in range(n_layer):
        m = method.at_layer(i)
        rotation = m.rotation_frequencies(m.shape.train_length)
        turning = 0 if rotation is None else int((rotation[0] > 0).sum())
        defaults = dataclasses.asdict(m.Options())
        changed = {k: v for k, v in dataclasses.asdict(m.options).items() if defaults.get(k) != v and k != "original_length"}
        rows.append({"layer": i, "position": m.name, "base": getattr(m.options, "base", None) if turning else None,
                     "rotary share": 2 * turning / m.shape.head_dim, "window": m.window,
                     "sinks": m.sink_logits is not None, "options": ", ".join(f"{k}={v}" for k, v in changed.items())})
    return rows
