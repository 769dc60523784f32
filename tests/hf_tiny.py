"""Tiny random published-model families, saved as a hub model would be, for offline tests.

Each family in ``FAMILIES`` is a transformers config (2 layers, 4 heads, hidden 32 or 64, a ~64-token
context) for one published causal LM; ``save_family`` builds it with seeded random weights and saves it
the way a hub repository holds it: config.json, model.safetensors, generation_config.json, and a
byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json) trained offline on Python stdlib
source. ``transformers.AutoModelForCausalLM/AutoTokenizer.from_pretrained(folder)`` load every one
with HF_HUB_OFFLINE=1. The bad-input makers (``save_pickle_only``, ``save_remote_code``,
``save_unsupported``, ``save_oversized_config``) write what a loader must refuse.

transformers is imported inside the functions, so importing this module (e.g. from conftest.py) is cheap.

What transformers 5.24 computes for positions in these families (tests/test_hf_tiny.py checks each):

- gpt2: learned absolute table ``transformer.wpe.weight``, (n_positions, n_embd) = (64, 32), added to
  the token embeddings; position ids 0.. (past_seen_tokens + arange); saved in model.safetensors.
- opt: learned table ``model.decoder.embed_positions.weight`` (OPTLearnedPositionalEmbedding) with
  max_position_embeddings + 2 = 66 rows: ``offset = 2``, position ids come from ``cumsum(attention_mask) - 1``
  and row ``position + 2`` is read (rows 0 and 1 are never used by unpadded text).
- neox (Pythia): one model-level ``gpt_neox.rotary_emb.inv_freq`` shared by all layers, length
  rotary_dims / 2 = int(head_dim 16 * partial_rotary_factor 0.25) / 2 = 2; only the first 4 dims of each
  head rotate (NeoX half-split pairing, ``rotate_half``). 5.x config: ``rope_parameters = {"rope_type":
  "default", "rope_theta", "partial_rotary_factor"}``; legacy config.json keys ``rotary_pct`` and
  ``rotary_emb_base`` are read once (``rotary_pct`` defaults to 0.25) and not kept as attributes.
- llama3 / llama_yarn / qwen2: ``model.rotary_emb.inv_freq`` (model level, length head_dim / 2 = 8), a
  non-persistent buffer (not in model.safetensors; rebuilt from ``config.rope_parameters`` at load, plus
  ``original_inv_freq``). llama3's buffer is already rescaled (``_compute_llama3_parameters``: wavelengths
  over original/low_freq_factor = 32 divided by factor 8, under original/high_freq_factor = 8 kept, smooth
  in between; with theta 1e5 and head_dim 16 all three bands occur). yarn's buffer is the blended one
  (``_compute_yarn_parameters``) and ``rotary_emb.attention_scaling`` = 0.1 ln(factor) + 1 multiplies cos
  and sin. qwen2 is plain RoPE, theta 1e6, with 2 key/value heads (GQA).
- bloom: no position parameters and no maximum length. ``BloomModel.forward`` builds ALiBi itself when no
  attention_mask is given (``_get_alibi_slopes(num_heads) * arange(kv_length)``), otherwise
  ``modeling_bloom.build_alibi_tensor(attention_mask, num_heads, dtype)`` (positions from the mask's
  cumsum); it is added unscaled: ``alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(head_dim))``.
- falcon (alibi=True, Falcon-RW style): ``modeling_falcon.build_alibi_tensor`` (same slopes as BLOOM,
  but ``slopes.bfloat16() * positions``, so rounded for non-power-of-two slopes) is divided by
  sqrt(head_dim) and put into the attention mask, i.e. added to q.k *before* the 1/sqrt(head_dim) scale:
  effective slopes are BLOOM's / sqrt(head_dim). The model still builds ``transformer.rotary_emb``
  (inv_freq of length head_dim / 2) and computes cos/sin, but attention skips rotary when alibi is set.
  Default attention is sdpa, which matches the original Falcon-RW code, (q.k + alibi) / sqrt(head_dim).
  The eager path, which ``output_attentions=True`` also takes, adds ALiBi twice (once in the scores, once
  through the mask): its logits equal sdpa's with the ALiBi doubled. Attention maps read from Falcon
  with output_attentions are of that doubled-ALiBi model (a regression of the fixed transformers #29946).
- Attention implementations: bloom and mpt have eager only; the others default to sdpa, and eager gives
  the same logits (within 1e-6) for all but falcon.
- mpt: ``modeling_mpt.build_mpt_alibi_tensor(num_heads, config.max_seq_len, alibi_bias_max=8)`` is built
  for the whole max_seq_len on every forward, as ``slope * (key - last)`` (non-positive), sliced to the
  key length and added after the softmax scale. A forward longer than ``max_seq_len`` (64 here) fails with
  a RuntimeError (tensor size mismatch), so MPT cannot run past its configured context.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EOS = "<|endoftext|>"
VOCAB_SIZE = 384  # 256 byte symbols + EOS + 127 merges: about 2 bytes per token on stdlib source
CONTEXT = 64


@dataclass(frozen=True)
class Family:
    """One published family: its config class (a name in ``transformers``), the keyword arguments of
    the tiny config (vocab and special token ids are added by ``family_config``), the position method
    posviz should recognise, and the trained context its config states (None: the config has none)."""

    config_class: str
    kwargs: dict = field(default_factory=dict)
    position: str = ""
    context: int | None = CONTEXT
    seed: int = 0


_ROPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=CONTEXT)

FAMILIES: dict[str, Family] = {
    "gpt2": Family("GPT2Config", dict(n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=4), "learned", seed=1),
    "opt": Family("OPTConfig", dict(max_position_embeddings=CONTEXT, hidden_size=32, word_embed_proj_dim=32,
                                    ffn_dim=128, num_hidden_layers=2, num_attention_heads=4),
                  "learned (offset 2)", seed=2),
    "neox": Family("GPTNeoXConfig", dict(_ROPE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                  "partial_rotary_factor": 0.25}),
                   "rope (partial, 25%)", seed=3),
    "llama3": Family("LlamaConfig", dict(_ROPE, num_key_value_heads=4, rope_parameters={
        "rope_type": "llama3", "rope_theta": 100000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}), "rope (llama3 scaling)", seed=4),
    # max_position_embeddings = factor * original, as YaRN-extended published configs state it: with 64,
    # transformers warns that the implicit factor (64 / 32 = 2) disagrees with the explicit 4.
    "llama_yarn": Family("LlamaConfig", dict(_ROPE, max_position_embeddings=128, num_key_value_heads=4,
                                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                              "factor": 4.0, "original_max_position_embeddings": 32}),
                         "rope (yarn scaling)", context=128, seed=5),
    "qwen2": Family("Qwen2Config", dict(_ROPE, num_key_value_heads=2,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                    "rope (theta 1e6, GQA)", seed=6),
    "qwen3": Family("Qwen3Config", dict(_ROPE, num_key_value_heads=2, head_dim=16,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                    "rope (theta 1e6, GQA, q/k norms)", seed=11),
    # Gemma 2's arrangement: every other layer attends through a sliding window (16 here), soft-capped logits
    "gemma2": Family("Gemma2Config", dict(_ROPE, num_key_value_heads=2, head_dim=16, sliding_window=16,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                     "rope (sliding-window and full layers)", seed=13),
    # Gemma 3's arrangement: sliding-window layers with θ 1e4 and full layers with θ 1e6 (here 1 of each)
    "gemma3": Family("Gemma3TextConfig", dict(_ROPE, num_key_value_heads=2, head_dim=16, sliding_window=16,
                                              layer_types=["sliding_attention", "full_attention"],
                                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                               "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
                     "rope (local θ 1e4, global θ 1e6)", seed=14),
    # Phi-3-mini-128k's arrangement at this size: LongRoPE with per-pair short and long factors (head_dim 16:
    # 8 pairs), an original context of 32 and 128 stated; the long factors apply past the original context.
    "phi3": Family("Phi3Config", dict(_ROPE, max_position_embeddings=128, num_key_value_heads=4,
                                      original_max_position_embeddings=32, rope_parameters={
                                          "rope_type": "longrope", "rope_theta": 10000.0,
                                          "short_factor": [1.0, 1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.4],
                                          "long_factor": [1.0, 1.2, 1.5, 2.0, 2.8, 3.5, 4.0, 4.2],
                                          "original_max_position_embeddings": 32}),
                   "rope (longrope)", context=128, seed=12),
    # SmolLM3's arrangement: layers without rotation between rotary ones (no_rope_layers; SmolLM3 has every
    # fourth, here every second of the two)
    "smollm3": Family("SmolLM3Config", dict(_ROPE, no_rope_layer_interval=2, num_key_value_heads=2,
                                            rope_parameters={"rope_type": "default", "rope_theta": 5e6}),
                      "rope (every fourth layer NoPE)", seed=15),
    "bloom": Family("BloomConfig", dict(hidden_size=32, n_layer=2, n_head=4), "alibi", context=None, seed=7),
    "falcon": Family("FalconConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True,
                                          new_decoder_architecture=False, parallel_attn=False, bias=True,
                                          multi_query=False, max_position_embeddings=CONTEXT),
                     "alibi (scaled by 1/sqrt(head_dim))", seed=8),
    "mpt": Family("MptConfig", dict(d_model=32, n_layers=2, n_heads=4, expansion_ratio=4, max_seq_len=CONTEXT),
                  "alibi (MPT, hard max_seq_len)", seed=9),
}

# Hybrids of 2025-26: recurrent or convolution layers beside attention layers (``posviz.models.hf.mixers``), 4 layers
# each, their arrangement from the config's layer_types as the published ones have it at this size.
_HYBRID = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=CONTEXT)
_DELTANET = dict(_HYBRID, head_dim=16, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
HYBRIDS: dict[str, Family] = {
    # LFM2: short convolutions (3 taps) at layers 0 and 2, RoPE attention at 1 and 3
    "lfm2": Family("Lfm2Config", dict(_HYBRID, full_attn_idxs=[1, 3]), "rope on attention layers 1, 3", seed=21),
    # Qwen3-Next: Gated DeltaNet at layers 0-2, gated attention rotating 25 % of each head at 3; a mixture of experts
    "qwen3_next": Family("Qwen3NextConfig", dict(_DELTANET, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                                                 moe_intermediate_size=32, shared_expert_intermediate_size=32),
                         "rope (25 %) on attention layer 3", seed=22),
    # Qwen3.5's text model: as Qwen3-Next with a dense MLP, and 8 value heads (4 per key head), twice the attention's 4
    "qwen3_5": Family("Qwen3_5TextConfig", dict(_DELTANET, linear_num_value_heads=8), "rope (25 %) on attention layer 3",
                      seed=23),
    # Granite 4.0-H: Mamba-2 at layers 0-2 (8 heads of 16 channels, state 16, one group), NoPE attention at 3 (as
    # published: no position_embedding_type), a mixture of experts
    "granite4": Family("GraniteMoeHybridConfig", dict(_HYBRID, layer_types=["mamba", "mamba", "mamba", "attention"],
                                                      num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64,
                                                      mamba_n_heads=8, mamba_d_state=16, mamba_chunk_size=8),
                       "nope on attention layer 3", seed=24),
    # Nemotron-H: its pattern string, M Mamba-2 (2 groups), - an MLP layer, * NoPE attention
    "nemotron_h": Family("NemotronHConfig", dict(_HYBRID, hybrid_override_pattern="M-M*", head_dim=16, mamba_num_heads=8,
                                                 mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=8),
                         "nope on attention layer 3", seed=25),
    # OLMo-Hybrid: Gated DeltaNet at layers 0-2 (4 value heads on 2 key heads, beta doubled), attention at 3 without
    # rotation, as released (rope_theta None)
    "olmo_hybrid": Family("OlmoHybridConfig", dict(_DELTANET, linear_num_value_heads=4, linear_allow_neg_eigval=True,
                                                   rope_parameters={"rope_type": "default", "rope_theta": None}),
                          "nope on attention layer 3", seed=28),
    # Kimi Linear: Kimi Delta Attention at layers 0-2, MLA without rotation at 3 (a 16-dimensional kv latent)
    "kimi_linear": Family("KimiLinearConfig", dict(_HYBRID, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
                                                   qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                                   moe_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                                   linear_head_dim=16, linear_num_heads=4,
                                                   layer_types=["linear_attention"] * 3 + ["full_attention"]),
                          "nope on MLA layer 3", seed=29),
    # Falcon-H1: RoPE attention and Mamba-2 (4 heads of 16 channels) side by side in every layer
    # (its muP multipliers away from one, so that a Mamba-2 map that leaves them out fails its test)
    "falcon_h1": Family("FalconH1Config", dict(_HYBRID, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_state=16,
                                               mamba_chunk_size=8, ssm_in_multiplier=0.6,
                                               ssm_multipliers=[1.3, 0.8, 1.5, 0.7, 1.2]), "rope with Mamba-2 beside it", seed=30),
    # DeepSeek-V3: MLA in every layer, each head's q.k of 16 unrotated and 8 rotated dimensions, the rotated key one for
    # all heads, q and kv through low-rank latents; a mixture of experts after the first layer
    "deepseek_v3": Family("DeepseekV3Config", dict(_HYBRID, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
                                                   qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                                   moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                                                   n_group=2, topk_group=1, first_k_dense_replace=1),
                          "rope on 8 of each head's 24 q.k dimensions", seed=26),
    # Llama 4's text model: RoPE layers attend within chunks (8 tokens here), every fourth layer NoPE with a
    # length-dependent query temperature
    # DeepSeek-V4: a sliding window of 8 keys in every layer, compressed entries of 4 tokens (CSA, its indexer picking
    # 4 for each query) or of 16 (HCA) beside it; keys equal to values, 4 of 32 dimensions rotating; sink logits
    "deepseek_v4": Family("DeepseekV4Config", dict(
        _HYBRID, num_key_value_heads=1, head_dim=32, q_lora_rank=24, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16,
        index_topk=4, compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16}, hc_mult=2,
        num_nextn_predict_layers=0, layer_types=["sliding_attention", "compressed_sparse_attention",
                                                 "heavily_compressed_attention", "compressed_sparse_attention"]),
        "rope in a sliding window beside compressed entries", seed=31),
    "llama4": Family("Llama4TextConfig", dict(_HYBRID, head_dim=16, intermediate_size_mlp=128, num_local_experts=4,
                                              attention_chunk_size=8), "rope in chunks, NoPE every fourth layer", seed=27),
}

ALL_FAMILIES = {**FAMILIES, **HYBRIDS}

# Causal LMs of transformers that posviz has no position method for (no attention at all).
UNSUPPORTED = Family("MambaConfig", dict(hidden_size=32, num_hidden_layers=2, state_size=4, expand=2,
                                         conv_kernel=4), "none (state space, no attention)", context=None, seed=10)

# Llama-3-70B's shapes: about 70.6e9 parameters, known from config.json alone.
OVERSIZED = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                 num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
                 bos_token_id=128000, eos_token_id=128001)


# ------------------------------------------------------------------------------------------ tokenizer

def training_text() -> str:
    """About 60 kB of Python stdlib source: the tokenizer's training text and a round-trip sample."""
    import inspect
    import json.decoder
    import json.encoder
    import string
    import textwrap

    return "".join(inspect.getsource(module) for module in (json.decoder, json.encoder, textwrap, string))


