"""FIRE: Functional Interpolation for Relative Positions (Li et al. 2023), https://arxiv.org/abs/2310.04418

A learned function of the *normalised* distance, one output per head:

    bias(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),    psi(x) = log(c x + 1)

f_theta is a small MLP (1 -> width -> H, ReLU), c and the threshold L are learned. Dividing by
psi(i) maps every distance a query can see into [0, 1], whatever the length: a query far past the
training length sees its distances squeezed into the range it was trained on ("progressive
interpolation"), which is why FIRE generalises. The threshold L stops short queries from
stretching their few distances over the whole range: below L every query uses psi(L).

Where this follows the paper and its reference code (appendix pseudo-code), and where it departs:

* One FIRE per layer (its own MLP, c and L), the paper's main setting; ``shared_across_layers``
  gives its cheaper variant, one FIRE for every layer (the paper's layerwise sharing).
* Width 32 and c = 0.1, as in the reference code.
* L starts at a quarter of the training length. The reference code starts at 512 for 2,048-token
  training, also a quarter: normalisation then acts on three quarters of the training queries, so
  the MLP learns to read squeezed distances. Copying the absolute 512 to 256-byte training would
  mean that no training query is ever normalised by its own position (``threshold_init`` sets L).
* The MLP's switch points start inside [0, 1]. The reference keeps ``nn.Linear``'s default init
  (w, b ~ U(-1, 1) for one input), under which a hidden unit is zero for every u in [0, 1] with
  probability 3/8 (b <= 0 and w + b <= 0): it never gets a gradient, since u never leaves [0, 1].
  We keep the default weights and move each unit's switch point -b/w to a uniform draw in [0, 1]
  (b = -w s), so every unit is live on part of the input range and the MLP does not start linear.

Shapes: normalised distance (Tq, Tk), MLP (Tq, Tk, 1) -> (Tq, Tk, H), bias (1, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional as F

from posviz.config import require
from posviz.positions.base import PositionMethod, bias_from_distance_table, distance_range, position_range, relative_distance, run_start

EPS = 1e-6  # keeps psi(max(L, i)) > 0 if c or L were driven to 0
MLP_INITS = ("spread", "reference")
THRESHOLD_FRACTION = 0.25  # L's start as a fraction of the training length: the reference's 512 of 2,048


@dataclasses.dataclass
class FireOptions:
    mlp_width: int = 32  # hidden units of f_theta
    c_init: float = 0.1  # psi's scale: larger c makes psi closer to a plain log
    # L's start; None: a quarter of the training length (see the module docstring for why)
    threshold_init: float | None = None
    shared_across_layers: bool = False  # True: one FIRE for all layers (cheaper; the paper's main setting is per layer)
    # "spread": switch points drawn inside [0, 1] (see above); "reference": nn.Linear's default, as the paper's code
    mlp_init: str = "spread"

    def __post_init__(self):
        require(isinstance(self.mlp_width, int) and self.mlp_width >= 1, "fire mlp_width must be an integer >= 1")
        require(isinstance(self.c_init, (int, float)) and self.c_init > 0, f"fire c_init must be > 0, got {self.c_init!r}")
        require(self.threshold_init is None or (isinstance(self.threshold_init, (int, float)) and self.threshold_init >= 1),
                f"fire threshold_init must be >= 1, got {self.threshold_init!r}")
        require(self.mlp_init in MLP_INITS, f"fire mlp_init must be one of {', '.join(MLP_INITS)}, got {self.mlp_init!r}")
        require(isinstance(self.shared_across_layers, bool),
                f"fire shared_across_layers must be true or false, got {self.shared_across_layers!r}")


class FireFunction(nn.Module):
    """One FIRE: f_theta with its own c and L. A layer's bias, or every layer's when shared."""

    def __init__(self, n_head: int, width: int, c_init: float, threshold_init: float, spread: bool = True):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_head))
        self.c = nn.Parameter(torch.tensor(float(c_init)))
        # L = |threshold_scale| * threshold_init: learned as a multiplier, so its step size does not
        # depend on the scale of L (the reference code)
        self.threshold_init = float(threshold_init)
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        if spread:
            self.spread_switch_points()

    @torch.no_grad()
    def spread_switch_points(self) -> None:
        """Keep the hidden weights w, set b = -w s with s ~ U(0, 1): each unit switches inside [0, 1]."""
        hidden = self.mlp[0]
        hidden.bias.copy_(-hidden.weight[:, 0] * torch.rand_like(hidden.bias))

    @property
    def threshold(self) -> torch.Tensor:
        return (self.threshold_scale * self.threshold_init).abs()

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log((self.c * x).abs() + 1)

    def normaliser(self, q_pos: torch.Tensor) -> torch.Tensor:
        """psi(max(L, i)) for each query position i: what its distances are divided by (Tq,)."""
        return self.psi(torch.maximum(q_pos.to(self.c), self.threshold)) + EPS

    def normalised_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(Tq, Tk): psi(i - j) / psi(max(L, i)), in [0, 1] for keys at or before the query."""
        distance = relative_distance(q_pos, k_pos).clamp(min=0).to(self.c)  # future keys: masked, count as 0
        return self.psi(distance) / self.normaliser(q_pos)[:, None]

    def bias_of(self, u: torch.Tensor) -> torch.Tensor:
        """f_theta on normalised distances u (any shape): (H, *u.shape). The reference: the MLP as it is.

        Always in fp32, autocast or not: under bf16 autocast the first layer would round u to steps of
        2^-8, so training would see another u than inference (fp32, and ``linear_pieces`` in fp64)."""
        with torch.autocast(u.device.type, enabled=False):
            return self.mlp(u.float().unsqueeze(-1)).movedim(-1, 0)

    def distance_table(self, lo: int, hi: int) -> torch.Tensor:
        """(H, hi - lo + 1) bias at distances lo..hi for queries at or below the threshold L, which are
        all normalised by psi(L): the MLP runs once per distinct distance, not once per pair."""
        span = torch.arange(lo, hi + 1, device=self.c.device)
        u = self.psi(span.clamp(min=0).to(self.c)) / (self.psi(self.threshold) + EPS)  # (D,)
        return self.bias_of(u)

    def below_threshold(self, q_pos: torch.Tensor, threshold: float | None = None) -> bool:
        """Whether every query is at or below L. ``threshold``: L when the caller already read it; the
        largest position comes from the positions' note when they are a run (no read of the device)."""
        return position_range(q_pos)[1] <= (float(self.threshold) if threshold is None else threshold)

    def linear_pieces(self) -> tuple[torch.Tensor, torch.Tensor]:
        """f_theta as what it is, a piecewise-linear function of its one input: (breakpoints (K,),
        pieces (K + 1, 2H)), piece s holding the slopes and intercepts of the H outputs between
        breakpoints s-1 and s.

        Why: past the threshold every (query, key) pair has its own input, and running the MLP on
        each costs a width-32 hidden layer per pair (at 4,096 bytes: 8 M pairs, 4x the whole forward
        pass of the peer). A ReLU unit w u + b switches at u = -b / w, so between two switch points
        the MLP is one line per head; looking that line up costs a search among 32 points instead.
        """
        hidden, out = self.mlp[0], self.mlp[2]
        w, b = hidden.weight[:, 0].double(), hidden.bias.double()  # (W,)
        switches = w != 0
        points = torch.sort((-b[switches] / w[switches])).values  # (K,)
        # a point inside each piece (its middle; one unit beyond the ends) decides which units are on
        edges = torch.cat((points[:1] - 1, points, points[-1:] + 1)) if points.numel() else torch.zeros(2).to(w)
        middle = (edges[:-1] + edges[1:]) / 2 if points.numel() else edges[:1]  # (K+1,)
        on = (middle[:, None] * w[None, :] + b[None, :] > 0).double()  # (K+1, W)
        W2, b2 = out.weight.double(), out.bias.double()  # (H, W), (H,)
        slopes = on @ (W2 * w[None, :]).T  # (K+1, H)
        intercepts = on @ (W2 * b[None, :]).T + b2  # (K+1, H)
        dtype = hidden.weight.dtype
        return points.to(dtype), torch.cat((slopes, intercepts), dim=1).to(dtype)


