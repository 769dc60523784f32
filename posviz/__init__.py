"""posviz: the maths, models, data, training and evaluation behind the app (no Streamlit here).

Rooms that mirror the app:

* ``positions/``: one file per position method, registered by name (``positions.POSITION_METHODS``);
* ``models/``: the one interface every lab runs (``models.interface.LabModel``), the byte GPT, our
  shipped checkpoints and published transformers models behind it, and the export to transformers;
* ``labs/``: the numbers of each live lab (Extrapolation, KV cache, Context extension, Retrieval,
  Generation, Compare) and what they share;
* ``explore/``: the numbers of the explore pages (Home, Sinusoidal & learned, RoPE, Attention biases, About);
* ``training/``: the corpus, the shared training recipe and the evaluation written into metrics.json;
* beside them: ``config`` (strict configs), ``errors``, ``limits`` (caps and device), ``palette``
  (colours), ``serving`` (the store and queue a server shares between visitors), and the commands
  ``python -m posviz.train``, ``posviz.training.evaluate``, ``posviz.training.evaluate_all`` and ``posviz.models.export``.
"""
import os

# Large CPU tensors on transparent huge pages. An attention map at 16 x the training length is 256 MB,
# and getting that much fresh memory from the kernel in 4 KB pages (a page fault per page) cost 57 ms
# here, a fifth of the forward pass it comes from; in 2 MB pages it costs 14 ms. PyTorch's CPU allocator
# asks for huge pages (allocations of 2 MB and more) when this is set before its first large allocation,
# so it is set when posviz is imported. Export THP_MEM_ALLOC_ENABLE=0 to opt out.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# OpenMP threads that wait for work sleep instead of spinning. PyTorch runs many small parallel regions
# (a decoding step's attention is one per layer, whatever its size), and by default an idle thread spins
# for a while before it sleeps. On a 2-core server that shares its cores (another session, Streamlit's
# own threads, a neighbour process) a spinning thread takes the core the working one needs: the
# Generation lab's default took 43–158 s instead of 3 s, the retrieval probes 4–10 s instead of 1.6 s.
# Sleeping waiters cost nothing measurable on an idle machine (1.0 s against 0.9–1.1 s for the probes).
# libgomp reads this when PyTorch loads it, hence here, before any import of torch; export
# OMP_WAIT_POLICY=ACTIVE to opt out.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