@lru_cache(maxsize=None)
def _trained_tokenizer_json(vocab_size: int) -> str:
    """A byte-level BPE (GPT-2's pipeline) trained on ``training_text``, as tokenizer.json text; once per process."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([training_text()], trainer=trainer)
    assert tokenizer.get_vocab_size() == vocab_size, tokenizer.get_vocab_size()
    return tokenizer.to_str()


def make_tokenizer(folder, vocab_size: int = VOCAB_SIZE, model_max_length: int | None = None) -> Path:
    """Write tokenizer.json and a GPT-2-style tokenizer_config.json (EOS = BOS = UNK = ``<|endoftext|>``, id 0)
    into ``folder``; ``AutoTokenizer.from_pretrained(folder)`` then gives a GPT2Tokenizer.
    ``model_max_length`` as the hub's GPT-2 states it (1024 there); None leaves it unset, as BLOOM's does."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(_trained_tokenizer_json(vocab_size), encoding="utf-8")
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {"0": {"content": EOS, "lstrip": False, "normalized": True, "rstrip": False,
                                       "single_word": False, "special": True}},
        "bos_token": EOS, "eos_token": EOS, "unk_token": EOS,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "GPT2Tokenizer",
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


def eos_id() -> int:
    return json.loads(_trained_tokenizer_json(VOCAB_SIZE))["model"]["vocab"][EOS]


