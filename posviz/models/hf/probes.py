"""What the installed transformers does with a model's family, measured, never assumed from a version.

A release can change what a family computes: transformers 5.24's Falcon added its ALiBi bias twice in eager
attention (once in the mask, once in the scores) and kept its rotary attention outside the attention
interface; 5.25 adds the bias once and routes both through the interface. So every per-family fact posviz
states about a published model is measured here, on a *twin*: a model of the same config class, with the
model's own flags, rope parameters, head size and layer kinds, shrunk to a few heads, one layer of each kind
and a small vocabulary, with random weights (seeded) large enough that positions move its logits. The twin
runs the installed library's own modeling code, so what it shows is what the loaded model does, at a cost of
milliseconds, once per config and process.

Measured (``Measured``):

* ``eager_equals_default``: eager attention (the one that returns attention maps) gives the logits of the
  implementation the model runs by default (sdpa where its class supports it). Where it does not, a lab's
  map comes from eager attention and its scores from the default pass.
* ``alibi_eager_multiple``: ALiBi families, the slope eager attention adds, over the stated slopes
  (``families.alibi_slopes_as_added``). With every attention input projection zeroed, q·k = 0, so a row of
  eager's probabilities is softmax(m · bias): the log-ratio of neighbouring keys is m × the slope.
* ``remap_refusal``: rotary families, whether posviz's remaps can run the model. The twin runs once plainly and
  once as a remap runs it (the rotary module handing out the identity rotation, posviz's attention function
  under a remap that keeps every pair at its own position): equal logits mean that every layer's attention
  goes through transformers' attention interface and rotates with the module posviz swaps. The same twin
  without posviz's attention (identity rotation alone) must move its logits, or the check proved nothing.
"""
from __future__ import annotations

import copy
import json
import math
import threading
from dataclasses import dataclass

import torch

from posviz.errors import PosvizError
from posviz.models.hf import remaps as hf_remaps
from posviz.models.hf.families import FAMILIES, alibi_slopes_as_added, attention_module, decoder_layers, default_attention
from posviz.positions.rope_remaps import ROPE_REMAPS

TWIN_HEADS = 4
TWIN_TOKENS = 24
TWIN_VOCAB = 256
SAME_LOGITS = 1e-4  # float32 logits of a one- or two-layer twin: the same computation agrees to ~1e-6
MOVED_LOGITS = 1e-3  # the identity rotation must move the twin's logits by more than this for the check to count


@dataclass(frozen=True)
class Measured:
    """What the installed transformers does with one config's family (see the module docstring)."""

    transformers_version: str
    default_attention: str  # "sdpa" or "eager": what posviz loads the model with
    eager_equals_default: bool
    eager_logit_gap: float  # max |eager - default| of the twin's logits
    alibi_eager_multiple: float | None = None  # ALiBi: eager's slope / the stated slope (1.0: added once)
    remap_refusal: str | None = None  # rotary: None where the remaps run it, else why not (in a page's words)


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def causal_lm_class(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]


def _kept_layers(config) -> list[int]:
    """One layer of each kind the model has (layer type x rotates or not), in order."""
    n = int(getattr(config, "num_hidden_layers", 1) or 1)
    types = list(getattr(config, "layer_types", None) or [])
    rotates = list(getattr(config, "no_rope_layers", None) or [])
    seen, kept = set(), []
    for i in range(n):
        kind = (types[i] if i < len(types) else None, rotates[i] if i < len(rotates) else None)
        if kind not in seen:
            seen.add(kind)
            kept.append(i)
    return kept or [0]


def twin_config(config):
    """``config`` shrunk to ``TWIN_HEADS`` heads of its own head size, one layer of each kind, a small vocabulary
    and feed-forward; its flags (ALiBi, parallel attention, rope parameters, windows, soft-caps) kept."""
    twin = copy.deepcopy(config)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kept = _kept_layers(config)
    twin.num_attention_heads = TWIN_HEADS
    for kv_name in ("num_key_value_heads", "num_kv_heads"):
        kv = getattr(config, kv_name, None)
        if kv is not None:  # keep the model's kind of attention: full, grouped or multi-query
            setattr(twin, kv_name, TWIN_HEADS if int(kv) >= heads else 1 if int(kv) == 1 else 2)
    if getattr(config, "head_dim", None) and not isinstance(getattr(type(config), "head_dim", None), property):
        twin.head_dim = head_dim
    twin.hidden_size = TWIN_HEADS * head_dim
    for name in ("intermediate_size", "ffn_hidden_size", "n_inner"):
        if getattr(config, name, None):
            setattr(twin, name, 2 * twin.hidden_size)
    for name, value in (("num_local_experts", 2), ("num_experts", 2), ("num_experts_per_tok", 1)):
        if getattr(config, name, None):
            setattr(twin, name, value)
    for name in ("layer_types", "no_rope_layers"):
        values = getattr(config, name, None)
        derived = isinstance(getattr(type(config), getattr(type(config), "attribute_map", {}).get(name, name), None), property)
        if values and not derived:  # Falcon-H1's layer_types follow num_hidden_layers (a property, no setter)
            setattr(twin, name, [values[i] for i in kept])
    twin.num_hidden_layers = len(kept)
    twin.vocab_size = TWIN_VOCAB
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids of the real vocabulary; none is used here
        if hasattr(twin, name):
            setattr(twin, name, None)
    twin.tie_word_embeddings = False
    return twin


