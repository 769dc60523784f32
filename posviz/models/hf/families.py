"""How posviz reads each transformers architecture: its position method, its context and table, where its
layers and attention live, what its ALiBi really adds, and posviz's RoPE scalings in transformers' ``rope_parameters``.
"""
from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch

from posviz.errors import PosvizError


@dataclass(frozen=True)
class Family:
    """One transformers architecture: its position method and where its config keeps the facts."""

    method: Callable[[object], str]  # config -> "learned", "rope" or "alibi"
    context: Callable[[object], int | None]  # the trained context, in ids (None: not in the config)
    table_rows: Callable[[object], int | None] = lambda config: None  # positions it can represent at all
    table_name: str | None = None  # learned: the parameter holding the table
    table_offset: int = 0  # learned: rows before position 0 (OPT keeps 2)
    # (q.k dimensions of a head, of which rotate) where head_dim does not say it (MLA: head_dim is the rotated part)
    head_dims: Callable[[object], tuple[int, int]] | None = None
    notes: Callable[[object], list[str]] = lambda config: []  # what its attention does beyond its position method
    summary: Callable[[object], str] = lambda config: ""  # the picker's few words on it ("MLA: 64 of 192 q·k dims rotate")
    maps_by_hook: bool = False  # its output_attentions returns no maps: read from each attention module's output
    # (config, layer type, the generic layout row) -> the row as this family has it (DeepSeek-V4's bases and windows)
    layer_row: Callable[[object, str, dict], dict] | None = None
    # what in its attention posviz's remap attention does not do, said before the probe's measured refusal
    remaps_differ: Callable[[object], str] | None = None


V4_COMPRESSED = {"compressed_sparse_attention": "CSA", "heavily_compressed_attention": "HCA"}


def _v4_row(config, kind: str, row: dict) -> dict:
    """DeepSeek-V4: every layer's attention has a sliding window and sink logits; its compressed layers turn with the
    "compress" RoPE parameters (their compressor's entries too), the sliding ones with "main"."""
    params = (getattr(config, "rope_parameters", None) or {}).get("compress" if kind in V4_COMPRESSED else "main", {})
    return {**row, "base": float(params.get("rope_theta", row["base"] or 10000.0)), "window": int(config.sliding_window),
            "sinks": True}


def _v4_summary(config) -> str:
    rates = dict(getattr(config, "compress_rates", None) or {})
    kinds = [f"{V4_COMPRESSED[k]} 1 per {rates[k]:,} on {list(config.layer_types).count(k)}" for k in V4_COMPRESSED
             if k in config.layer_types]
    return f"window of {int(config.sliding_window):,} + compressed entries: " + ", ".join(kinds) if kinds else \
        f"window of {int(config.sliding_window):,}"


def _v4_notes(config) -> list[str]:
    rates = dict(getattr(config, "compress_rates", None) or {})
    return [f"Each layer attends the {int(config.sliding_window):,} newest keys (its sliding window) and learned sink "
            "logits; its compressed layers also attend entries that each pool a block of earlier tokens: CSA one per "
            f"{rates.get('compressed_sparse_attention', '?')} tokens, of which its indexer picks up to "
            f"{int(config.index_topk):,} for each query, HCA one per {rates.get('heavily_compressed_attention', '?')}. "
            "The maps draw an entry's weight on the tokens it pools, in the shares its compressor's gate gives them "
            "(the mean over its channels). Its keys are its values: "
            f"{int(config.qk_rope_head_dim)} of each head's {int(config.head_dim)} dimensions rotate, and turn back "
            "after attention."]


def _mla_dims(config) -> tuple[int, int]:
    """DeepSeek's MLA: each head's q.k is qk_nope_head_dim unrotated plus qk_rope_head_dim rotated dimensions (its
    config sets head_dim to the rotated part alone)."""
    return int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim), int(config.qk_rope_head_dim)


