"""Export posviz checkpoints as Hugging Face transformers models, with a byte-level tokenizer.

``python -m posviz.export --checkpoint rope --to models/hf/rope-neox`` writes a folder that
``transformers.AutoModelForCausalLM.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)``
load with nothing from posviz. Three position methods have a transformers architecture that computes
what posviz computes:

=========  ======================  ==================================================================
method     architecture            what differs from posviz (``tests/test_export.py`` checks each)
=========  ======================  ==================================================================
learned    GPT2LMHeadModel         nothing: same layers in the same order (float64: 3e-14 apart).
rope       GPTNeoXForCausalLM      HF computes the rotation angles p * theta_i in float32, posviz in
                                   float64, so the angles differ by up to ~p * 6e-8 rad and the logits
                                   drift apart slowly with position; see ``export_neox``.
alibi      BloomForCausalLM        BLOOM's bias carries a per-row constant of size slope * p that
                                   float32 resolves coarsely at long lengths; see ``export_alibi``.
=========  ======================  ==================================================================

Measured on the shipped checkpoints with real text (the validation stream, float32, eager and SDPA
alike), max |logit diff| (logits reach ~26) and |bits/byte diff|:

=========  ====================  ====================  ====================
export     256 bytes             1,024 bytes           4,096 bytes
=========  ====================  ====================  ====================
learned    1.5e-5, 1e-7          (table has 256 rows)
rope       3.2e-5, 3e-7          1.8e-4, 4e-7          7.0e-4, 9e-7
alibi      2.8e-5, 1e-7          1.7e-4, 3e-7          7.0e-4, 3e-7
=========  ====================  ====================  ====================

For scale, posviz in float32 against itself in float64: 1.3e-5 to 4.2e-5 at these lengths. The tests
hold logits to 1e-4 on small models (where the scores are small) and at the train length, to 4e-4 at
1,024 bytes on the shipped rope and alibi models (2x what was measured), and bits/byte to 1e-4.

Architectures: GPT-2 (Radford et al. 2019,
https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf),
GPT-NeoX (Black et al. 2022, https://arxiv.org/abs/2204.06745) with RoPE (Su et al. 2021,
https://arxiv.org/abs/2104.09864), BLOOM (BigScience 2022, https://arxiv.org/abs/2211.05100) with ALiBi
(Press et al. 2022, https://arxiv.org/abs/2108.12409). Transformers code read: 5.24
(``models/{gpt2,gpt_neox,bloom,mpt,falcon}/modeling_*.py``).

Every folder holds ``config.json`` (with ``architectures``, ``model_type``, ``torch_dtype``),
``model.safetensors`` (each tensor in float16 where its values are all float16 values, as the shipped weights
are, else in float32;
``config.json`` says float32, so transformers loads it into float32 and runs it as posviz does), ``tokenizer.json`` + ``tokenizer_config.json`` (see
``byte_tokenizer``) and ``posviz_export.json`` (source checkpoint, method, train_length).

Nothing here imports transformers or tokenizers at import time (the app runs the shipped checkpoints
without them); only ``byte_tokenizer`` needs tokenizers, which transformers brings.

Shape legend: V vocab (256 bytes), C n_embd, H n_head, hs head size (C / H), L n_layer.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from posviz.errors import PosvizError
from posviz.models.byte_gpt import GPT

WEIGHTS_DTYPE = torch.float32  # what transformers runs the export in; stored as float16 where exact (1.7 MB each)
EXPORT_INFO = "posviz_export.json"
# Where ``python -m posviz.export`` writes by default: models/hf/<checkpoint>-<family>. models/hf has no
# config.json of its own, so posviz.models.checkpoint_files.shipped_checkpoints() does not list it as a checkpoint.
FAMILIES = {"learned": "gpt2", "rope": "neox", "alibi": "bloom"}


# ------------------------------------------------------------------------------------------ tokenizer

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte: the alphabet of the ByteLevel pre-tokenizer.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7f-0xa0, 0xad) are
    mapped in byte order to U+0100 onwards, so that no token is whitespace or a control character.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def byte_tokenizer(folder: str | Path, model_max_length: int | None = None) -> Path:
    """Write a tokenizer whose ids ARE the bytes: text -> its UTF-8 bytes, id b = byte b (V = 256).

    Built offline with the ``tokenizers`` library: a ByteLevel pre-tokenizer (no prefix space, no
    regex split: the whole text is one piece) turns the text's UTF-8 bytes into GPT-2's 256 stand-in
    characters, and a BPE model with exactly those 256 characters as vocabulary (in byte order) and
    no merges maps each to its byte. No special tokens exist, so none is added to any text; the
    ByteLevel decoder turns ids back into bytes and decodes them as UTF-8.

    Non-UTF-8 input: a Python ``str`` always encodes to valid UTF-8, so the tokenizer can only ever
    produce valid UTF-8. For arbitrary bytes skip the tokenizer: ``input_ids = list(raw_bytes)`` is
    exactly what it would give. (Do not pass ``raw.decode("latin-1")``: each byte >= 0x80 would be
    re-encoded as two UTF-8 bytes. Lone surrogates from ``errors="surrogateescape"`` are refused by the
    Rust tokenizer.) Decoding ids that are not valid UTF-8 is lossy, as ``bytes.decode("utf-8",
    "replace")`` is: each invalid sequence becomes U+FFFD. Use ``bytes(ids)`` to get the bytes back.

    model_max_length: the length the tokenizer warns past (transformers' default is "no limit").
    Writes tokenizer.json and tokenizer_config.json into ``folder``; returns ``folder``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # comes with transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}  # {stand-in character: id = byte}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False)
    if sorted(vocab) != sorted(pre_tokenizers.ByteLevel.alphabet()):  # the library's own alphabet
        raise PosvizError("tokenizers' ByteLevel alphabet is not GPT-2's bytes_to_unicode; the byte tokenizer needs updating")
    tok.save(str(folder / "tokenizer.json"))
    config = {
        # PreTrainedTokenizerFast: the class name transformers 4.x knows; 5.x loads it as TokenizersBackend
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,  # True would turn " ." into "." on decode: not the bytes
        "add_prefix_space": False,
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


# ---------------------------------------------------------------------------------------- shared parts

def _check_method(model: GPT, method: str, architecture: str) -> None:
    cfg = model.config
    if cfg.position != method:
        raise PosvizError(f"only the {method!r} method has a {architecture} equivalent; this model uses {cfg.position!r}")


def _write(folder: str | Path, model: GPT, tensors: dict[str, torch.Tensor], hf_config: dict,
           source: str | None, model_max_length: int | None) -> Path:
    """Weights, config.json, tokenizer and posviz_export.json into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", WEIGHTS_DTYPE).contiguous() for k, v in tensors.items()}
    # Each tensor stored in float16 when every value of it is one (the shipped weights are float16 values: half
    # the bytes, the same numbers), else in float32 (BLOOM's folded embeddings); config.json says float32, the
    # dtype transformers loads every tensor into and runs in.
    tensors = {k: v.half() if torch.equal(v.half().to(WEIGHTS_DTYPE), v) else v for k, v in tensors.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    dtype = str(WEIGHTS_DTYPE).removeprefix("torch.")
    # torch_dtype for transformers 4.x and other readers; 5.x reads dtype (and takes torch_dtype for it)
    hf_config = {**hf_config, "vocab_size": model.config.vocab_size, "torch_dtype": dtype, "dtype": dtype,
                 "use_cache": True, "bos_token_id": 0, "eos_token_id": 0}  # byte 0, NUL: never in the stdlib text
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    byte_tokenizer(folder, model_max_length)
    cfg = model.config
    info = {"source_checkpoint": source, "method": cfg.position, "position_options": cfg.position_options,
            "train_length": cfg.train_length, "architecture": hf_config["architectures"][0]}
    (folder / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return folder


def _qkv_by_head(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Our fused c_attn rows [q | k | v] (3, H, hs) -> [q_h, k_h, v_h] per head (H, 3, hs), as
    GPT-NeoX and BLOOM read theirs (``view(..., H, 3 * hs)`` then split in three). Weight (3C, C) or bias (3C,)."""
    rest = weight.shape[1:]
    return weight.reshape(3, n_head, -1, *rest).transpose(0, 1).reshape(weight.shape)


def _blocks(model: GPT, prefix: str, names: dict[str, str], qkv_by_head: bool, transpose: bool = False):
    """Our per-layer tensors renamed: ``names`` maps our module names to theirs, under ``prefix``.{i}."""
    sd, H, out = model.state_dict(), model.config.n_head, {}
    for i in range(model.config.n_layer):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                t = sd[f"blocks.{i}.{ours}.{kind}"]
                if ours == "attn.c_attn" and qkv_by_head:
                    t = _qkv_by_head(t, H)
                if transpose and kind == "weight" and not ours.startswith("ln_"):
                    t = t.t()
                out[f"{prefix}.{i}.{theirs}.{kind}"] = t
    return out


# ---------------------------------------------------------------------------------------------- GPT-2

def export_gpt2(model: GPT, folder: str | Path, source: str | None = None) -> Path:
    """Write a ``learned`` model as a Hugging Face GPT-2 folder (GPT2LMHeadModel), tokenizer included.

    Same architecture: GPT-2 is what posviz's model copies. GPT-2 stores its linear layers as Conv1D,
    i.e. transposed (in, out) weights; c_attn keeps our [q | k | v] layout. n_positions is the learned
    table's size: GPT-2, like posviz, has nothing for a later position.
    """
    _check_method(model, "learned", "GPT-2")
    cfg, sd = model.config, model.state_dict()
    tensors = {"transformer.wte.weight": sd["wte.weight"], "transformer.wpe.weight": sd["position.table.weight"],
               "transformer.ln_f.weight": sd["ln_f.weight"], "transformer.ln_f.bias": sd["ln_f.bias"]}
    tensors |= _blocks(model, "transformer.h", {n: n for n in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj",
                                                                "mlp.c_fc", "mlp.c_proj")},
                       qkv_by_head=False, transpose=True)
    n_positions = model.position.max_positions
    hf_config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_positions": n_positions, "n_embd": cfg.n_embd, "n_layer": cfg.n_layer,
        "n_head": cfg.n_head, "n_inner": 4 * cfg.n_embd, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
    }
    return _write(folder, model, tensors, hf_config, source, n_positions)


