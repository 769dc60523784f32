"""A saved tiny LFM2 (``hf_tiny.save_family("lfm2", folder)``) written as a GGUF file, as llama.cpp keeps models.

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


def save_lfm2_gguf(folder: Path, out_file: Path) -> Path:
    """Write the tiny LFM2 saved in ``folder`` (config.json, model.safetensors, tokenizer.json) to ``out_file``, an
    F32 GGUF file; returns ``out_file``."""
    folder, out_file = Path(folder), Path(out_file)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "lfm2", config["model_type"]
    tensors = load_file(str(folder / "model.safetensors"))
    names = gguf.get_tensor_name_map(ARCH, config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(out_file), gguf.MODEL_ARCH_NAMES[ARCH])
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