def _mla_notes(config) -> list[str]:
    return [f"MLA: each head's query and key have {config.qk_nope_head_dim} dimensions without position and "
            f"{config.qk_rope_head_dim} that rotate; the rotated key is one for all heads, and the unrotated keys and the "
            f"values come from a {config.kv_lora_rank}-dimensional latent of each token."]


def _llama4_notes(config) -> list[str]:
    rope_layers = [bool(r) for r in (getattr(config, "no_rope_layers", None) or [])]
    notes = []
    chunk = getattr(config, "attention_chunk_size", None)
    if chunk and any(rope_layers):
        notes.append(f"Its RoPE layers attend within chunks of {int(chunk):,} tokens: a query sees the keys of its own "
                     "chunk only (not a sliding window).")
    if not all(rope_layers):
        nope = [i for i, r in enumerate(rope_layers) if not r]
        notes.append(f"{len(nope)} of its {len(rope_layers)} layers {'has' if len(nope) == 1 else 'have'} no rotation (layers {', '.join(map(str, nope[:6]))}"
                     f"{', …' if len(nope) > 6 else ''})" + (
                         f", and scale their queries by 1 + {config.attn_scale} log(1 + floor((position + 1) / "
                         f"{int(config.floor_scale):,})): sharper attention deeper into the text."
                         if getattr(config, "attn_temperature_tuning", False) else "."))
    return notes


def _attr(*names):
    return lambda config: next((int(getattr(config, n)) for n in names if getattr(config, n, None)), None)


