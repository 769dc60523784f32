"""A saved tiny LFM2 (``hf_tiny.save_family("lfm2", folder)``) written as a GGUF file, as llama.cpp keeps models;
and a saved tiny Qwen3.5 text model (``save_qwen35_gguf``, below).

``save_lfm2_gguf`` writes every weight of the folder's model.safetensors in float32 (a tied output matrix stored
once, as token_embd), its config.json as llama.cpp's ``lfm2.*`` metadata and its byte-level BPE tokenizer.json as a
``gpt2`` vocabulary (tokens in their byte-level spelling, token types, merges, special ids). Tensor names come from
gguf-py's own map for ``MODEL_ARCH.LFM2``.

It is the inverse of what transformers reads (``transformers/integrations/gguf``): ``gguf_config_mapping._lfm2_config``
(which layers attend, from the per-layer ``attention.head_count_kv``: 0 on a convolution layer; the feed-forward width
as the final one, ``block_auto_adjust_ff_dim`` off), ``gguf_conversion_mapping._lfm2`` (the names, and the convolution
kernel squeezed to 2-D, which it unsqueezes) and ``gguf_tokenizer_mapping`` (``byte_level_tokenizer``; the control
tokens added as special tokens).
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
from safetensors.numpy import load_file

ARCH = gguf.MODEL_ARCH.LFM2


def _feed_forward_width(tensors: dict) -> int:
    """The width the model runs with: LFM2's config may rescale ``intermediate_size`` (block_auto_adjust_ff_dim),
    while the file states the final one, so it is read from the first feed-forward matrix itself."""
    return int(tensors["model.layers.0.feed_forward.w1.weight"].shape[0])


def _add_metadata(writer: gguf.GGUFWriter, config: dict, tensors: dict, name: str) -> None:
    n_layer = config["num_hidden_layers"]
    attending = [kind == "full_attention" for kind in config["layer_types"]]
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(n_layer)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(_feed_forward_width(tensors))
    writer.add_head_count(config["num_attention_heads"])
    # llama.cpp's way of saying which layers attend: a key-value head count per layer, 0 on a convolution layer
    writer.add_head_count_kv([config["num_key_value_heads"] if a else 0 for a in attending])
    writer.add_layer_norm_rms_eps(config["norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_shortconv_l_cache(config["conv_L_cache"])
    writer.add_vocab_size(config["vocab_size"])


def _add_tokenizer(writer: gguf.GGUFWriter, tokenizer: dict, config: dict) -> None:
    """A GPT-2-style byte-level BPE: the vocabulary in id order, spelt as tokenizer.json spells it (the byte-level
    alphabet), the added special tokens as CONTROL, the merges as "left right" strings."""
    vocab = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "the vocabulary's ids are not 0..n-1"
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # GPT-2's split regex: transformers keeps GPT2Tokenizer's own pre-tokenizer
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        if config.get(key) is not None:
            add(config[key])
    if tokenizer["model"].get("unk_token") in vocab:
        writer.add_unk_token_id(vocab[tokenizer["model"]["unk_token"]])
    writer.add_add_bos_token(False)


def _opened(folder: Path, out_file: Path, model_type: str, arch):
    """The saved model's config, its tensors, gguf-py's tensor-name map for ``arch`` and a writer of ``out_file``."""
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == model_type, config["model_type"]
    tensors = load_file(str(folder / "model.safetensors"))
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    return config, tensors, names, gguf.GGUFWriter(str(out_file), gguf.MODEL_ARCH_NAMES[arch])


def save_lfm2_gguf(folder: Path, out_file: Path) -> Path:
    """Write the tiny LFM2 saved in ``folder`` (config.json, model.safetensors, tokenizer.json) to ``out_file``, an
    F32 GGUF file; returns ``out_file``."""
    folder, out_file = Path(folder), Path(out_file)
    config, tensors, names, writer = _opened(folder, out_file, "lfm2", ARCH)
    _add_metadata(writer, config, tensors, folder.name)
    _add_tokenizer(writer, json.loads((folder / "tokenizer.json").read_text()), config)
    for hf_name, value in sorted(tensors.items()):
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # tied: llama.cpp writes no output.weight, which is how transformers knows it is tied
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"gguf-py's LFM2 map has no name for {hf_name}")
        if name.endswith("shortconv.conv.weight"):
            value = value.squeeze(1)  # (channels, 1, taps) -> (channels, taps), as llama.cpp stores it
        writer.add_tensor(name, value.astype("float32"))  # a numpy shape: gguf-py writes ggml's reversed dims
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_file


# Qwen3.5's text model. ``save_qwen35_gguf`` is the inverse of transformers' ``gguf_config_mapping._qwen35_config`` (the
# shape as llama.cpp's ``qwen35.*`` keys: the value width stated whole as ``ssm.inner_size``, the key head width as
# ``ssm.state_size``, the rotary width in dimensions, the rope sections padded to four) and of
# ``gguf_conversion_mapping._qwen35``, which undoes five things llama.cpp does to the weights, each done here: the
# names (gguf-py's map for ``MODEL_ARCH.QWEN35``), the zero-centred norms stored as ``w + 1`` (all but ``ssm_norm``),
# ``A_log`` stored as ``-exp(A_log)``, the convolution kernel squeezed to 2-D, and the value heads tiled
# (``v0k0 v0k1 v1k0 ...``) where transformers groups them by key head (``v0k0 v1k0 ... v0k1 ...``): on the rows of
# in_proj_z, of the value block of in_proj_qkv and conv1d, of in_proj_a, in_proj_b, A_log and dt_bias, and on the
# columns of out_proj. The attention's q_proj (its query and gate together), k, v, o and the MLP are renamed only.
QWEN35 = gguf.MODEL_ARCH.QWEN35
_OFFSET_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight",
                 "model.norm.weight")


def _grouped_to_tiled(n_key_heads: int, per_key_head: int, width: int = 1):
    """Row indices turning a grouped value axis (key head, value head within it, element) into llama.cpp's tiled one
    (value head within a key head, key head, element): ``tiled = grouped[index]``."""
    import numpy as np

    return np.arange(n_key_heads * per_key_head * width).reshape(n_key_heads, per_key_head, width) \
        .transpose(1, 0, 2).reshape(-1)


def _qwen35_tensor(hf_name: str, value, config: dict):
    """One weight as llama.cpp stores it (numpy float32), and the name gguf-py's map knows it by."""
    import numpy as np

    n_key, n_value = config["linear_num_key_heads"], config["linear_num_value_heads"]
    per_key, v_dim = n_value // n_key, config["linear_value_head_dim"]
    qk_rows = 2 * config["linear_key_head_dim"] * n_key
    per_value, per_head = _grouped_to_tiled(n_key, per_key, v_dim), _grouped_to_tiled(n_key, per_key)
    value = value.astype(np.float32)
    if hf_name.endswith(_OFFSET_NORMS):
        value = value + 1.0
    elif hf_name.endswith("linear_attn.A_log"):
        value = -np.exp(value[per_head])
    elif hf_name.endswith("linear_attn.dt_bias"):
        value, hf_name = value[per_head], hf_name.replace(".dt_bias", ".dt_proj.bias")  # llama.cpp's converter's name
    elif hf_name.endswith(("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight")):
        value = value[per_head]
    elif hf_name.endswith("linear_attn.in_proj_z.weight"):
        value = value[per_value]
    elif hf_name.endswith("linear_attn.in_proj_qkv.weight"):
        value = np.concatenate([value[:qk_rows], value[qk_rows:][per_value]])
    elif hf_name.endswith("linear_attn.conv1d.weight"):
        value = value.squeeze(1)  # (channels, 1, taps) -> (channels, taps)
        value = np.concatenate([value[:qk_rows], value[qk_rows:][per_value]])
    elif hf_name.endswith("linear_attn.out_proj.weight"):
        value = value[:, per_value]
    return hf_name, np.ascontiguousarray(value)


