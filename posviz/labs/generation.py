"""Let a model *write*: id-by-id decoding with a KV cache, past the training length.

No Streamlit here. A ``Decoder`` produces one id per ``step()`` so a page can run several models
side by side and show their text as it comes; ``generate`` runs one to the end.

Ids are the model's own (``LabModel.encode``): bytes for our checkpoints, a tokenizer's tokens for a
published model (``model.unit``). The decoder samples ids; the text is ``model.decode`` of the whole
sequence (so a character split over two tokens comes out whole); losses per id are in bits, and per
byte through ``bytes_per_id`` (``Generation.bits_per_byte``), so a byte model and a tokenizer's compare.
Everything below says "byte" where a checkpoint's id is one; read "id" for any model.

Conventions (as in the other labs, see ``lab_inputs``): bits are nats / ln 2; position t is the t-th
id of prompt + generated text (0-based); W is the model's training length, in its ids. The id at position t is
predicted from the t ids before it, so the context first holds more than W ids when predicting position W + 1
(``first_past_train_length``): that step feeds position W, which a learned table of W rows lacks.

Window strategies (applied to absolute methods; relative ones always keep every byte at its true
position, which is what they were built for):

* ``stop``: keep the cache and give each byte its true position. A method with no representation
  for a position (learned past its table) raises its own ``PositionLimitError``; the decoder stops
  there and keeps the message. Sinusoidal keeps writing at positions it never saw.
* ``reencode``: once the context is longer than W, every step runs the last W bytes again at
  positions 0..W-1, without a cache. Always in-distribution; a full W-byte forward pass per byte.
* ``shift``: keep a W-entry cache, drop the oldest entry and call the window 0..W-1 again, so the
  new byte gets position W-1. Cached keys keep the positions they were computed at: the broken
  shortcut the blog post warns about (``kv_cache``'s "shifted_cache").
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from posviz.errors import PosvizError, PositionLimitError
from posviz.limits import MAX_GENERATE_MULTIPLE_CPU, MAX_GENERATE_MULTIPLE_GPU, MAX_PROMPT_BYTES
from posviz.labs.inputs import in_units
from posviz.labs import kv_cache
from posviz.labs.kv_cache import STREAMING_SINKS, move_sinks
from posviz.models.interface import LabModel
from posviz.positions.base import mark_run

LN2 = math.log(2.0)
STRATEGIES = ("stop", "reencode", "shift", "streaming")
# The strategies this lab shares with the KV cache lab go by that lab's names (one name for one strategy
# across the app); "shift" is its shifted cache, "stop" its own: every byte kept, at its true position.
STRATEGY_TITLES = {
    "stop": "whole cache, true positions",
    "reencode": kv_cache.STRATEGY_TITLES["reencode"],
    "shift": kv_cache.STRATEGY_TITLES["shifted_cache"],
    "streaming": kv_cache.STRATEGY_TITLES["streaming"],
}
STRATEGY_HOW = {
    "stop": "Every byte keeps its true position and the cache keeps every byte. A learned table has no row past "
            "its length, so that model stops with its own error; sinusoidal goes on at positions it never saw.",
    "reencode": "Once the context is longer than the training length W, each new byte re-runs the last W bytes "
                "at positions 0..W-1 without a cache: always in distribution, a whole forward pass per byte.",
    "shift": "Keep the last W keys and values, drop the oldest, and relabel the window 0..W-1 so the new byte "
             "gets position W-1. Cached keys still carry the positions they were computed at: fast and wrong "
             "for absolute methods, which bake the position into the input.",
    "streaming": "Keep the first 4 bytes (the sinks) and the newest W-4 in a cache of W, the sinks at the positions "
                 "just before the newest (StreamingLLM). For every method: it shows what evicting the first bytes "
                 "costs a model that attends to them.",
}
MAX_TOP_K = 256
MAX_TEMPERATURE = 2.0


def strategy_title(key: str, unit: str = "byte") -> str:
    return in_units(STRATEGY_TITLES[key], unit)


def strategy_how(key: str, unit: str = "byte") -> str:
    return in_units(STRATEGY_HOW[key], unit)


# The generation lab's opening view: two checkpoints that write very differently once the text passes
# the training length (KERPLE keeps writing code-shaped text; sinusoidal collapses into "ararar…" right
# after it), sampled with a fixed seed, 200 bytes of prompt and 400 written: 600 bytes, over 2x the
# shipped training length of 256, so more than half of what is written lies past it. 900 written (4x) took
# a new server's first visit 2.2 s longer on 2 cores, one cached step per byte and model; the slider goes
# on to 4x. Greedy decoding loops for every model, which hides the difference.
DEFAULT_MODELS = ("kerple", "sinusoidal")
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_K = 40
DEFAULT_PROMPT_BYTES = 200
DEFAULT_NEW_BYTES = 400  # new ids: bytes for the shipped checkpoints


def max_new_bytes(train_length: int, device: torch.device) -> int:
    """How many ids one model may write on this device (``train_length`` in its ids): at least 4 x the
    training length on a CPU. Named for the byte models it was written for; a tokenizer's are tokens."""
    multiple = MAX_GENERATE_MULTIPLE_GPU if device.type == "cuda" else MAX_GENERATE_MULTIPLE_CPU
    return multiple * train_length


