"""The models a lab can run, behind one interface (``interface.LabModel``), and how a name becomes one.

* ``interface``: what every lab asks of a model, its forward pass's output, and ``open_model``;
* ``byte_gpt``, ``attention``, ``kv_cache``: the byte-level GPT our checkpoints are, its attention and cache;
* ``checkpoint_files``: a checkpoint folder on disk (safetensors weights, config.json, metrics.json);
* ``shipped``: our checkpoints as lab models; ``hf``: published Hugging Face transformers models as lab models;
* ``export``: our checkpoints written as transformers models.
"""