FAMILIES: dict[str, Family] = {
    "gpt2": Family(lambda c: "learned", _attr("n_positions"), _attr("n_positions"), "transformer.wpe.weight"),
    "opt": Family(lambda c: "learned", _attr("max_position_embeddings"), _attr("max_position_embeddings"),
                  "model.decoder.embed_positions.weight", 2),
    "gpt_neox": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "llama": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "qwen2": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "mistral": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "qwen3": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "gemma2": Family(lambda c: "rope", _attr("max_position_embeddings")),  # sliding-window layers between full ones
    # Gemma 3: five sliding-window layers (θ 10 k) to one full layer (θ 1 M), a rope_parameters entry per layer type
    "gemma3_text": Family(lambda c: "rope", _attr("max_position_embeddings")),
    # Phi-3 / Phi-4-mini: LongRoPE (rope_type "longrope"), per-pair factors, the long ones past the original context
    "phi3": Family(lambda c: "rope", _attr("max_position_embeddings")),
    # SmolLM3: every fourth layer has no rotation (no_rope_layers), without Llama 4's temperature
    "smollm3": Family(lambda c: "rope", _attr("max_position_embeddings")),
    # GPT-OSS: sliding-window and full layers alternating, a learned sink logit per head in every layer
    "gpt_oss": Family(lambda c: "rope", _attr("max_position_embeddings")),
    # BLOOM's config has no field for its context; bigscience's configs state it as seq_length (2,048)
    "bloom": Family(lambda c: "alibi", _attr("seq_length")),
    "falcon": Family(lambda c: "alibi" if c.alibi else "rope", _attr("max_position_embeddings")),
    "mpt": Family(lambda c: "alibi", _attr("max_seq_len"), _attr("max_seq_len")),
    # Hybrids (posviz.models.hf.mixers): their attention layers rotate, their other layers carry no position
    # LFM2: short convolutions beside attention layers (layer_types "conv" / "full_attention")
    "lfm2": Family(lambda c: "rope", _attr("max_position_embeddings")),
    # Qwen3-Next, Qwen3.5: three Gated DeltaNet layers to one gated attention layer that rotates a quarter of each head
    "qwen3_next": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "qwen3_5_text": Family(lambda c: "rope", _attr("max_position_embeddings")),
    # Granite 4.0-H: Mamba-2 beside attention that rotates only where position_embedding_type is "rope" (its
    # config fills rope_parameters either way); the published models' is NoPE
    "granitemoehybrid": Family(lambda c: "rope" if getattr(c, "position_embedding_type", None) == "rope" else "nope",
                               _attr("max_position_embeddings")),
    # OLMo-Hybrid: its attention rotates only where rope_parameters name a θ (the released models' is None: NoPE)
    "olmo_hybrid": Family(lambda c: "rope" if (getattr(c, "rope_parameters", None) or {}).get("rope_theta") is not None
                          else "nope", _attr("max_position_embeddings")),
    # Kimi Linear: its MLA layers have no rotation at all (no rotary module); order from its KDA layers
    "kimi_linear": Family(lambda c: "nope", _attr("max_position_embeddings")),
    # Falcon-H1: RoPE attention and Mamba-2 side by side in every layer
    "falcon_h1": Family(lambda c: "rope", _attr("max_position_embeddings"), maps_by_hook=True,
                        notes=lambda c: ["Every layer runs its attention and a Mamba-2 mixer side by side on the same input "
                                         "and adds their outputs: the maps are the attention's (the Extrapolation lab draws "
                                         "the Mamba-2's implied matrix under it); the Mamba-2 half reads the text token after "
                                         "token, so order also comes from there."],
                        summary=lambda c: "with Mamba-2 beside it in every layer"),
    # Nemotron-H: Mamba-2 beside attention that never rotates
    "nemotron_h": Family(lambda c: "nope", _attr("max_position_embeddings")),
    # DeepSeek-V3: MLA, a small rotated part of each head (interleaved pairs) beside an unrotated part
    "deepseek_v3": Family(lambda c: "rope", _attr("max_position_embeddings"), head_dims=_mla_dims, notes=_mla_notes,
                          summary=lambda c: "MLA: {1} of {0} q·k dims rotate".format(*_mla_dims(c))),
    # DeepSeek-V4: every layer attends a sliding window of tokens plus compressed entries of the text before it
    "deepseek_v4": Family(lambda c: "rope", _attr("max_position_embeddings"), notes=_v4_notes, summary=_v4_summary,
                          layer_row=_v4_row,
                          remaps_differ=lambda c: "its values are its keys, rotated with them and turned back at the "
                                                  "query's position after attention, and its compressed entries rotate at "
                                                  "their block's position; posviz's remap attention rotates queries and "
                                                  "keys alone"),
    # Llama 4: RoPE layers attending in chunks, every fourth layer NoPE with a query temperature
    "llama4_text": Family(lambda c: "rope", _attr("max_position_embeddings"), notes=_llama4_notes,
                          summary=lambda c: f"NoPE on {list(c.no_rope_layers).count(0)} of {c.num_hidden_layers} layers, "
                                            f"chunks of {int(c.attention_chunk_size):,} on the others"
                          if getattr(c, "attention_chunk_size", None) else ""),
}


ACTS_ON = {"learned": "input", "rope": "q/k", "alibi": "logits", "nope": "nothing"}
UNSTATED_CONTEXT = 2048  # the context of a model that states none anywhere (BLOOM's and Falcon-RW's)