@dataclass(frozen=True)
class DecodeSettings:
    """How to pick each id. ``temperature`` 0 is greedy (the most likely id, ``top_k`` ignored)."""

    new_ids: int  # ids to write, in the model's unit (bytes for a checkpoint, tokens for a published model)
    temperature: float = 0.0
    top_k: int = 0  # 0: every id may be drawn
    seed: int = 0
    strategy: str = "stop"

    def __post_init__(self):
        if not isinstance(self.new_ids, int) or self.new_ids < 1:
            raise PosvizError(f"The number of bytes or tokens to write must be a positive whole number, got {self.new_ids!r}.")
        if not (0.0 <= self.temperature <= MAX_TEMPERATURE) or self.temperature != self.temperature:
            raise PosvizError(f"The temperature must be between 0 (greedy) and {MAX_TEMPERATURE:g}, got {self.temperature!r}.")
        if not isinstance(self.top_k, int) or not 0 <= self.top_k <= MAX_TOP_K:
            raise PosvizError(f"top-k must be a whole number from 0 (off) to {MAX_TOP_K}, got {self.top_k!r}.")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**31:
            raise PosvizError(f"The seed must be a whole number from 0 to {2**31 - 1:,}, got {self.seed!r}.")
        if self.strategy not in STRATEGIES:
            raise PosvizError(f"Unknown window strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def next_id_distribution(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """Probabilities (V,) to draw the next id from: logits / temperature, outside the top k set to 0."""
    scaled = logits.float() / temperature
    if 0 < top_k < scaled.numel():
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return scaled.softmax(-1)


next_byte_distribution = next_id_distribution  # the name from when every id was a byte


@dataclass
class Step:
    id: int  # the id written (a byte for a checkpoint)
    surprisal: float  # bits of this id under the model's own distribution (temperature 1)
    entropy: float  # bits: the entropy of that distribution


@contextlib.contextmanager
def one_thread():
    """Run the block on this thread alone (CPU intra-op threads), then go back to what it had.

    Why: a decoding step is a few hundred tiny kernels, and the attention kernel splits even one query
    across the threads. Waking the second thread for it costs more than the work; on a 2-core server
    with anything else running (another visitor, Streamlit itself) the wake waits for a core, and a
    cached step spent 0.5 ms in attention per layer instead of about 0.05 ms. The numbers move only by
    float rounding (300 sampled bytes of every shipped checkpoint: the same bytes, surprisal within
    1e-4 bits). PyTorch keeps the setting per thread (OpenMP), so other sessions' passes keep theirs;
    the process-wide default it also writes is put back on exit.
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_prompt(prompt: Sequence[int] | torch.Tensor, model: LabModel | None = None) -> list[int]:
    """The prompt as a list of ids, refused in words when empty, too long or not ids of ``model``
    (None: bytes, as a page's prompt text is)."""
    ids = [int(b) for b in (prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)]
    unit, vocab_size = ("byte", 256) if model is None else (model.unit, model.vocab_size)
    if not ids:
        raise PosvizError("The prompt is empty. Paste some text or pick a held-out document.")
    if len(ids) > MAX_PROMPT_BYTES:  # a prompt of MAX_PROMPT_BYTES bytes never has more ids than that
        raise PosvizError(f"The prompt has {len(ids):,} {unit}s; at most {MAX_PROMPT_BYTES:,} are allowed.")
    if not all(0 <= i < vocab_size for i in ids):
        raise PosvizError(f"The prompt must be {unit} ids (whole numbers 0..{vocab_size - 1:,}).")
    return ids


class Decoder:
    """One model writing after ``prompt`` (the model's ids), one id per ``step()`` (None once done or stopped).

    ``forced``: teacher forcing. The next id is taken from it (the model's ids) instead of drawn, so the
    same loop (same cache, same window strategy) scores a real continuation; at most ``len(forced)`` steps.
    """

    def __init__(self, model: LabModel, prompt, settings: DecodeSettings, forced: Sequence[int] | None = None):
        cap = max_new_bytes(model.train_length, model.device)
        if settings.new_ids > cap:
            raise PosvizError(f"At most {cap:,} new {model.unit}s per model on this device ({cap // model.train_length} "
                              f"× the training length); {settings.new_ids:,} were asked for.")
        self.model, self.settings = model, settings
        self.prompt = check_prompt(prompt, model)
        self.forced = None if forced is None else [int(b) for b in forced]
        self.window = model.train_length
        # Relative methods keep every id at its true position (re-encoding or shifting is for absolute ones);
        # StreamingLLM's window is for every method.
        self.strategy = settings.strategy if model.is_absolute or settings.strategy == "streaming" else "stop"
        self.seq: list[int] = list(self.prompt)
        self.steps: list[Step] = []
        self.error: str | None = None
        self.seconds = 0.0
        self.generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        # re-encode keeps a cache only until the window is full (nothing to re-encode before that)
        self.sinks = min(STREAMING_SINKS, self.window - 1) if self.strategy == "streaming" else 0
        self.cache = model.new_cache(max_size=self.window if self.strategy in ("shift", "streaming") else None,
                                     sinks=self.sinks)
        self._logits: torch.Tensor | None = None  # prediction for the id after self.seq
        self._limit = settings.new_ids if self.forced is None else min(settings.new_ids, len(self.forced))
        self._prompt_bytes = len(model.decode(self.prompt))

    @property
    def done(self) -> bool:
        return self.error is not None or len(self.steps) >= self._limit

    @property
    def generated(self) -> list[int]:
        return [s.id for s in self.steps]

    @property
    def text_bytes(self) -> bytes:
        """The bytes written so far: the decoding of the whole sequence, less the prompt's bytes (decoding
        the new ids alone could cut a character whose bytes span the prompt's last id and the first new one)."""
        return self.model.decode(self.seq)[self._prompt_bytes:]

    @property
    def text(self) -> str:
        return self.text_bytes.decode("utf-8", errors="replace")

    @property
    def first_past_train_length(self) -> int:
        """Index in the generated ids of the first one predicted from more than W ids of context."""
        return max(0, self.window + 1 - len(self.prompt))

    def _ids(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor([values], dtype=torch.long, device=self.model.device)

    def _prefill(self) -> torch.Tensor:
        if self.strategy == "streaming" and len(self.seq) > self.window:  # the rest one by one, as it evicts
            self.model(self._ids(self.seq[:self.window]), cache=self.cache)
            for t in range(self.window, len(self.seq)):
                logits = self._streaming(self.seq[t], t)
            return logits
        if self.strategy in ("stop", "streaming") or len(self.seq) <= self.window:
            return self.model(self._ids(self.seq), cache=self.cache).logits[0, -1]
        if self.strategy == "reencode":
            self.cache = None
        # re-encode and shift start from the last W ids of a long prompt, at positions 0..W-1
        return self.model(self._ids(self.seq[-self.window:]), cache=self.cache).logits[0, -1]

    def _advance(self, new_id: int) -> torch.Tensor:
        """Logits for the id after ``self.seq`` + [new_id] (the id is appended to seq by the caller)."""
        t = len(self.seq) - 1  # position of the id just appended, in the whole text
        dev = self.model.device
        if self.strategy == "stop":
            return self.model(self._ids([new_id]), cache=self.cache).logits[0, -1]
        if self.strategy == "streaming":
            return self._streaming(new_id, t)
        if self.strategy == "reencode":
            if t < self.window and self.cache is not None:  # the window is not full yet: the cache is exact
                return self.model(self._ids([new_id]), cache=self.cache).logits[0, -1]
            self.cache = None
            return self.model(self._ids(self.seq[-self.window:])).logits[0, -1]
        p = min(t, self.window - 1)
        held = len(self.cache)
        if held:  # relabel the window so it ends just before p; cached keys keep what they baked in
            self.cache.positions = mark_run(torch.arange(p - held, p, device=dev), p - held)
        return self.model(self._ids([new_id]), positions=p, cache=self.cache).logits[0, -1]

    def _streaming(self, new_id: int, t: int) -> torch.Tensor:
        """StreamingLLM's step for the id at position t (``labs.kv_cache.move_sinks`` past the window)."""
        if t >= self.window:
            move_sinks(self.model, self.cache, self.seq[:self.sinks], t, self.window)
        return self.model(self._ids([new_id]), positions=t, cache=self.cache).logits[0, -1]

    @torch.inference_mode()
    def step(self) -> Step | None:
        if self.done:
            return None
        start = time.perf_counter()
        step = None
        try:
            with one_thread():
                if self._logits is None:
                    self._logits = self._prefill()
                # one read of the logits per id (the id must come back anyway); the rest on the CPU
                logits = self._logits.float().cpu()
                logp = logits.log_softmax(-1)
                if self.forced is not None:
                    new_id = self.forced[len(self.steps)]
                elif self.settings.greedy:
                    new_id = int(logits.argmax())
                else:
                    probs = next_id_distribution(logits, self.settings.temperature, self.settings.top_k)
                    new_id = int(torch.multinomial(probs, 1, generator=self.generator))
                step = Step(new_id, float(-logp[new_id]) / LN2, float(-(logp.exp() * logp).nansum()) / LN2)
                self.steps.append(step)
                self.seq.append(new_id)
                if not self.done:
                    self._logits = self._advance(new_id)
        except PositionLimitError as exc:
            # the id drawn in this call (if any) stands: it came from a position the method has
            self.error = f"Stopped after {len(self.steps):,} {self.model.unit}s: {exc}"
        finally:
            self.seconds += time.perf_counter() - start
        return step

    def result(self) -> "Generation":
        ids = self.generated
        return Generation(self.model.method, len(self.prompt), self.window, self.strategy,
                          ids, np.array([s.surprisal for s in self.steps]),
                          np.array([s.entropy for s in self.steps]), self.error, self.seconds,
                          unit=self.model.unit, id_bytes=np.asarray(self.model.bytes_per_id(ids), dtype=np.int64),
                          text_bytes=self.text_bytes)


@dataclass
class Generation:
    """What one model wrote (or was scored on). Positions, lengths and ``ids`` are in the model's unit."""

    method: str
    prompt_length: int  # ids of the prompt
    train_length: int  # in ids
    strategy: str  # the strategy actually used (relative methods: always "stop")
    ids: list[int]
    surprisal: np.ndarray = field(repr=False)  # (n,) bits per id
    entropy: np.ndarray = field(repr=False)  # (n,) bits per id
    error: str | None
    seconds: float
    unit: str  # what one id is, as pages say it: "byte" (a checkpoint) or "token"
    id_bytes: np.ndarray = field(repr=False)  # (n,) bytes of text each id covers (a byte model: one each)
    text_bytes: bytes = field(repr=False)  # the bytes ``ids`` stand for

    @property
    def text(self) -> str:
        return self.text_bytes.decode("utf-8", errors="replace")

    @property
    def n_bytes(self) -> int:
        return int(self.id_bytes.sum())

    @property
    def ids_per_second(self) -> float:
        return len(self.ids) / self.seconds if self.seconds > 0 else float("nan")

    @property
    def first_past_train_length(self) -> int:
        return max(0, self.train_length + 1 - self.prompt_length)

    @property
    def mean_bits(self) -> float:
        """Mean bits per id (per byte for a byte model)."""
        return float(np.mean(self.surprisal)) if len(self.surprisal) else float("nan")

    @property
    def bits_per_byte(self) -> float:
        """Bits per byte of the text: the ids' bits summed over the bytes they cover (a byte model: the mean)."""
        if not len(self.surprisal):
            return float("nan")
        return float(self.surprisal.sum() / self.id_bytes.sum()) if self.id_bytes.sum() else float("nan")


def generate(model: LabModel, prompt, settings: DecodeSettings, forced: Sequence[int] | None = None,
             progress: Callable[[float], None] = lambda f: None) -> Generation:
    """``model`` writes ``settings.new_ids`` ids after ``prompt`` (its ids), to the end or its stop."""
    decoder = Decoder(model, prompt, settings, forced)
    every = max(1, settings.new_ids // 50)
    while decoder.step() is not None:
        if len(decoder.steps) % every == 0:
            progress(len(decoder.steps) / settings.new_ids)
    progress(1.0)
    return decoder.result()


def teacher_forced(model: LabModel, prompt, continuation: Sequence[int], strategy: str) -> Generation:
    """The model's loss on a real continuation (its ids), read through the same cache and window strategy.

    With true positions throughout ("stop", and every relative method but StreamingLLM's window) the ids are known in advance,
    so one forward pass over prompt + continuation gives exactly what the id-by-id cached loop gives
    (by causality), in a fraction of the time. Window strategies, and a method that runs out of
    positions, go through the loop. ``Generation.bits_per_byte`` is the loss per byte of the continuation.
    """
    n = min(len(continuation), max_new_bytes(model.train_length, model.device))
    if n < 1:
        raise PosvizError("There is no real continuation to score after this prompt.")
    settings = DecodeSettings(n, strategy=strategy)
    prompt_ids, forced = check_prompt(prompt, model), [int(b) for b in continuation[:n]]
    limit = model.max_positions
    true_positions = strategy == "stop" or (not model.is_absolute and strategy != "streaming")
    if true_positions and (limit is None or len(prompt_ids) + n - 1 <= limit):
        start = time.perf_counter()
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids + forced[:-1]], dtype=torch.long, device=model.device)
            logp = model(ids).logits[0, len(prompt_ids) - 1:].float().log_softmax(-1)  # (n, V): id k of the continuation
        target = torch.tensor(forced, device=logp.device)
        surprisal = (-logp.gather(1, target[:, None])[:, 0] / LN2).cpu().numpy()
        entropy = (-(logp.exp() * logp).nansum(-1) / LN2).cpu().numpy()
        return Generation(model.method, len(prompt_ids), model.train_length, "stop", forced,
                          surprisal, entropy, None, time.perf_counter() - start, unit=model.unit,
                          id_bytes=np.asarray(model.bytes_per_id(forced), dtype=np.int64), text_bytes=model.decode(forced))
    return generate(model, prompt_ids, settings, forced=forced)


def character_start(data: bytes, cut: int) -> int:
    """``cut`` moved back to the start of the UTF-8 character it falls in (unchanged on a boundary), so a
    text cut there leaves whole characters on both sides: a tokenizer reads text, not loose bytes."""
    cut = max(0, min(cut, len(data)))
    for back in range(cut, max(cut - 3, 0) - 1, -1):  # a UTF-8 character has at most 3 continuation bytes
        if back == len(data) or data[back] & 0xC0 != 0x80:  # not a continuation byte: a character starts here
            return back
    return cut  # not UTF-8 here: nothing to keep whole


def window_means(values: np.ndarray, start_position: int, width: int, count: str = "bytes") -> list[dict]:
    """Mean of ``values`` (one per id, the first at ``start_position``) over position windows of ``width``;
    ``count`` names the column counting the ids in each window (a checkpoint's are bytes)."""
    if width < 1:
        raise PosvizError(f"The window width must be positive, got {width}.")
    rows = []
    positions = start_position + np.arange(len(values))
    for lo in range((start_position // width) * width, int(positions[-1]) + 1 if len(values) else 0, width):
        inside = (positions >= lo) & (positions < lo + width)
        if inside.any():
            rows.append({"window start": lo, "window end": lo + width - 1, "mean": float(np.mean(values[inside])),
                         count: int(inside.sum())})
    return rows


def _shown(piece: bytes) -> str:
    """An id's bytes as a CSV cell: printable ASCII as it is, any other byte as \\xNN."""
    return "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in piece)


def per_byte_rows(name: str, result: Generation) -> list[dict]:
    """One row per generated id, for the CSV export: the id (named by its unit: "byte", "token"), the text it
    stands for (printable ASCII as it is, any other byte as \\xNN) and the bytes it covers."""
    past = result.first_past_train_length
    ends = np.cumsum(result.id_bytes)
    pieces = [result.text_bytes[e - n:e] for e, n in zip(ends, result.id_bytes)]
    return [{"checkpoint": name, "index": i, "position": result.prompt_length + i, result.unit: t,
             "text": _shown(piece), "bytes": int(n), "surprisal_bits": float(s), "entropy_bits": float(e),
             "context_past_train_length": i >= past}
            for i, (t, piece, n, s, e) in enumerate(zip(result.ids, pieces, result.id_bytes, result.surprisal,
                                                        result.entropy))]


def byte_values(result: Generation, values: np.ndarray) -> np.ndarray:
    """(n_bytes,) one value per byte of the text from one per id: an id's value shared evenly by its bytes,
    so a character's sum (``lab_inputs.characters_with_bits``) is its share of its ids' bits."""
    sizes = result.id_bytes
    return np.repeat(np.asarray(values, dtype=float) / np.maximum(sizes, 1), sizes)


def coloured_characters(result: Generation, values: np.ndarray) -> tuple[list[tuple[str, float]], int | None]:
    """(characters with their value, index of the first character predicted past the training length or
    None) for the coloured text: ``values`` (one per id) shared out to bytes, bytes grouped into characters."""
    from posviz.labs.inputs import characters_with_bits

    data, per_byte, past = result.text_bytes, byte_values(result, values), result.first_past_train_length
    # where the first id past the training length starts, in bytes, moved back to the start of its character (a
    # token, or a byte, may begin inside one: the mark goes before the whole character)
    cut = character_start(data, int(result.id_bytes[:past].sum()))
    chars = characters_with_bits(data[:cut], per_byte[:cut])
    mark = len(chars) if past < len(result.ids) else None
    chars += characters_with_bits(data[cut:], per_byte[cut:])
    return chars, mark