# -------------------------------------------------------------------------------------------- GPT-NeoX

def export_neox(model: GPT, folder: str | Path, source: str | None = None) -> Path:
    """Write a ``rope`` model (no scaling) as a Hugging Face GPT-NeoX folder (GPTNeoXForCausalLM).

    GPT-NeoX is pre-LayerNorm with biases and RoPE in the half-split (rotate_half) convention posviz
    uses. Set to match: sequential residual (use_parallel_residual=False: NeoX-20B adds attention and
    MLP to the same input), the whole head rotated (partial_rotary_factor 1.0; NeoX-20B rotates 25 %),
    GPT-2's tanh GELU ("gelu_new"), eps 1e-5, tied embeddings (lm_head is embed_in; nothing stored for
    it). The fused query_key_value is read per head as [q_h, k_h, v_h] (``view(B, T, H, 3 hs)`` then
    ``chunk(3)``), so our [q | k | v] rows are regrouped by head. transformers 5 keeps RoPE settings in
    ``rope_parameters``; 4.x read ``rotary_pct`` and ``rotary_emb_base``: both are written.

    Differs: transformers computes the angles in float32 whatever the model's dtype
    (``GPTNeoXRotaryEmbedding.forward``), posviz in float64. That alone explains the table in the
    module docstring: with posviz's angles rounded to float32 as well, the shipped rope model and its
    export agree to 1.4e-5, 3.1e-5 and 8.0e-5 at 256, 1,024 and 4,096 bytes (float32 noise).
    max_position_embeddings is the train length: there is no position table, and default RoPE does not
    read it (only dynamic scalings do), so longer inputs run (and are tested) as they do in posviz.
    """
    _check_method(model, "rope", "GPT-NeoX")
    rope = model.position
    opts = rope.options
    if opts.scaling != "none":
        raise PosvizError(f"only unscaled RoPE is exported; this model applies {opts.scaling!r} scaling")
    if opts.remap != "none":  # transformers attends every pair at its own positions: it has no remaps
        raise PosvizError(f"only RoPE without a position remap is exported; this model applies the {opts.remap!r} remap")
    cfg, sd = model.config, model.state_dict()
    # transformers rotates int(hs * factor) features. Pass the width posviz rotates (rounded down to even);
    # rot / hs can land a hair below it (44 * (30 / 44) = 29.99...), and then mid-way to the next integer.
    fraction = rope.rot_dim / cfg.head_dim
    if int(cfg.head_dim * fraction) != rope.rot_dim:
        fraction = (rope.rot_dim + 0.5) / cfg.head_dim
    tensors = {"gpt_neox.embed_in.weight": sd["wte.weight"],
               "gpt_neox.final_layer_norm.weight": sd["ln_f.weight"], "gpt_neox.final_layer_norm.bias": sd["ln_f.bias"]}
    tensors |= _blocks(model, "gpt_neox.layers", {
        "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_attn": "attention.query_key_value",
        "attn.c_proj": "attention.dense", "mlp.c_fc": "mlp.dense_h_to_4h", "mlp.c_proj": "mlp.dense_4h_to_h",
    }, qkv_by_head=True)
    hf_config = {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
        "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "intermediate_size": 4 * cfg.n_embd, "hidden_act": "gelu_new", "layer_norm_eps": 1e-5,
        "max_position_embeddings": cfg.train_length, "use_parallel_residual": False, "attention_bias": True,
        "attention_dropout": 0.0, "hidden_dropout": 0.0, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(opts.base), "partial_rotary_factor": fraction},
        "rotary_pct": fraction, "rotary_emb_base": float(opts.base),
    }
    return _write(folder, model, tensors, hf_config, source, None)