def layer_layout(config) -> list[dict]:
    """What each layer does with positions, from a config alone (a model over the size cap is drawn too):
    rows {layer, position ("rope", "nope", "alibi" or "learned"), base (RoPE's θ, None without rotation),
    rotary share (of each head), window (a sliding window's keys, None: full), sinks (learned sink logits)}.
    Read from transformers' fields: ``layer_types`` and ``sliding_window`` (Gemma 2/3, GPT-OSS, Qwen), the
    ``rope_parameters`` of each layer type (Gemma 3), ``no_rope_layers`` (SmolLM3, Llama 4: 0 = no rotation),
    and GPT-OSS's sinks (every layer of its architecture has them); a hybrid's non-attention layers
    (``mixers``) by their kind."""
    family = FAMILIES.get(config.model_type)
    method = family.method(config) if family else "rope"
    n = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 0)
    types = list(getattr(config, "layer_types", None) or [])
    if not types and getattr(config, "sliding_window", None) and config.model_type == "gemma2":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    uses_rope = list(getattr(config, "no_rope_layers", None) or [1] * n)
    rope = dict(getattr(config, "rope_parameters", None) or {}) if method == "rope" else {}
    per_type = bool(rope) and all(isinstance(v, dict) for v in rope.values())
    from posviz.models.hf.mixers import layer_mixers

    mixers = layer_mixers(config)
    rows = []
    for i in range(n):
        kind = types[i] if i < len(types) else "full_attention"
        if mixers[i].kind != "attention":  # a recurrent or convolution layer: order from its own recurrence, no position
            rows.append({"layer": i, "position": mixers[i].kind, "base": None, "rotary share": 0.0, "window": None,
                         "sinks": False})
            continue
        params = rope.get(kind, rope.get("full_attention", {})) if per_type else rope
        rotates = method == "rope" and bool(uses_rope[i] if i < len(uses_rope) else 1)
        rows.append({"layer": i, "position": method if method != "rope" else ("rope" if rotates else "nope"),
                     "base": float(params.get("rope_theta", 10000.0)) if rotates else None,
                     "rotary share": (family.head_dims(config)[1] / family.head_dims(config)[0] if family and family.head_dims
                                      else float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)
                                                            or 1.0))) if rotates else 0.0,
                     "window": int(config.sliding_window) if kind == "sliding_attention" and getattr(config, "sliding_window", None)
                     else None,
                     # Llama 4: a query attends to the keys of its own chunk only
                     "chunk": int(config.attention_chunk_size) if kind == "chunked_attention" else None,
                     "sinks": config.model_type == "gpt_oss"})
        if family and family.layer_row:
            rows[-1] = family.layer_row(config, kind, rows[-1])
    return rows