# ----------------------------------------------------------------------------------------------- models

def family_config(spec: Family | str):
    """The tiny config of a family (a name in FAMILIES, or a Family), vocab and special ids set to the tokenizer's."""
    import transformers

    spec = ALL_FAMILIES[spec] if isinstance(spec, str) else spec
    cls = getattr(transformers, spec.config_class)
    token = eos_id()
    return cls(vocab_size=VOCAB_SIZE, bos_token_id=token, eos_token_id=token, pad_token_id=None, **spec.kwargs)


def build_family(spec: Family | str):
    """The family's CausalLM with seeded default-init weights (the global RNG is left as it was), in eval mode."""
    from transformers import AutoModelForCausalLM

    spec = ALL_FAMILIES[spec] if isinstance(spec, str) else spec
    config = family_config(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config)
    return model.eval()


def _save(spec: Family, folder) -> Path:
    folder = Path(folder)
    build_family(spec).save_pretrained(folder)  # transformers 5.x always writes model.safetensors
    make_tokenizer(folder, model_max_length=spec.context)
    return folder


def save_family(name: str, folder) -> Path:
    """Save the tiny ``name`` model (config.json, model.safetensors, generation_config.json) and the
    tokenizer into ``folder``, as a hub repository holds them; returns ``folder`` as a Path."""
    return _save(ALL_FAMILIES[name], folder)


