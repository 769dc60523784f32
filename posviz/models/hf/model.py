"""A published transformers model as a ``LabModel`` (its kinds, the refs that open it: ``kinds``).
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

# Resolved once, at this module's import (which Python serialises): transformers' lazy attributes,
# first touched by two threads at once (the server's warm-up and a visitor), raised "cannot import name
# 'AutoConfig'" in one of them.
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: F401

from posviz.errors import PosvizError, PositionLimitError
from posviz.limits import MAX_LENGTH_MULTIPLE_CPU, MAX_LENGTH_MULTIPLE_GPU
from posviz.models.interface import LabModel, ModelOutput, open_model
from posviz.models.hf.cache import PublishedCache
from posviz.models.hf.families import (ACTS_ON, FAMILIES, UNSTATED_CONTEXT,
                                              attention_module, decoder_layers, layer_layout, modeling_module, rope_parameters_for,
                                              sdpa_ok, stated_elsewhere)
from posviz.models.hf.hub import Engine, count_parameters
from posviz.models.hf.positions import PublishedPositions, published_positions
from posviz.models.hf.mixers import MIXERS, implied_map, keep_inputs, layer_mixers, mixer_heads
from posviz.models.hf.settings import (flop_budget, forward_flops, max_params, max_work_bytes, parameters_in_words,
                                              tokens_within)
from posviz.models.hf.text import TokenizerText
from posviz.models.hf import remaps as hf_remaps
from posviz.models.hf import probes
from posviz.positions.rope_remaps import ROPE_REMAPS


def run_dtype(config, device: torch.device) -> torch.dtype:
    """The model's own half precision on a GPU, float32 on a CPU (or where it states none)."""
    dtype = getattr(config, "dtype", None) or torch.float32
    return dtype if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) else torch.float32