def build_twin(config, attention: str | None = None, seed: int = 0) -> torch.nn.Module:
    """The twin as a float32 causal LM of the installed transformers, with weights whose products are of order
    one (the libraries' 0.02 init leaves positions a 1e-5 effect on a two-layer model's logits)."""
    twin = twin_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = causal_lm_class(twin)(twin)
        with torch.no_grad():
            for p in net.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
                else:
                    p.add_(torch.randn_like(p) * 0.1)
    net.config._attn_implementation_internal = attention or default_attention(config)
    return net.float().eval()


def _ids(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TWIN_VOCAB, (1, TWIN_TOKENS), generator=g)


def _logits(net, ids, attention: str, **kwargs) -> torch.Tensor:
    before = net.config._attn_implementation
    net.config._attn_implementation_internal = attention
    try:
        with torch.no_grad():
            return net(input_ids=ids, **kwargs).logits
    finally:
        net.config._attn_implementation_internal = before


def _attention_modules(net) -> list[torch.nn.Module]:
    return [attention_module(layer) for layer in decoder_layers(net)]


def measure_alibi_eager_multiple(config, slopes_stated: torch.Tensor) -> float:
    """eager's slope over ``slopes_stated`` (the stated slopes for ``TWIN_HEADS`` heads), with every attention
    input projection of the twin zeroed (q = k = 0): softmax(m · bias) is all that is left of a row."""
    net = build_twin(config, "eager")
    with torch.no_grad():
        for module in _attention_modules(net):
            for name, p in module.named_parameters():
                if not any(out in name for out in ("dense", "out_proj", "o_proj")):
                    p.zero_()
        probs = net(input_ids=_ids(), output_attentions=True).attentions[0][0].float()  # (H, T, T)
    measured = (probs[:, -1, 1:].log() - probs[:, -1, :-1].log()).mean(-1)  # (H,)
    return float((measured / slopes_stated.float()).median())


def measure_remap_gap(config) -> tuple[float, float]:
    """(max |remapped - plain|, max |identity rotation alone - plain|) of the twin's logits, where the remap keeps
    every pair at its own position (Self-Extend with a window past the text)."""
    net = build_twin(config)
    attention = net.config._attn_implementation
    ids = _ids()
    T = ids.shape[1]
    positions = torch.arange(T)[None]
    plain = _logits(net, ids, attention, position_ids=positions)
    parent = next((m for m in net.modules() if isinstance(getattr(m, "rotary_emb", None), torch.nn.Module)), None)
    if parent is None:
        raise PosvizError("it has no rotary module (rotary_emb) for posviz to swap")
    rotary = parent.rotary_emb
    params = dict(getattr(net.config, "rope_parameters", None) or {})
    if params.get("rope_type") in ("dynamic", "longrope"):  # speeds that follow the length: the pass's, as speeds_of
        with torch.no_grad():
            rotary(torch.zeros(1, dtype=torch.float32), torch.tensor([[T - 1]]))
    speeds, types = hf_remaps.model_speeds(rotary, getattr(net.config, "layer_types", None), params)
    remap = ROPE_REMAPS["self_extend"]
    run = hf_remaps.RemapPass(remap, remap.build({"window": 4 * T, "group": 2}, 2 * T, 2 * T), 2 * T, speeds, types,
                              torch.arange(T), torch.arange(T))
    hf_remaps.register_once()
    parent.rotary_emb = hf_remaps.Unrotated(rotary)
    try:
        unrotated = _logits(net, ids, attention, position_ids=positions)
        with hf_remaps.pass_positions(run):
            remapped = _logits(net, ids, hf_remaps.ATTENTION_NAME, position_ids=positions)
    finally:
        parent.rotary_emb = rotary
    return float((remapped - plain).abs().max()), float((unrotated - plain).abs().max())