# ------------------------------------------------------------------------------------------ bad inputs

def save_pickle_only(folder, name: str = "gpt2") -> Path:
    """A family saved as old hub repos are: config.json + pytorch_model.bin (a pickle), no safetensors.
    transformers 5.x save_pretrained has no ``safe_serialization`` switch any more (it always writes
    safetensors), so the state dict is written with torch.save, as 4.x wrote it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_family(name)
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    make_tokenizer(folder, model_max_length=FAMILIES[name].context)
    return folder


REMOTE_CODE_TRIPWIRE = "posviz ran a model repository's own code"


def save_remote_code(folder) -> Path:
    """A trust_remote_code repository: config.json with an unknown ``model_type`` and an ``auto_map`` naming
    the repository's own Python files, which are present and raise if ever imported (a tripwire: nothing
    should execute them). Plus a tokenizer, so only the code makes it unloadable."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["PosvizCustomForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_custom.PosvizCustomConfig",
                     "AutoModelForCausalLM": "modeling_custom.PosvizCustomForCausalLM"},
        "model_type": "posviz_custom_lm",
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": CONTEXT,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    for module in ("configuration_custom.py", "modeling_custom.py"):
        (folder / module).write_text(f"raise RuntimeError({REMOTE_CODE_TRIPWIRE!r})\n", encoding="utf-8")
    make_tokenizer(folder, model_max_length=CONTEXT)
    return folder