def _add_qwen35_metadata(writer: gguf.GGUFWriter, config: dict, name: str) -> None:
    rope = config["rope_parameters"]
    head_dim = config["head_dim"]
    interval = config.get("full_attention_interval")
    if interval is None:  # stated as layer_types: every interval-th layer attends
        interval = config["layer_types"].index("full_attention") + 1
    assert config["layer_types"] == ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                     for i in range(config["num_hidden_layers"])], config["layer_types"]
    # the sections transformers' Qwen3.5 rotary embedding uses when the config states none, padded to four
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_full_attention_interval(interval)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    writer.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(config["linear_key_head_dim"])
    writer.add_ssm_group_count(config["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(config["linear_num_value_heads"])
    writer.add_ssm_inner_size(config["linear_value_head_dim"] * config["linear_num_value_heads"])
    writer.add_vocab_size(config["vocab_size"])


def save_qwen35_gguf(folder: Path, out_file: Path) -> Path:
    """Write the tiny Qwen3.5 text model saved in ``folder`` (config.json, model.safetensors, tokenizer.json) to
    ``out_file``, an F32 GGUF file of architecture ``qwen35``; returns ``out_file``."""
    folder, out_file = Path(folder), Path(out_file)
    config, tensors, names, writer = _opened(folder, out_file, "qwen3_5_text", QWEN35)
    _add_qwen35_metadata(writer, config, folder.name)
    _add_tokenizer(writer, json.loads((folder / "tokenizer.json").read_text()), config)
    for hf_name, value in sorted(tensors.items()):
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # tied: no output.weight
        hf_name, value = _qwen35_tensor(hf_name, value, config)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"gguf-py's QWEN35 map has no name for {hf_name}")
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_file