class PublishedModel(LabModel):
    """A published causal LM (see the module docstring)."""

    unit = "token"

    def __init__(self, ref: str, config, folder: Path | None, overrides: Mapping, device: torch.device, key: tuple,
                 engine: Engine | None = None):
        self.ref, self.key, self._device, self._overrides = ref, key, device, dict(overrides)
        family = FAMILIES[config.model_type]
        self.family_name, self._family = config.model_type, family
        self.method = family.method(config)
        self.name = folder.name if folder is not None else ref
        context = family.context(config) if family.context(config) is not None else stated_elsewhere(folder)
        self.context_known = context is not None
        self.train_length = int(context or UNSTATED_CONTEXT)
        self.n_layer, self.n_head = int(config.num_hidden_layers), int(config.num_attention_heads)
        self.vocab_size = int(config.vocab_size)
        self.mixers = layer_mixers(config)  # what mixes the tokens in each layer (a hybrid's recurrent layers)
        self.max_positions = family.table_rows(config)
        self.acts_on = ACTS_ON[self.method]
        if self.method == "nope" and any(m.carries_order for m in self.mixers):
            self.acts_on = "recurrence"  # order from the recurrent layers' state (as posviz's hybrid_deltanet)
        self.is_absolute = self.method == "learned"
        self.n_params = count_parameters(config)
        if self.n_params > max_params():
            raise PosvizError(f"{ref} has {parameters_in_words(self.n_params)} parameters, over this server's cap of "
                              f"{parameters_in_words(max_params())} (POSVIZ_MAX_PARAMS). Choose a smaller model.")
        raw_rope = dict(getattr(config, "rope_parameters", None) or {}) if self.method == "rope" else {}
        # Gemma 3: one set of rope parameters per layer type (sliding-window layers θ 1e4, full layers θ 1e6);
        # what posviz reports and draws is the full layers' (the ones that see the whole context)
        self.layer_ropes = {k: dict(v) for k, v in raw_rope.items()} if raw_rope and all(
            isinstance(v, Mapping) for v in raw_rope.values()) else {}
        self._drawn_layer_type = ("full_attention" if "full_attention" in self.layer_ropes
                                  else next(iter(self.layer_ropes), None))
        base_rope = self.layer_ropes[self._drawn_layer_type] if self.layer_ropes else raw_rope
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.n_head)
        self.hidden = int(config.hidden_size)
        self.rotary_dims = (int(self.head_dim * float(base_rope.get("partial_rotary_factor", 1.0))) // 2 * 2
                            if self.method == "rope" else None)
        if family.head_dims is not None:  # MLA: q.k is an unrotated part and a rotated part
            self.head_dim, self.rotary_dims = family.head_dims(config)
        self.remap_refusal = probes.remap_refusal(config, self.method)  # None: it takes every remap
        self.remaps = tuple(ROPE_REMAPS) if self.remap_refusal is None else ()
        remap = self._overrides.get("remap", "none")
        if self._overrides and self.method != "rope":
            raise PosvizError(f"{self.name} uses {self.method} positions: RoPE scalings and remaps apply to rotary "
                              "models only.")
        if remap != "none":
            if remap not in ROPE_REMAPS:
                raise PosvizError(f"Unknown RoPE remap {remap!r}. Known remaps: {', '.join(ROPE_REMAPS)}.")
            if self.remap_refusal:
                raise PosvizError(f"{self.name} cannot take the {remap} remap: {self.remap_refusal}.")
            if self._overrides.get("scaling", "none") != "none":
                raise PosvizError(f"{self.name}: a remap runs at the model's own RoPE speeds; choose a scaling or a "
                                  "remap, not both.")
        if self._overrides.get("scaling", "none") != "none" and self.layer_ropes:
            raise PosvizError(f"{self.name}'s layers turn with {len(self.layer_ropes)} RoPE bases (one per layer type: "
                              f"{', '.join(self.layer_ropes)}): posviz's scalings apply to models with one.")
        self.rope_parameters = (raw_rope if self.layer_ropes else rope_parameters_for(
            base_rope, self.rotary_dims, self.train_length, self._overrides) if self.method == "rope" else None)
        self.remap, self.remap_options = None, None
        if remap != "none":  # its defaults cover factor x the trained context, as for a RoPE checkpoint
            self.remap = ROPE_REMAPS[remap]
            factor = float(self._overrides.get("factor", 1.0))
            self.remap_options = self.remap.build(self._overrides.get("remap_options"), self.train_length,
                                                  round(factor * self.train_length))
            # what the pages state: every value written out; the overrides stay as given, so that a later factor
            # (with_position_options({"factor": 4})) resolves the remap's defaults anew
            pinned = {"remap": remap, "remap_options": dataclasses.asdict(self.remap_options), "factor": factor}
            self.name = f"{self.name}+{remap}"  # as the labs list it: the model and its remap
            # each pair is rotated at attention time, at the positions the remap gives it: keys are cached unrotated
            self.acts_on = "pairs"
        self.position_options = pinned if self.remap is not None else dict(self._overrides) if self._overrides else (
            {"scaling": "none", "rope_type": base_rope.get("rope_type", "default"),
             "base": float(base_rope.get("rope_theta", 10000.0))} if self.method == "rope" else {})
        self.config = config
        self._dtype = run_dtype(config, device)
        self._engine = engine or Engine(ref, folder, config, device, self._dtype)
        self._rotary = None  # this variant's rotary module (a scaled copy), made on first use
        self._text: TokenizerText | None = None
        self.folder = folder
        self.weights_note = ""  # where the weights came from, when it matters (a GGUF file's quantisation)

    # -- text ---------------------------------------------------------------------------------------
    @property
    def text(self) -> TokenizerText:
        if self._text is None:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(str(self._engine.tokenizer_source()), trust_remote_code=False)
            except Exception as exc:
                raise PosvizError(f"{self.name}: its tokenizer cannot be loaded ({exc}).") from exc
            self._text = TokenizerText(tokenizer)
        return self._text

    @property
    def description(self) -> str:
        """Its position method's display name and trained context (" — RoPE, 2,048 tokens")."""
        from posviz.display import display_name  # the method's name, as every picker says it

        where = display_name(self.method)
        if self._family.summary(self.config):  # " — RoPE (MLA: 64 of 192 q·k dims rotate), 4,096 tokens"
            where += f" ({self._family.summary(self.config)})"
        others = [m.kind for m in self.mixers if m.kind != "attention"]
        if others:  # a hybrid: its positions are its attention layers' (" — RoPE on 1 of 4 layers, 3 Gated DeltaNet …")
            kinds = ", ".join(f"{others.count(k)} {k}" for k in dict.fromkeys(others))
            where += f" on {len(self.mixers) - len(others)} of {len(self.mixers)} layers, {kinds}"
        return (f" — {where}, {self.train_length:,} {self.unit}s{'' if self.context_known else ' (assumed)'}"
                + (f", {self.weights_note}" if self.weights_note else ""))

    def encode(self, text: bytes) -> torch.Tensor:
        return self.text.encode(text)

    def decode(self, ids) -> bytes:
        return self.text.decode(ids)

    def bytes_per_id(self, ids) -> np.ndarray:
        return self.text.bytes_per_id(ids)

    # -- running ------------------------------------------------------------------------------------
    @property
    def net(self):
        return self._engine.load()

    def load(self, progress=None) -> None:
        self._engine.load(progress)

    @property
    def needs_loading(self) -> bool:
        return self._engine.net is None  # a download or gigabytes from disk: the page shows a bar

    def new_cache(self, max_size: int | None = None, sinks: int = 0, for_maps: bool = False) -> PublishedCache:
        # an attention layer's map of cached queries reads its cached keys; a recurrent layer's (layer_kind) is
        # drawn from its inputs since the first token, which a cache for maps keeps
        hybrid = self.config.model_type in MIXERS
        return PublishedCache(max_size=max_size, sinks=sinks, config=self.config if hybrid else None,
                              inputs={} if for_maps and hybrid else None,
                              evictable=all(mixer.evictable for mixer in self.mixers))

    def layer_kind(self, layer: int) -> str:
        return self.mixers[layer].kind

    def beside_kind(self, layer: int) -> str | None:
        return self.mixers[layer].beside_kind

    @torch.inference_mode()
    def beside_map(self, ids: torch.Tensor, layer: int) -> torch.Tensor:
        """(H, T, T): the implied matrix of the mixer beside ``layer``'s attention (Falcon-H1's Mamba-2) on ``ids``
        (T,), from one plain pass that keeps that mixer's input; its heads grouped to the attention's."""
        kind = self.beside_kind(layer)
        if kind is None:
            raise PosvizError(f"{self.name}: layer {layer} has nothing beside its attention to draw.")
        ids = torch.as_tensor(ids, device=self._device).flatten()
        T = ids.numel()
        problem = self.cannot_run(T)
        if problem:
            raise PositionLimitError(problem)
        self._check_work(T, T, False, implied=True)
        mixer, kept = self.mixers[layer], {}
        with self._engine.lock, self._variant(False, torch.arange(T), torch.arange(T)) as net:
            module = getattr(decoder_layers(net)[layer], mixer.beside_attribute)
            hook = module.register_forward_pre_hook(
                lambda m, args, kwargs: kept.update(x=args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
            try:
                net(input_ids=ids[None], position_ids=torch.arange(T, device=self._device)[None])
            finally:
                hook.remove()
            return implied_map(self.mixers, decoder_layers(net), layer, kept["x"], self.n_head, self.name,
                               beside=True)[0].float()

    def cache_holds(self, layer: int) -> tuple[str, bool]:
        mixer = self.mixers[layer]
        if mixer.grows is not None:  # attention that keeps other than every token's keys (DeepSeek-V4)
            return mixer.holds, mixer.grows
        if mixer.kind == "attention":
            return f"keys and values of every cached {self.unit}" + (f", {mixer.holds}" if mixer.beside else ""), True
        return mixer.holds, False

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def is_shift_invariant(self) -> bool:
        if self.remap is not None:  # grouped, chunked or log-scaled positions read where a window starts
            return self.remap.shift_invariant(self.remap_options)
        # dynamic NTK and LongRoPE change every pair's speed with the length of the pass
        return self.method != "learned" and (self.rope_parameters or {}).get("rope_type") not in ("dynamic", "longrope")

    def with_position_options(self, overrides: Mapping) -> LabModel:
        return open_model(self.ref, {**self._overrides, **dict(overrides)}, self._device)

    def work_bytes(self, n_keys: int, n_queries: int | None = None, attention_map: bool = False,
                   implied: bool = False) -> int:
        """The biggest temporaries of one forward pass over ``n_keys`` positions: an ALiBi bias and eager
        attention's scores are (B, H, T, Tk) floats; sdpa's fused kernels keep none. ``implied``: a recurrent layer's
        map, its implied matrix over every token since the first (``mixers``): up to three float64 (H, Tk, Tk) of
        the layer's own heads (a Mamba-2 scan's scores, decays and weights)."""
        n_queries = n_keys if n_queries is None else n_queries
        folds = any(mixer.fold is not None for mixer in self.mixers)
        if folds and attention_map:  # DeepSeek-V4: a compressed entry per block of keys, then the map over tokens
            rates = dict(getattr(self.config, "compress_rates", None) or {}).values()
            n_keys += n_keys // min(rates, default=1)
        if implied:
            return 24 * mixer_heads(self.config, self.n_head) * n_keys * n_keys
        if self.remap is not None:  # scored a block of queries at a time (``hf.remaps``)
            return hf_remaps.work_bytes(self.n_head, n_queries, n_keys, attention_map)
        per_map = self.n_head * n_queries * n_keys * 4
        if attention_map or not sdpa_ok(self.config):
            return (4 if folds and attention_map else 3) * per_map  # scores, probabilities, the mask or bias (, the fold)
        return per_map if self.method == "alibi" else 0

    def _check_work(self, n_keys: int, n_queries: int, attention_map: bool, implied: bool = False) -> None:
        need = max(self.work_bytes(n_keys, n_queries, attention_map), self.work_bytes(n_keys, implied=True) if implied else 0)
        if need > max_work_bytes():
            raise PosvizError(f"{self.name} at {n_keys:,} tokens would need about {need / 2**30:.1f} GiB for "
                              f"{'an attention map' if attention_map else 'its attention biases'}, over this server's "
                              f"{max_work_bytes() / 2**30:.1f} GiB (POSVIZ_MAX_WORK_BYTES). Choose a shorter length.")

    @property
    def length_cap(self) -> int:
        """16 x the context on a CPU (32 on a GPU), and at most what one pass may cost in time."""
        multiple = MAX_LENGTH_MULTIPLE_GPU if self._device.type == "cuda" else MAX_LENGTH_MULTIPLE_CPU
        budget = flop_budget(self._device.type)
        return max(min(multiple * self.train_length, tokens_within(budget, self.n_params, self.n_layer, self.hidden)),
                   min(self.train_length, 64))

    @property
    def length_cap_reason(self) -> str:
        multiple = MAX_LENGTH_MULTIPLE_GPU if self._device.type == "cuda" else MAX_LENGTH_MULTIPLE_CPU
        if self.length_cap < multiple * self.train_length:
            flops = forward_flops(self.length_cap, self.n_params, self.n_layer, self.hidden)
            return (f"time: one pass over {self.length_cap:,} tokens of a {self.n_params / 1e6:.0f} M-parameter model "
                    f"is about {flops / 1e12:.2g} TFLOP on this {self._device.type}")
        return f"{multiple} × its trained context on this {self._device.type}"

    def cannot_run(self, n_positions: int) -> str | None:
        if self.max_positions is not None and n_positions > self.max_positions:
            what = "max_seq_len" if self.family_name == "mpt" else f"{self.method} table"
            return (f"{self.name} cannot run {n_positions:,} positions: its {what} holds "
                    f"{self.max_positions:,} (positions 0–{self.max_positions - 1:,}).")
        return None

    @contextlib.contextmanager
    def _variant(self, eager: bool, q_pos=None, k_pos=None, probs_for=()):
        """This variant's rotary module and attention implementation, in place for one forward pass; under a remap,
        the identity rotation and posviz's attention (``hf.remaps``), told the pass's query and key positions."""
        net, swapped = self.net, None
        before = net.config._attn_implementation
        run = contextlib.nullcontext()
        if self.method == "rope" and self._overrides:
            parent = next(m for m in net.modules() if isinstance(getattr(m, "rotary_emb", None), torch.nn.Module))
            swapped = (parent, parent.rotary_emb)
            parent.rotary_emb = (hf_remaps.Unrotated(parent.rotary_emb) if self.remap is not None
                                 else self._rotary_module())
        if eager:
            net.config._attn_implementation_internal = "eager"
        if self.remap is not None:
            hf_remaps.register_once()
            net.config._attn_implementation_internal = hf_remaps.ATTENTION_NAME
            speeds, types = self._remap_speeds()
            run = hf_remaps.pass_positions(hf_remaps.RemapPass(
                self.remap, self.remap_options, self.train_length, speeds, types, q_pos.cpu(), k_pos.cpu(),
                frozenset(probs_for)))
        try:
            with run:
                yield net
        finally:
            net.config._attn_implementation_internal = before
            if swapped is not None:
                swapped[0].rotary_emb = swapped[1]

    def _eager_differs(self) -> bool:
        """The probe's answer, kept on the model: a map's pass asks it every time, and the probe's own cache is
        keyed on the serialised config (a few milliseconds a call)."""
        if getattr(self, "_eager_differs_measured", None) is None:
            self._eager_differs_measured = probes.eager_differs(self.config, self.method)
        return self._eager_differs_measured

    def _remap_speeds(self) -> tuple[dict, list | None]:
        if getattr(self, "_speeds", None) is None:  # once per variant
            self._speeds = hf_remaps.speeds_of(self)
        return self._speeds

    def _rotary_module(self) -> torch.nn.Module:
        if self._rotary is None:
            self._rotary = self._new_rotary(self._device)
        return self._rotary

    def _new_rotary(self, device) -> torch.nn.Module:
        config = self.config.__class__.from_dict({**self.config.to_dict(), "rope_parameters": self.rope_parameters})
        cls = next(v for k, v in vars(modeling_module(self.config)).items() if k.endswith("RotaryEmbedding")
                   and isinstance(v, type))
        return cls(config=config).to(device)

    @torch.inference_mode()
    def __call__(self, ids, positions=None, cache: PublishedCache | None = None, attention_layer=None,
                 attention_head=None) -> ModelOutput:
        ids = torch.as_tensor(ids, device=self._device)
        B, T = ids.shape
        start = cache.next_position() if cache is not None else 0
        if positions is None:
            pos = torch.arange(start, start + T, device=self._device)
        elif isinstance(positions, int):
            pos = torch.arange(positions, positions + T, device=self._device)
        else:
            pos = torch.as_tensor(positions, device=self._device).flatten()
        if cache is not None and cache.max_size is not None and T <= cache.max_size:
            cache.keep_last(cache.max_size - T)  # each query sees the max_size keys ending at itself, itself included
        held = len(cache) if cache is not None else 0
        if cache is not None and cache.max_size is not None and T > 1 and held + T > cache.max_size:
            # a chunk into a full window: each query must see only the window ending at itself
            outs = [self(ids[:, i:i + 1], positions=pos[i:i + 1], cache=cache, attention_layer=attention_layer,
                         attention_head=attention_head) for i in range(T)]
            return ModelOutput(torch.cat([o.logits for o in outs], 1), None)
        reach = int(pos.max()) + 1 if self.method == "learned" else held + T
        problem = self.cannot_run(reach)
        if problem:
            raise PositionLimitError(problem)
        self._check_work(held + T, T, attention_layer is not None,
                         implied=attention_layer is not None and self.mixers[attention_layer].kind != "attention")
        # Without a cache of ours the call is the bare one, the model's own use_cache default included: BLOOM's
        # pass without a cache took a slower mask path (1.2x its default at 2,048 tokens)
        kwargs = {"input_ids": ids}
        if self.method != "alibi":  # ALiBi families place keys by the attention mask, not by position ids
            kwargs["position_ids"] = pos[None].expand(B, T)
        if cache is not None:
            kwargs[self._engine.cache_argument] = cache.hf
            kwargs["attention_mask"] = torch.ones(B, held + T, dtype=torch.long, device=self._device)
            kwargs["cache_position"] = torch.arange(held, held + T, device=self._device)
        captured = {}
        k_pos = pos if cache is None or not held else torch.cat((cache.positions.to(pos.device), pos))
        with self._engine.lock, self._variant(attention_layer is not None, pos, k_pos,
                                              () if attention_layer is None else (attention_layer,)) as net:
            hooks = []
            if attention_layer is not None:
                if not 0 <= attention_layer < self.n_layer:
                    raise PosvizError(f"layer must be in 0..{self.n_layer - 1}, got {attention_layer}")
                mixer = self.mixers[attention_layer]
                if mixer.kind == "attention":
                    layer = decoder_layers(net)[attention_layer]
                    module = getattr(layer, mixer.attribute) if mixer.attribute else attention_module(layer)

                    def keep_probs(module, args, out):  # returns None: the layer's output passes on unchanged
                        captured["probs"] = out[1]

                    hooks.append(module.register_forward_hook(keep_probs))
                if (mixer.kind != "attention" or mixer.fold is not None) and cache is not None and cache.inputs is None:
                    raise PosvizError(f"{self.name}: layer {attention_layer} is {self.layer_kind(attention_layer)}, whose "
                                      "map of a cached pass is drawn from its inputs since the first token: open the "
                                      "cache with new_cache(for_maps=True).")
            inputs = keep_inputs(self.mixers, decoder_layers(net), cache, () if attention_layer is None else (attention_layer,), hooks)
            try:
                logits = net(**kwargs).logits
            finally:
                for hook in hooks:
                    hook.remove()
            if attention_layer is not None and self.mixers[attention_layer].fold is not None:
                folded = self._folded(net, attention_layer, inputs, cache, captured["probs"])
                captured["probs"] = folded
            elif attention_layer is not None and self.mixers[attention_layer].kind != "attention":
                captured["probs"] = implied_map(self.mixers, decoder_layers(net), attention_layer, inputs[attention_layer], self.n_head, self.name)[..., -T:, :]
        if attention_layer is not None and cache is None and self._eager_differs():
            # the map is eager attention's; the scores come from the implementation the model runs by default
            logits = self(ids, positions=pos).logits
        if cache is not None:
            cache.positions = pos if cache.positions is None else torch.cat((cache.positions, pos))
            if cache.max_size is not None:
                cache.keep_last(cache.max_size)
        probs = captured.get("probs")
        if probs is not None:
            probs = probs.float()
            if attention_head is not None:
                probs = probs[:, attention_head]
        return ModelOutput(logits, probs)

    def _folded(self, net, layer: int, inputs: dict, cache, probs: torch.Tensor) -> torch.Tensor:
        """An attention layer's weights as a map over tokens: the same where its keys are the tokens; DeepSeek-V4's
        compressed entries spread over the tokens they pool (``mixers.fold_compressed``), from the layer's inputs
        since the first token (a cache for maps keeps them)."""
        mixer = self.mixers[layer]
        if mixer.fold is None:
            return probs
        return mixer.fold(getattr(decoder_layers(net)[layer], mixer.attribute), inputs[layer], probs)

    # -- positions, as the explore pages draw them ----------------------------------------------------
    def layer_layout(self) -> list[dict]:
        return [{**row, "options": ""} for row in layer_layout(self.config)]

    @torch.inference_mode()
    def attention_all_layers(self, ids: torch.Tensor) -> torch.Tensor:
        """Every layer's map from one eager pass (``output_attentions``), not one pass per layer: a 30-layer
        model reads its sinks in one pass instead of 30."""
        ids = torch.as_tensor(ids, device=self._device).flatten()
        T = ids.numel()
        problem = self.cannot_run(T)
        if problem:
            raise PositionLimitError(problem)
        self._check_work(T, T, True, implied=any(m.kind != "attention" for m in self.mixers))
        kwargs = {"input_ids": ids[None]}
        if self.method != "alibi":
            kwargs["position_ids"] = torch.arange(T, device=self._device)[None]
        pos = torch.arange(T, device=self._device)
        hooks = []
        with self._engine.lock, self._variant(True, pos, pos, range(self.n_layer)) as net:
            inputs = keep_inputs(self.mixers, decoder_layers(net), None, range(self.n_layer), hooks)  # for the implied matrices
            attending = [layer for layer, mixer in enumerate(self.mixers) if mixer.kind == "attention"]
            kept = {}
            if self._family.maps_by_hook:  # its output_attentions returns none (Falcon-H1): each layer's own output
                layers = decoder_layers(net)
                for layer in attending:
                    module = getattr(layers[layer], self.mixers[layer].attribute)
                    hooks.append(module.register_forward_hook(lambda m, a, out, layer=layer: kept.update({layer: out[1]})))
            try:
                attentions = net(**kwargs, output_attentions=True).attentions  # the attention layers' only
            finally:
                for hook in hooks:
                    hook.remove()
            raw = kept if self._family.maps_by_hook else dict(zip(attending, attentions))
            del attentions, kept  # each raw map is freed as it is folded (DeepSeek-V4's are wider than a map)
            maps = {layer: self._folded(net, layer, inputs, None, raw.pop(layer)) for layer in list(raw)}
            return torch.stack([maps[layer][0].float() if mixer.kind == "attention"
                                else implied_map(self.mixers, decoder_layers(net), layer, inputs[layer], self.n_head, self.name)[0].float()
                                for layer, mixer in enumerate(self.mixers)])

    def frequencies(self, seq_len: int):
        """(inv_freq, attention_factor) from transformers' own rotary module for this variant; None unless RoPE."""
        if self.method != "rope":
            return None
        rotary = self._new_rotary(torch.device("cpu"))
        if self.rope_parameters.get("rope_type") == "dynamic":  # its speeds follow the longest position seen
            rotary(torch.zeros(1, dtype=torch.float32), torch.arange(seq_len)[None])
        if self.layer_ropes:  # one buffer per layer type: the full layers'
            kind = self._drawn_layer_type
            return getattr(rotary, f"{kind}_inv_freq").detach().double().cpu(), float(getattr(rotary, f"{kind}_attention_scaling"))
        return rotary.inv_freq.detach().double().cpu(), float(rotary.attention_scaling)

    @property
    def position(self) -> PublishedPositions:
        return published_positions(self)

    def stored_metrics(self) -> dict:
        return {}