# ---------------------------------------------------------------------------------------------- ALiBi

def _neutral_embedding_norm(wte: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(word_embeddings (V, C), LayerNorm weight (C,)) such that LayerNorm_eps(row t) = wte[t] - mean(wte[t]).

    Why that is enough: in posviz (and BLOOM) the residual stream is read only through LayerNorms
    (ln_1, ln_2, ln_f), which remove each token's mean: LN(x + a * 1) = LN(x) for any scalar a. So the
    per-token mean m_t of an embedding never reaches the output, and centred rows c_t = wte[t] - m_t
    give the same model.

    A LayerNorm with weight s * 1 and bias 0 maps k * c_t (mean 0, variance k^2 v_t) to
    c_t * s k / sqrt(k^2 v_t + eps). That is c_t when k^2 (s^2 - v_t) = eps, i.e. k_t = sqrt(eps / (s^2 - v_t)):
    each stored row is scaled so that eps, not the row's own spread, sets the norm. Any s^2 > max v_t
    works; s^2 = 2 max v_t keeps k_t^2 v_t and eps of one size, so float32 keeps ~7 digits of each.
    """
    wte = wte.detach().double()
    centred = wte - wte.mean(dim=-1, keepdim=True)  # (V, C)
    var = centred.pow(2).mean(dim=-1, keepdim=True)  # (V, 1): LayerNorm's biased variance
    s2 = 2 * float(var.max()) if float(var.max()) > 0 else 1.0
    k = torch.sqrt(eps / (s2 - var))
    return centred * k, torch.full((wte.shape[1],), s2 ** 0.5, dtype=torch.float64)


def export_alibi(model: GPT, folder: str | Path, source: str | None = None) -> Path:
    """Write an ``alibi`` model as a Hugging Face BLOOM folder (BloomForCausalLM).

    Which family. BLOOM is the one transformers architecture that computes posviz's ALiBi model:
    pre-LayerNorm with biases everywhere, the tanh GELU (``bloom_gelu_forward``), ALiBi slopes from the
    reference rule (equal to posviz's for every head count, ``tests/test_reference_hf.py``) added after
    the 1/sqrt(hs) scale, fused query_key_value per head [q_h, k_h, v_h]. Its one extra part, a
    LayerNorm right after the word embeddings, is made neutral exactly (``_neutral_embedding_norm``),
    and its output head is then untied: lm_head holds our wte, word_embeddings the neutralised rows.
    BLOOM has no length cap: the bias is built for whatever length comes.

    The others compute a different model (measured on the shipped alibi model with its weights mapped
    as well as each allows):
    * MPT (``MptForCausalLM``): transformers builds it without any bias, in the linear layers and the
      LayerNorms, whatever ``no_bias`` says, and with the exact erf GELU. Dropping posviz's trained
      biases: max |logit diff| 12.7 at 256 and 14.8 at 1,024 bytes; 3.78 bits/byte instead of 1.80.
    * Falcon with alibi=True: the bias is divided by sqrt(hs) too (twice that in its eager path, where
      it is added both in the mask and in the scores) and built in bfloat16, exact only for positions
      below 256 here: 12.3 at 256 bytes; 4.46 bits/byte instead of 1.80 (SDPA).

    Differs, and the tolerance: BLOOM adds slope * j for key j where posviz adds -slope * (i - j), the
    same after the softmax, which ignores a per-row constant. But the constant is large: at position
    p the scores carry slope * p, 1,024 at 4,096 bytes for the steepest of 4 heads (1/4), where
    float32 resolves ~1e-4, and BLOOM's softmax runs in float32 even for a float64 model. posviz's
    bias is 0 on the diagonal and large only for keys that get no weight. Hence logits 2.8e-5 apart at
    256, 1.7e-4 at 1,024 and 7.0e-4 at 4,096 bytes (float32 or float64 alike), bits/byte within 1e-6;
    posviz with BLOOM's form of the bias moves by 1.5e-4 at 1,024 bytes, most of the gap. The tests
    allow 1e-4 on small models and at the train length, 4e-4 at 1,024 bytes, 1e-4 in bits/byte.
    """
    _check_method(model, "alibi", "BLOOM")
    cfg, sd = model.config, model.state_dict()
    eps = model.blocks[0].ln_1.eps  # BLOOM has one eps for every LayerNorm, the new one included
    embeddings, norm_weight = _neutral_embedding_norm(sd["wte.weight"], eps)
    tensors = {"transformer.word_embeddings.weight": embeddings,
               "transformer.word_embeddings_layernorm.weight": norm_weight,
               "transformer.word_embeddings_layernorm.bias": torch.zeros_like(norm_weight),
               "transformer.ln_f.weight": sd["ln_f.weight"], "transformer.ln_f.bias": sd["ln_f.bias"],
               "lm_head.weight": sd["wte.weight"]}
    tensors |= _blocks(model, "transformer.h", {
        "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_attn": "self_attention.query_key_value",
        "attn.c_proj": "self_attention.dense", "mlp.c_fc": "mlp.dense_h_to_4h", "mlp.c_proj": "mlp.dense_4h_to_h",
    }, qkv_by_head=True)
    hf_config = {
        "architectures": ["BloomForCausalLM"], "model_type": "bloom",
        "hidden_size": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "layer_norm_epsilon": eps,
        "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "pretraining_tp": 1, "slow_but_exact": False, "tie_word_embeddings": False,
        # BLOOM's config has no field for the context it was trained on; bigscience's own configs state it
        # as seq_length, which transformers keeps as an attribute and posviz reads
        "seq_length": cfg.train_length,
    }
    return _write(folder, model, tensors, hf_config, source, None)


EXPORTERS = {"learned": export_gpt2, "rope": export_neox, "alibi": export_alibi}


def export_checkpoint(checkpoint: str | Path, to: str | Path | None = None) -> Path:
    """Export a checkpoint folder (or the name of a shipped one) with the exporter its method has.

    to: the output folder; default models/hf/<name>-<family> beside the shipped checkpoints.
    """
    from posviz.models.checkpoint_files import load_checkpoint, models_dir

    folder = Path(checkpoint)
    if not folder.is_dir() and (models_dir() / str(checkpoint)).is_dir():
        folder = models_dir() / str(checkpoint)
    model = load_checkpoint(folder)
    method = model.config.position
    if method not in EXPORTERS:
        raise PosvizError(f"no transformers architecture computes the {method!r} method; "
                          f"exportable methods: {', '.join(EXPORTERS)}")
    to = Path(to) if to is not None else models_dir() / "hf" / f"{folder.name}-{FAMILIES[method]}"
    return EXPORTERS[method](model, to, source=folder.name)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Export a posviz checkpoint as a Hugging Face transformers model folder.")
    ap.add_argument("--checkpoint", required=True,
                    help=f"a shipped checkpoint's name or a checkpoint folder; methods: {', '.join(EXPORTERS)}")
    ap.add_argument("--to", default=None, help="output folder (default: models/hf/<name>-<family>)")
    args = ap.parse_args(argv)
    out = export_checkpoint(args.checkpoint, args.to)
    print(f"wrote {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))


if __name__ == "__main__":
    main()