def stated_elsewhere(folder: Path | None) -> int | None:
    """A context the config leaves out, from the files beside it: posviz's export note, or the tokenizer's
    model_max_length (where it is a real length, not transformers' 1e30 for "none")."""
    if folder is None:
        return None
    for name, key in (("posviz_export.json", "train_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            value = json.loads((folder / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and 1 < value < 10**7:
            return value
    return None


def supported_families() -> str:
    return ", ".join(sorted(FAMILIES))


SCALING_TO_ROPE_TYPE = {"linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3", "longrope": "longrope"}


def rope_parameters_for(own: Mapping, rotary_dims: int, train_length: int, overrides: Mapping) -> dict:
    """transformers' ``rope_parameters`` for posviz's scaling options (``{"scaling": "yarn", "factor": 4}``),
    keeping the model's own θ. "none" keeps the model's own parameters; "ntk" (static NTK-aware) is the
    default rotation with θ raised to θ s^(d/(d-2)), as transformers has no name for it."""
    scaling, factor = overrides.get("scaling", "none"), float(overrides.get("factor", 1.0))
    theta = float(own.get("rope_theta", 10000.0))
    kept = {k: own[k] for k in ("partial_rotary_factor",) if k in own}
    if scaling == "none" or (factor == 1.0 and scaling != "none"):
        return dict(own) if scaling == "none" else {"rope_type": "default", "rope_theta": theta, **kept}
    if scaling == "ntk":
        return {"rope_type": "default", "rope_theta": theta * factor ** (rotary_dims / (rotary_dims - 2)), **kept}
    if scaling not in SCALING_TO_ROPE_TYPE:
        raise PosvizError(f"Unknown RoPE scaling {scaling!r} for a published model. Known scalings: none, ntk, "
                          f"{', '.join(SCALING_TO_ROPE_TYPE)}.")
    params = {"rope_type": SCALING_TO_ROPE_TYPE[scaling], "rope_theta": theta, "factor": factor, **kept}
    if scaling in ("yarn", "llama3", "dynamic"):
        params["original_max_position_embeddings"] = int(overrides.get("original_length") or train_length)
    for ours, theirs in (("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"), ("attention_factor", "attention_factor"),
                         ("low_freq_factor", "low_freq_factor"), ("high_freq_factor", "high_freq_factor")):
        if overrides.get(ours) is not None:
            params[theirs] = float(overrides[ours])
    if scaling == "llama3":
        params.setdefault("low_freq_factor", 1.0)
        params.setdefault("high_freq_factor", 4.0)
    if scaling == "longrope":  # posviz's factors without a search (see rope_scaling.longrope): YaRN's ratios past L
        from posviz.positions.rope import RopeOptions
        from posviz.positions.rope_scaling import ROPE_SCALINGS

        opts = RopeOptions(base=theta, factor=factor, original_length=int(overrides.get("original_length") or train_length))
        theta_i = ROPE_SCALINGS["none"](rotary_dims, opts, 1)[0]
        params["long_factor"] = (theta_i / ROPE_SCALINGS["yarn"](rotary_dims, opts, 1)[0]).tolist()
        params["short_factor"] = [1.0] * len(params["long_factor"])
        params["original_max_position_embeddings"] = opts.original_length
    return params


def default_attention(config) -> str:
    """sdpa where the family's class says it supports it (``_supports_sdpa``), else eager (BLOOM, MPT, Gemma 2's
    soft-capped logits): read from the installed library's class, as transformers itself decides."""
    from transformers import AutoModelForCausalLM

    return "sdpa" if getattr(AutoModelForCausalLM._model_mapping[type(config)], "_supports_sdpa", False) else "eager"


def sdpa_ok(config) -> bool:
    return default_attention(config) == "sdpa"


def modeling_module(config):
    """transformers' modeling module of the config's causal LM (Gemma 3's text model lives in models/gemma3/)."""
    from transformers import AutoModelForCausalLM

    return importlib.import_module(AutoModelForCausalLM._model_mapping[type(config)].__module__)


def decoder_layers(net) -> torch.nn.ModuleList:
    n = net.config.num_hidden_layers
    for module in net.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise PosvizError(f"cannot find the {n} decoder layers of {type(net).__name__}")


def attention_module(layer) -> torch.nn.Module:
    for name in ("self_attn", "attn", "attention", "self_attention"):
        if isinstance(getattr(layer, name, None), torch.nn.Module):
            return getattr(layer, name)
    raise PosvizError(f"cannot find the attention of {type(layer).__name__}")


def alibi_slopes_as_added(config, n_head: int) -> tuple[torch.Tensor, list[str]]:
    """(H,) the bias per unit of distance the model adds to its attention logits (after the 1/sqrt(d)
    scaling), from the family's own bias builder; and what differs from the ALiBi paper. What its eager
    attention adds of it is measured, not read here (``probes.eager_alibi_notes``)."""
    module, notes = modeling_module(config), []
    n = 8
    if config.model_type == "mpt":
        bias = module.build_mpt_alibi_tensor(n_head, n, alibi_bias_max=config.attn_config.alibi_bias_max)  # (H, 1, n)
        slopes = (bias[:, 0, -1] - bias[:, 0, -2]).float()
    else:
        mask = torch.ones(1, n, dtype=torch.long)
        bias = module.build_alibi_tensor(mask, n_head, torch.float32).reshape(n_head, n)
        slopes = (bias[:, 1] - bias[:, 0]).float()
        if config.model_type == "falcon":
            head_dim = config.hidden_size // n_head
            slopes = slopes / math.sqrt(head_dim)
            notes.append(f"Falcon divides its ALiBi bias by √(head dim) = √{head_dim} along with q·k, so its slopes "
                         f"are the paper's / {math.sqrt(head_dim):.2f}, and it builds the bias in bfloat16.")
    return slopes, notes
