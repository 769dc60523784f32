"""FoPE, Fourier Position Embedding (Hua et al., ICML 2025, "Fourier Position Embedding: Enhancing Attention's
Periodic Extension for Length Generalization"), https://arxiv.org/abs/2412.17739

RoPE gives pair p of a head one frequency: cos(t w_p), sin(t w_p). FoPE's two changes:

1. **Zero the under-trained frequencies.** A frequency whose period 2 pi / w is longer than the training length
   never completes a turn in training, so past it the model meets angles it has never seen. FoPE keeps the D
   frequencies with w >= 2 pi / L (L = train_length; here 7 of 16 pairs at L = 256 and head size 32) and gives
   every other pair frequency 0: cos = 1, sin = 0, no rotation at all.
2. **Each pair a Fourier series.** Pair p of head h turns by

       cos_p(t) = sum_D cos(t w_D) C[h, D, p] / sum_D C[h, D, p]      sin_p(t) = the same with S

   so a pair carries a little of every kept frequency, not one alone (the paper: spectral leakage in the layers
   smears each frequency anyway; the series models it). C and S start at the identity plus Xavier-normal noise
   (gain 0.3), per head, and are **fixed**: the reference listing makes them ``nn.Parameter(...,
   requires_grad=False)``; here they are buffers, saved with the weights and never trained.

Reference paths: the paper's training code (``TsinghuaC3I/Fourier-Position-Embedding``, ``olmo/model.py``
``FourierEmbedding`` and ``olmo/config.py``), and vLLM's ``rotary_embedding/fope.py``. posviz follows, choice by choice:

- **the columns**: the training code's ``output_dim`` = min(D, hs/4), D the kept frequencies (vLLM the same);
- **the identity**: the training code's step identity (1 at (i * ceil(D / columns), i)) plus Xavier-normal noise of
  gain 0.3 (``fourier_init = "eye_xavier_norm"``, ``fourier_init_norm_gain``);
- **the padding** of the pairs past the series: vLLM's cos = 1, sin = 0 (frequency 0). The training code pads sin
  with 1 as well (``F.pad(..., value=1)``), which is no zero frequency: it mixes rotate_half into those pairs;
- **the normalisation** (``normalise``): each column divided by its sum, as the paper's listing writes it; the
  training code's ``fourier_norm`` defaults to False (raw coefficients). When more frequencies are kept than there are
  columns, the step identity leaves the last columns without an identity entry, and a normalised column of pure noise
  blows up (its sum passes near 0: max |cos| 15 to 83 over eight draws at hs 64 and L 4,096); posviz refuses that
  shape in words unless ``normalise`` is off. The shipped shape (hs 32, L 256: D = 7 of 8 columns) is square;
- **one set of coefficients or one per layer** (``per_layer``): the training code builds a ``FourierEmbedding`` in
  every block (each layer its own random C and S); posviz's shipped checkpoint shares one set across its layers
  (``per_layer`` false, pinned in its config.json), which is what its pages draw.

Because cos_p^2 + sin_p^2 != 1 and the frequencies mix, q_m . k_n is no function of m - n alone: FoPE is
not shift-invariant, and a KV cache keeps its keys as they were written.
Shapes: q, k (B, H, T, hs); pos (T,); cos, sin (H, T, hs); C, S (H, D, pairs with a series).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from posviz.config import require
from posviz.errors import ConfigError
from posviz.positions.base import PositionMethod
from posviz.positions.rope import rotate_half


@dataclasses.dataclass
class FopeOptions:
    base: float = 10000.0  # RoPE's base for the frequencies w_p = base^(-2p/hs)
    floor_length: int | None = None  # frequencies with a period longer than this are zeroed; None: the train_length
    init_gain: float = 0.3  # the reference's rope_fourier_init_norm_gain (Xavier-normal noise on the identity)
    # Each column of C and S divided by its sum (the paper's listing); the training code's fourier_norm default is off.
    normalise: bool = True
    # One set of C and S per layer, as the training code builds one FourierEmbedding per block; off: one set shared.
    per_layer: bool = False

    def __post_init__(self):
        require(self.base > 1, f"FoPE's base must be > 1, got {self.base}")
        require(self.floor_length is None or (isinstance(self.floor_length, int) and self.floor_length >= 2),
                f"FoPE's floor_length must be an integer >= 2 or None, got {self.floor_length!r}")
        require(self.init_gain >= 0, f"FoPE's init_gain must be >= 0, got {self.init_gain}")
        require(isinstance(self.normalise, bool), f"FoPE's normalise must be true or false, got {self.normalise!r}")
        require(isinstance(self.per_layer, bool), f"FoPE's per_layer must be true or false, got {self.per_layer!r}")


def kept_frequencies(head_dim: int, base: float, floor_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(RoPE's hs/2 frequencies, the kept ones: those with a period 2 pi / w no longer than ``floor_length``), float64."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return inv_freq, inv_freq[inv_freq >= 2 * math.pi / floor_length]


class FourierPositions(PositionMethod):
    name = "fope"
    display_name = "FoPE"
    summary = ("RoPE whose pairs each turn by a fixed random mix of frequencies, with the frequencies that never "
               "complete a turn in training zeroed.")
    paper = "https://arxiv.org/abs/2412.17739"
    acts_on = "q/k"
    kind = "relative"
    Options = FopeOptions
    explore_sections = ("fope-spectrum",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        if self.options.floor_length is None:
            self.options.floor_length = shape.train_length
        require(shape.head_dim % 2 == 0, f"FoPE needs an even head size, got {shape.head_dim}")
        _, kept = kept_frequencies(shape.head_dim, self.options.base, self.options.floor_length)
        D = kept.numel()
        require(D >= 1, f"FoPE keeps no frequency: none turns within {self.options.floor_length} positions")
        # the reference's output_dim: every kept frequency, at most a quarter of the head's features (one pair for a
        # head smaller than 4, where the quarter is 0)
        columns = D if D <= shape.head_dim // 4 else max(1, shape.head_dim // 4)
        bare = bare_columns(D, columns)
        if bare and self.options.normalise:
            raise ConfigError(
                f"FoPE at head size {shape.head_dim} keeps {D} frequencies within {self.options.floor_length:,} positions "
                f"for {columns} columns: the reference's identity leaves columns {bare[0]}–{bare[-1]} without their "
                "identity entry, and such a column of noise divided by its sum (near 0) blows up (|cos| far past 1). "
                "Turn normalise off (the training code's default), or choose a shorter floor_length or a larger head.")
        # (D,) float64, kept out of the module's buffers: a model cast to float32 would round the speeds (3e-6 off at 1,000)
        self.kept_freq = kept
        cos_coef, sin_coef = (torch.empty(shape.n_head, D, columns) for _ in range(2))
        for coef in (sin_coef, cos_coef):  # the reference's order of draws: sin, then cos
            torch.nn.init.xavier_normal_(coef, gain=self.options.init_gain)
            coef += _step_eye(D, columns)
        self.register_buffer("cos_coef", cos_coef)  # (H, D, columns), fixed
        self.register_buffer("sin_coef", sin_coef)
        # per_layer: this set is layer 0's; each later layer draws its own (after this one, in layer order)
        self.later_layers = torch.nn.ModuleList(
            [FourierPositions(shape, {**dataclasses.asdict(self.options), "per_layer": False})
             for _ in range(shape.n_layer - 1)] if self.options.per_layer else [])

    def at_layer(self, layer: int) -> "FourierPositions":
        return self.later_layers[layer - 1] if self.options.per_layer and layer > 0 else self

    @property
    def series_pairs(self) -> int:
        """How many pairs of a head turn by a Fourier series; the rest have frequency 0."""
        return self.cos_coef.shape[-1]

    def is_shift_invariant(self) -> bool:
        """False whenever a series mixes frequencies or its cos and sin weights differ (cos^2 + sin^2 != 1: scores read
        m and n, not m - n alone); True only when every pair turns at one frequency alone, as RoPE's (a head so small
        that one frequency is kept)."""
        return all(layer._one_frequency_per_pair() for layer in (self, *self.later_layers))

    def _one_frequency_per_pair(self) -> bool:
        cos, sin = self.coefficients()
        return bool(torch.equal(cos, sin) and ((cos != 0).sum(dim=1) == 1).all())

    def coefficients(self, dtype: torch.dtype | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, S) (H, D, columns) as the series uses them, in ``dtype`` (cast before dividing): divided by their column
        sums when ``normalise``."""
        out = []
        for coef in (self.cos_coef, self.sin_coef):
            coef = coef.to(device=device, dtype=dtype)
            out.append(coef / coef.sum(dim=-2, keepdim=True) if self.options.normalise else coef)
        return out[0], out[1]

    def cos_sin(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of shape (H, T, hs) at positions ``pos`` (T,), in float64: the Fourier series of each pair, then
        cos = 1 and sin = 0 for the pairs with frequency 0, both halves of a pair alike (GPT-NeoX's split)."""
        angles = pos.to(torch.float64)[:, None] * self.kept_freq.to(pos.device)  # (T, D)
        cos_coef, sin_coef = self.coefficients(torch.float64, pos.device)
        out = []
        for coef, wave, pad in ((cos_coef, torch.cos(angles), 1.0), (sin_coef, torch.sin(angles), 0.0)):
            series = torch.einsum("tD,hDp->htp", wave, coef)  # (H, T, columns)
            series = torch.nn.functional.pad(series, (0, self.shape.head_dim // 2 - series.shape[-1]), value=pad)
            out.append(torch.cat((series, series), dim=-1))  # (H, T, hs)
        return out[0], out[1]

    def rotate_qk(self, q, k, pos):  # q, k (B, H, T, hs); pos (T,)
        def compute():
            cos, sin = self.cos_sin(pos)
            return cos.to(device=q.device, dtype=q.dtype), sin.to(device=q.device, dtype=q.dtype)

        cos, sin = self._memoized(pos, pos, compute, ("fope", q.dtype))  # once per pass, shared by the layers it serves
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _step_eye(rows: int, columns: int) -> torch.Tensor:
    """The reference's identity for a (rows, columns) coefficient matrix: 1 at (i * step, i), step = ceil(rows / columns)
    (the plain identity when rows == columns)."""
    eye = torch.zeros(rows, columns)
    step = -(-rows // columns)
    for i in range(columns):
        if i * step < rows:
            eye[i * step, i] = 1.0
    return eye


def bare_columns(rows: int, columns: int) -> list[int]:
    """The columns the reference's step identity leaves without an entry (more frequencies kept than columns)."""
    return [int(i) for i in torch.nonzero(_step_eye(rows, columns).sum(dim=0) == 0).flatten()]