def save_unsupported(folder) -> Path:
    """A causal LM transformers loads (AutoModelForCausalLM works) whose position method posviz does not
    know: Mamba, a state-space model with no attention and no position encoding at all."""
    return _save(UNSUPPORTED, folder)


def save_oversized_config(folder) -> Path:
    """config.json of Llama-3-70B (about 70.6e9 parameters) and its tokenizer, without any weights:
    a parameter cap must refuse it from the config alone, before downloading anything."""
    from transformers import LlamaConfig

    folder = Path(folder)
    LlamaConfig(**OVERSIZED).save_pretrained(folder)
    make_tokenizer(folder, model_max_length=OVERSIZED["max_position_embeddings"])
    return folder


def llama_parameter_count(config) -> int:
    """Parameters of a Llama-architecture CausalLM from its config alone (no weights, no model built)."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q_out, kv_out = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    attention = h * q_out + 2 * h * kv_out + q_out * h
    mlp = 3 * h * inter
    per_layer = attention + mlp + 2 * h  # two RMSNorm weights
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return layers * per_layer + embeddings + h  # + final norm


# ---------------------------------------------------------------------------------------------- fixture

class FamilyDirs(Mapping):
    """name -> saved folder, for every name in FAMILIES and HYBRIDS (iterated: FAMILIES); each family is saved the first time it is asked
    for (about 0.1 s), under one root folder (``.root``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._saved: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in ALL_FAMILIES:
            raise KeyError(name)
        if name not in self._saved:
            self._saved[name] = save_family(name, self.root / name)
        return self._saved[name]

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


@pytest.fixture(scope="session")
def hf_family_dir(tmp_path_factory) -> FamilyDirs:
    """``hf_family_dir["gpt2"]``: the folder of a saved tiny family (saved on first use, once per session)."""
    return FamilyDirs(tmp_path_factory.mktemp("hf_families"))