class Fire(PositionMethod):
    name = "fire"
    display_name = "FIRE"
    summary = "A learned MLP of the log-distance normalised by the query's position, per head and layer."
    paper = "https://arxiv.org/abs/2310.04418"
    acts_on = "logits"
    kind = "relative"
    learned = True
    Options = FireOptions
    explore_sections = ("fire-input",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        o = self.options
        threshold = o.threshold_init if o.threshold_init is not None else THRESHOLD_FRACTION * shape.train_length
        copies = 1 if o.shared_across_layers else shape.n_layer
        self.functions = nn.ModuleList(FireFunction(shape.n_head, o.mlp_width, o.c_init, max(1.0, threshold),
                                                    spread=o.mlp_init == "spread") for _ in range(copies))

    def is_shift_invariant(self) -> bool:
        return False  # past L the normaliser psi(i) depends on where the query sits

    def _index(self, layer: int) -> int:
        """Which of ``functions`` layer ``layer`` uses."""
        return 0 if self.options.shared_across_layers else layer

    def function(self, layer: int) -> FireFunction:
        """The FIRE that layer ``layer`` uses."""
        return self.functions[self._index(layer)]

    def below_threshold(self, layer: int, q_pos: torch.Tensor) -> bool:
        """``below_threshold`` of the layer's FIRE, with L read once per weights, not once per pass (a
        read waits for the GPU); training, whose L changes every step, reads it each time."""
        fn = self.function(layer)
        threshold = self._kept(("threshold", self._index(layer)), lambda: float(fn.threshold.detach()), fn.parameters())
        return fn.below_threshold(q_pos, threshold)

    def pieces(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``linear_pieces`` of the layer's FIRE, kept across passes while its weights stay as they are."""
        fn = self.function(layer)
        return self._kept(("pieces", self._index(layer)), fn.linear_pieces, fn.parameters())

    def bias_by_pieces(self, layer: int, u: torch.Tensor) -> torch.Tensor:
        """The same as ``function(layer).bias_of(u)`` (to float rounding), by looking each input's line
        up: (H, *u.shape)."""
        points, pieces = self.pieces(layer)
        H = pieces.shape[1] // 2
        line = F.embedding(torch.searchsorted(points, u), pieces)  # (*u.shape, 2H)
        return torch.addcmul(line[..., H:], line[..., :H], u.unsqueeze(-1)).movedim(-1, 0).contiguous()

    def bias_of_runs(self, layer: int, q0: int, rows: int, k0: int, keys: int) -> torch.Tensor:
        """``bias_by_pieces`` for queries q0 .. q0+rows-1 and keys k0 .. k0+keys-1: (H, rows, keys),
        a strided view.

        Why: looking a line up for every (query, key) pair costs ~100 ns a pair on this CPU, four
        times the rest of the forward pass at 16x the training length. But along a column of one
        *distance* the rows of a block differ only by their normaliser psi(i), which barely moves
        across a block; so most distance columns lie in one piece for every row of the block, and
        the whole block is one multiply-add with a line per column. Only the columns where the rows
        straddle a switch point (a few columns per switch point) are looked up pair by pair. The bias is
        built with one column per distance (largest first) and read back per key through a skewed view.
        """
        fn = self.function(layer)
        top = q0 + rows - 1 - k0  # the block's largest distance
        width = keys + rows - 1  # distances top, top-1, ..., top-width+1
        device = fn.c.device
        distance = torch.arange(top, top - width, -1, device=device).clamp(min=0).to(fn.c)  # (W,)
        psi_d = fn.psi(distance)
        # (R, W) u = psi(d) / psi(i) as an outer product: a broadcast division runs 10x slower here
        inverse = 1 / fn.normaliser(torch.arange(q0, q0 + rows, device=device))  # (R,)
        u = torch.outer(inverse, psi_d)
        points, pieces = self.pieces(layer)
        H = pieces.shape[1] // 2
        # a column is in one piece for every row when its smallest and largest u are (u grows with
        # 1 / psi(i), and the extremes are the u of the rows with the extreme normalisers, exactly)
        low = torch.searchsorted(points, psi_d * inverse.min())
        high = torch.searchsorted(points, psi_d * inverse.max())
        pure = low == high
        line = pieces[low].T[:, None, :]  # (2H, 1, W): each column's line, right where the column is pure
        Z = torch.empty(H, rows, width, dtype=u.dtype, device=device)  # contiguous, for the view below
        torch.addcmul(line[H:], line[:H], u[None], out=Z)  # (H, R, W)
        if rows > 1:  # one row (a decoding step) is pure in every column; skip the nonzero, a read of the device
            straddling = torch.nonzero(~pure).flatten()  # the few columns whose rows fall in different pieces
            if straddling.numel():
                Z[:, :, straddling] = self.bias_by_pieces(layer, u[:, straddling])
        # key j of row r has distance (q0 + r) - (k0 + j) = top - m at column m = rows - 1 - r + j
        return Z.as_strided((H, rows, keys), (rows * width, width - 1, 1), rows - 1)

    def logit_bias(self, layer, q, q_pos, k_pos):
        fn = self.function(layer)

        def compute():
            q_dev, k_dev = q_pos.to(fn.c.device), k_pos.to(fn.c.device)
            if self.below_threshold(layer, q_dev):
                # Every query is normalised by psi(L): the bias is a function of the distance alone.
                distance = relative_distance(q_dev, k_dev)  # (Tq, Tk)
                lo, hi = distance_range(q_dev, k_dev)
                return bias_from_distance_table(fn.distance_table(lo, hi), distance, lo).unsqueeze(0)  # (1, H, Tq, Tk)
            if torch.is_grad_enabled() and fn.c.requires_grad:  # training: the MLP, for its gradients
                return fn.bias_of(fn.normalised_distance(q_dev, k_dev)).unsqueeze(0)
            q0, k0 = run_start(q_dev), run_start(k_dev)
            if q0 is not None and k0 is not None:  # a block of a forward pass: consecutive positions
                return self.bias_of_runs(layer, q0, q_dev.numel(), k0, k_dev.numel()).unsqueeze(0)
            return self.bias_by_pieces(layer, fn.normalised_distance(q_dev, k_dev)).unsqueeze(0)  # (1, H, Tq, Tk)

        if not self.options.shared_across_layers:  # each layer reads its own bias once: nothing to share
            return compute().to(q.dtype)
        return self._memoized(q_pos, k_pos, compute).to(q.dtype)  # one bias for every layer of the pass

    def distance_bias(self, layer, q_pos, lo, hi):
        fn, index = self.function(layer), self._index(layer)

        def compute():  # past L each query has its own normaliser: no per-distance vector then
            if not self.below_threshold(layer, q_pos):
                return None
            return self._kept_distances(("distance", index), lo, hi, fn.distance_table, fn.parameters())
        return self._memoized(q_pos, q_pos, compute, ("distance", index, lo, hi))