def _remap_refusal(config) -> str | None:
    family, version = config.model_type, transformers_version()
    try:
        gap, moved = measure_remap_gap(config)
    except Exception as exc:  # noqa: BLE001 - any failure of the trial is a refusal, said in words
        return (f"transformers {version}'s {family} attention could not run posviz's remap attention on a small "
                f"model of its family ({type(exc).__name__}: {exc}); the remaps enter through transformers' "
                "attention interface")
    if moved <= MOVED_LOGITS:
        return (f"on a small model of its family, transformers {version}'s {family} attention did not change when "
                "posviz took its rotation away, so posviz cannot tell where its positions enter; the remaps "
                "enter through transformers' attention interface and the model's rotary module")
    if not gap <= SAME_LOGITS:
        return (f"transformers {version}'s {family} attention does not go through its attention interface with "
                f"the rotary module posviz swaps, where posviz's remaps enter (measured on a small model of its "
                f"family: a remap that moves no position changed its logits by {gap:.2g})")
    return None


_LOCK = threading.Lock()
_MEASURED: dict[tuple, Measured] = {}


def measured(config, method: str) -> Measured:
    """What the installed transformers does with ``config``'s family; measured once per config and process (one
    at a time: many visitors opening one model wait for one measurement)."""
    # what the twin is made of: the config's fields, less where it was read from (every folder of one family
    # and shape is measured once, not once per folder)
    fields = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "name_or_path", "transformers_version")}
    key = (type(config).__name__, method, json.dumps(fields, sort_keys=True, default=str))
    with _LOCK:
        if key not in _MEASURED:
            if len(_MEASURED) >= 64:
                _MEASURED.pop(next(iter(_MEASURED)))
            _MEASURED[key] = _measure(config, method)
        return _MEASURED[key]


def _measure(config, method: str) -> Measured:
    attention = default_attention(config)
    try:
        net, ids = build_twin(config), _ids()
        positions = {} if method == "alibi" else {"position_ids": torch.arange(ids.shape[1])[None]}
        gap = float((_logits(net, ids, "eager", **positions) - _logits(net, ids, attention, **positions)).abs().max())
    except Exception:  # noqa: BLE001 - unmeasured: take the maps from eager and the scores from the default pass
        gap = math.inf
    multiple = None
    if method == "alibi":
        stated, _ = alibi_slopes_as_added(twin_config(config), TWIN_HEADS)
        multiple = measure_alibi_eager_multiple(config, stated)
    refusal = _remap_refusal(config) if method == "rope" else None
    return Measured(transformers_version(), attention, gap <= SAME_LOGITS, gap, multiple, refusal)


def remap_refusal(config, method: str) -> str | None:
    """Why a published model cannot take the remaps, in a page's words; None when it can: its positions are RoPE's,
    and a twin of it on the installed transformers runs under posviz's remap attention exactly as it runs plainly
    (its attention goes through the attention interface and rotates with the module posviz swaps)."""
    if method != "rope":
        return f"it uses {method} positions: the remaps move the positions RoPE rotates pairs by"
    refusal = measured(config, method).remap_refusal
    family = FAMILIES.get(config.model_type)
    if refusal and family is not None and family.remaps_differ:  # what in its attention the remaps do not follow
        refusal = f"{family.remaps_differ(config)} ({refusal})"
    return refusal


def eager_differs(config, method: str) -> bool:
    """Whether the family's eager attention (the one that returns probabilities) computes other logits than its
    default attention (transformers 5.24's Falcon with ALiBi added the bias twice in eager, 5.25's once). Where it
    differs, a map comes from eager attention and the scores from the default pass."""
    return not measured(config, method).eager_equals_default


def eager_alibi_notes(config) -> list[str]:
    """What eager attention (the one that returns maps) adds of the ALiBi bias, in words, as measured on a twin of
    the model with every query and key zeroed; nothing where it adds the bias once, as its default attention does."""
    probe = measured(config, "alibi")
    multiple = probe.alibi_eager_multiple
    if multiple is not None and abs(multiple - 1.0) <= 0.05 and probe.eager_equals_default:
        return []
    times = ("twice" if multiple is not None and abs(multiple - 2.0) <= 0.05
             else f"{multiple:.2f}×" if multiple is not None else "an unmeasured amount of")
    name = {"falcon": "Falcon", "bloom": "BLOOM", "mpt": "MPT"}.get(config.model_type, config.model_type)
    return [f"{name}'s eager attention, the one that returns attention maps, adds this bias {times} "
            f"(measured on transformers {probe.transformers_version}, with every query and key of a small "
            f"{name} zeroed): its maps are sharper than what its default attention computes."]
