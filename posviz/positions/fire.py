"""FIRE: Functional Interpolation for Relative Positions (Li et al. 2023), https://arxiv.org/abs/2310.04418

A learned function of the *normalised* distance, one output per head:

    bias(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),    psi(x) = log(c x + 1)

f_theta is a small MLP (1 -> width -> H, ReLU), c and the threshold L are learned. Dividing by
psi(i) maps every distance a query can see into [0, 1], whatever the length: a query far past the
training length sees its distances squeezed into the range it was trained on ("progressive
interpolation"), which is why FIRE generalises. The threshold L stops short queries from
stretching their few distances over the whole range: below L every query uses psi(L).
Initialisation follows the paper's reference code: width 32, c = 0.1, L = 512 (learned as a
multiplier of 512, so its step size does not depend on the scale of L).

Shared across layers: the MLP, c and L. FIRE's point is one smooth function of where a key sits in
the query's context; one copy keeps it a few hundred parameters (like T5's buckets) and lets the
model compute the (H, Tq, Tk) bias once per forward pass instead of once per layer, which is most
of FIRE's cost at long lengths.
Shapes: normalised distance (Tq, Tk), MLP (Tq, Tk, 1) -> (Tq, Tk, H), bias (1, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional as F

from ..config import require
from .base import PositionMethod, bias_from_distance_table, relative_distance, run_start

EPS = 1e-6  # keeps psi(max(L, i)) > 0 if c or L were driven to 0


@dataclasses.dataclass
class FireOptions:
    mlp_width: int = 32  # hidden units of f_theta
    c_init: float = 0.1  # psi's scale: larger c makes psi closer to a plain log
    threshold_init: float = 512.0  # L: queries before L are normalised as if they sat at L

    def __post_init__(self):
        require(isinstance(self.mlp_width, int) and self.mlp_width >= 1, "fire mlp_width must be an integer >= 1")
        require(isinstance(self.c_init, (int, float)) and self.c_init > 0, f"fire c_init must be > 0, got {self.c_init!r}")
        require(isinstance(self.threshold_init, (int, float)) and self.threshold_init >= 1,
                f"fire threshold_init must be >= 1, got {self.threshold_init!r}")


class Fire(PositionMethod):
    name = "fire"
    summary = "A learned MLP of the log-distance normalised by the query's position, per head."
    paper = "https://arxiv.org/abs/2310.04418"
    acts_on = "logits"
    kind = "relative"
    learned = True
    Options = FireOptions

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        o = self.options
        self.mlp = nn.Sequential(nn.Linear(1, o.mlp_width), nn.ReLU(), nn.Linear(o.mlp_width, shape.n_head))
        self.c = nn.Parameter(torch.tensor(float(o.c_init)))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # L = |threshold_scale| * threshold_init

    @property
    def threshold(self) -> torch.Tensor:
        return (self.threshold_scale * self.options.threshold_init).abs()

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
        """f_theta on normalised distances u (any shape): (H, *u.shape). The reference: the MLP as it is."""
        return self.mlp(u.unsqueeze(-1)).movedim(-1, 0)

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

    def bias_by_pieces(self, u: torch.Tensor) -> torch.Tensor:
        """The same as ``bias_of(u)`` (to float rounding), by looking each input's line up: (H, *u.shape)."""
        points, pieces = self._kept(("pieces",), self.linear_pieces, self.parameters())
        H = pieces.shape[1] // 2
        line = F.embedding(torch.searchsorted(points, u), pieces)  # (*u.shape, 2H)
        return torch.addcmul(line[..., H:], line[..., :H], u.unsqueeze(-1)).movedim(-1, 0).contiguous()

    def bias_of_runs(self, q0: int, rows: int, k0: int, keys: int) -> torch.Tensor:
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
        top = q0 + rows - 1 - k0  # the block's largest distance
        width = keys + rows - 1  # distances top, top-1, ..., top-width+1
        device = self.c.device
        distance = torch.arange(top, top - width, -1, device=device).clamp(min=0).to(self.c)  # (W,)
        psi_d = self.psi(distance)
        # (R, W) u = psi(d) / psi(i) as an outer product: a broadcast division runs 10x slower here
        inverse = 1 / self.normaliser(torch.arange(q0, q0 + rows, device=device))  # (R,)
        u = torch.outer(inverse, psi_d)
        points, pieces = self._kept(("pieces",), self.linear_pieces, self.parameters())
        H = pieces.shape[1] // 2
        # a column is in one piece for every row when its smallest and largest u are (u grows with
        # 1 / psi(i), and the extremes are the u of the rows with the extreme normalisers, exactly)
        low = torch.searchsorted(points, psi_d * inverse.min())
        high = torch.searchsorted(points, psi_d * inverse.max())
        pure = low == high
        line = pieces[low].T[:, None, :]  # (2H, 1, W): each column's line, right where the column is pure
        Z = torch.empty(H, rows, width, dtype=u.dtype, device=device)  # contiguous, for the view below
        torch.addcmul(line[H:], line[:H], u[None], out=Z)  # (H, R, W)
        straddling = torch.nonzero(~pure).flatten()  # the few columns whose rows fall in different pieces
        if straddling.numel():
            Z[:, :, straddling] = self.bias_by_pieces(u[:, straddling])
        # key j of row r has distance (q0 + r) - (k0 + j) = top - m at column m = rows - 1 - r + j
        return Z.as_strided((H, rows, keys), (rows * width, width - 1, 1), rows - 1)

    def _distance_table(self, lo: int, hi: int) -> torch.Tensor:
        """(H, hi - lo + 1) bias at distances lo..hi for queries at or below the threshold L, which are
        all normalised by psi(L): the MLP runs once per distinct distance, not once per pair."""
        span = torch.arange(lo, hi + 1, device=self.c.device)
        u = self.psi(span.clamp(min=0).to(self.c)) / (self.psi(self.threshold) + EPS)  # (D,)
        return self.bias_of(u)

    def _below_threshold(self, q_pos: torch.Tensor) -> bool:
        return bool((q_pos.to(self.c.device).float() <= self.threshold).all())

    def logit_bias(self, layer, q, q_pos, k_pos):
        def compute():
            q_dev, k_dev = q_pos.to(self.c.device), k_pos.to(self.c.device)
            if self._below_threshold(q_dev):
                # Every query is normalised by psi(L): the bias is a function of the distance alone.
                distance = relative_distance(q_dev, k_dev)  # (Tq, Tk)
                lo, hi = int(distance.min()), int(distance.max())
                return bias_from_distance_table(self._distance_table(lo, hi), distance, lo).unsqueeze(0)  # (1, H, Tq, Tk)
            if torch.is_grad_enabled() and self.c.requires_grad:  # training: the MLP, for its gradients
                return self.bias_of(self.normalised_distance(q_dev, k_dev)).unsqueeze(0)
            q0, k0 = run_start(q_dev), run_start(k_dev)
            if q0 is not None and k0 is not None:  # a block of a forward pass: consecutive positions
                return self.bias_of_runs(q0, q_dev.numel(), k0, k_dev.numel()).unsqueeze(0)
            return self.bias_by_pieces(self.normalised_distance(q_dev, k_dev)).unsqueeze(0)  # (1, H, Tq, Tk)

        return self._memoized(q_pos, k_pos, compute).to(q.dtype)

    def distance_bias(self, layer, q_pos, lo, hi):
        def compute():  # past L each query has its own normaliser: no per-distance vector then
            if not self._below_threshold(q_pos):
                return None
            return self._kept(("distance", lo, hi), lambda: self._distance_table(lo, hi), self.parameters())
        return self._memoized(q_pos, q_pos, compute, ("distance", lo, hi))  # shared by every layer
