"""Caps that keep one visitor of a hosted demo from exhausting it, and the device to run on."""
from __future__ import annotations

import torch

MAX_TEXT_BYTES = 65_536  # pasted text is cut to this (with a notice); 10 MB pastes must not stall the server
MAX_LENGTH_MULTIPLE_CPU = 16  # live evaluation length cap, as a multiple of train_length, on a CPU
MAX_LENGTH_MULTIPLE_GPU = 32  # on a GPU the quadratic attention maps still fit comfortably
MAX_SLIDING_BYTES = 2_048  # bytes scored one at a time by the sliding-window lab
MAX_KV_CACHE_POSITIONS = 8_192  # longest KV cache a lab will keep
MAX_GENERATE_MULTIPLE_CPU = 4  # bytes one model may write, as a multiple of train_length: far enough past it
MAX_GENERATE_MULTIPLE_GPU = 16  # to see what breaks; one forward pass per byte per model
MAX_PROMPT_BYTES = 1_024  # a generation prompt: the opening of a text, not a whole file
CACHE_ENTRIES = 32  # bound of every memoised result (models, evaluations) in the app
# Live results shared by every session of a server (posviz.serving.SharedResults): at most this many,
# holding at most this many bytes of arrays. A 4,096-byte score is ~70 kB and a pooled attention view
# of four heads ~4 MB, so the bytes bind first only when many maps are kept.
SHARED_RESULT_ENTRIES = 512
SHARED_RESULT_BYTES = 192 * 2**20
# Heavy computations (forward passes of the live labs) that run at once on one server; the rest queue.
# One: a single forward pass already uses every core through torch's intra-op threads.
HEAVY_SLOTS = 1


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """A device from a command line's ``--device``: "auto" (or None) is the GPU when there is one, as in the app."""
    if name is None or name == "auto":
        return default_device()
    try:
        return torch.device(name)
    except (RuntimeError, TypeError):
        from posviz.errors import ConfigError

        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}") from None


def add_device_argument(parser) -> None:
    """``--device`` for the command-line tools, "auto" by default (CUDA when present)."""
    parser.add_argument("--device", default="auto", help="where to run: auto (CUDA when present, else CPU), cpu, cuda, cuda:1")


def device_label() -> str:
    if torch.cuda.is_available():
        return f"CUDA ({torch.cuda.get_device_name(0)})"
    threads = torch.get_num_threads()
    return f"CPU ({threads} thread{'' if threads == 1 else 's'})"


def max_eval_length(train_length: int, device: torch.device | None = None) -> int:
    device = device or default_device()
    multiple = MAX_LENGTH_MULTIPLE_GPU if device.type == "cuda" else MAX_LENGTH_MULTIPLE_CPU
    return multiple * train_length

# The effective context length probe (labs/key_value.py): texts of these multiples of a model's trained context,
# capped, as every live length, by the device's MAX_LENGTH_MULTIPLE; a key-value pair planted at each depth
EFFECTIVE_LENGTH_MULTIPLES = (1, 2, 4, 8, 16)
EFFECTIVE_LENGTH_TRIALS = 8  # names per depth and length: rows of up to 16x the context each

# The Workshop (posviz/workshop): a visitor's formula trained on the server, one run at a time. Each run trains the
# shipped shape (about 0.8 M parameters, ~3 MB in fp32 while training, 1.6 MB on disk) with the quick recipe; these
# cap the rest. A finished run is kept in the server's store of runs (posviz.workshop.training.RunStore), shared by all.
WORKSHOP_TRAININGS_AT_ONCE = 1  # one training uses every core through torch's threads; more only slow each other
WORKSHOP_QUEUE = 8  # runs waiting behind it; past this a visitor is told to try again later
WORKSHOP_MAX_TRAIN_SECONDS = 300  # the quick recipe takes about 3 minutes on 2 cores; past this a run stops early
WORKSHOP_RESULTS_PER_SESSION = 3  # trained checkpoints a session keeps (the oldest goes first): disk and memory
# A formula a visitor types (posviz/positions/formula_language.py). Its cost is that of its walk: every operation makes one
# tensor of the scope's shape, and a nested operation keeps its operands alive until it is done, so the number of
# operations bounds the time of a walk and its depth bounds the memory. The six examples have at most 33 nodes and a
# depth of 12 (the T5-like buckets); these leave room for a formula twice as long, and no more.
WORKSHOP_FORMULA_NODES = 64  # syntax-tree nodes (names, numbers, operations, calls, parameters)
WORKSHOP_FORMULA_DEPTH = 16  # nesting: operands alive at once in the walk
# Elements of one piece of a walk (float32): a formula of i and j is walked over its pairs in pieces of at most this
# many, so at most (2 * depth + 1) pieces are alive at once: 33 x 4 MB = 132 MB in the worst case under the caps.
WORKSHOP_WALK_ELEMENTS = 1 << 20
# Visitors' Workshop runs the server keeps, shared by everyone who trains the same formula (about 1.7 MB each): the
# least recently used goes first. The six examples trained ahead are kept besides.
WORKSHOP_STORED_RUNS = 64
