"""Published language models (GPT-2, OPT, Pythia, SmolLM2, Qwen2.5, Qwen3, Gemma 2 and 3, Phi-3, BLOOM, Falcon, MPT), from a folder,
the hub or a GGUF file, as models a lab can run.

A published model is a causal language model in ``transformers`` whose position method posviz
recognises (``FAMILIES``), from a local folder or a Hugging Face hub id. Its numbers are transformers'
numbers: the labs run the model's own forward pass, with its own tokenizer and its own KV cache
(``DynamicCache``); nothing of GPT-2, Llama or BLOOM is re-implemented here. What posviz adds is what a
lab asks of every model (``posviz.models.interface.LabModel``):

* ids are the tokenizer's, and ``bytes_per_id`` says how many bytes of text each covers, so bits per
  byte compare with the byte-level checkpoints;
* attention probabilities come from eager attention, switched on for the one forward pass that asks
  for a map (and captured at the one layer asked for); otherwise the fastest implementation runs;
* a RoPE model's context extension is set through transformers' ``rope_parameters``, keeping its θ;
  the scaled variants share the loaded weights and differ only in their rotary module;
* what it cannot run is said in words: a learned table past its rows, MPT past ``max_seq_len``.

Safe on a public demo: safetensors only (a pickle-only model is refused), never ``trust_remote_code``,
a parameter cap (``POSVIZ_MAX_PARAMS``) checked from the config before any weight is downloaded, a
memory estimate before a long window or an attention map, and a clear error when the hub cannot be
reached or a model is gated. Nothing is downloaded unless a published model is asked for.

Shape legend as in ``model.py``: B batch, T new ids, Tk keys, H heads, V vocabulary.

The rooms: ``settings`` (the deployer's list and the caps), ``families`` (each architecture's facts),
``hub`` (files and safety), ``gguf`` (GGUF files: the header, the dequantised copy), ``text`` (ids and their
bytes), ``cache`` (the KV cache), ``model`` (the ``LabModel``) and ``kinds`` (the refs each kind opens).
"""
