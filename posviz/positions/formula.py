"""A logit bias written as a formula in the Workshop (issue #47): ``posviz.positions.formula_language`` parses and walks it.

A visitor's method, not one of the literature's: it is registered apart (``VISITOR_METHODS``), so it is on no page
and needs no shipped checkpoint, but a checkpoint trained with it loads like any other (``load_checkpoint``,
``open_model``): its config.json holds the formula and, per learned parameter, its initial value (a number, or a
uniform range) and its floor.

    bias(i, j) = formula(i, j, d = i - j, h, H, L, layer, learned name[h] / name[layer, h])

It adds its bias to the logits after the 1/sqrt(d) scale, as ALiBi does. A formula of the distance alone (no ``i``
or ``j``) offers the per-distance shortcut and is shift-invariant (a KV cache's window may start anywhere); one that
reads ``i`` or ``j`` is neither: both facts come from the formula's syntax tree.
Shapes: a parameter (H,) or (n_layer, H); bias (1, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from posviz.config import require
from posviz.positions.base import PositionMethod, at_least, position_range
from posviz.limits import WORKSHOP_FORMULA_NODES
from posviz.positions.formula_language import (FormulaError, check_formula, distance_scope, formula_values, pair_pieces, pair_scope,
                                     parse_formula)

SPEC_KEYS = ("init", "floor")
# A learned value's size: a checkpoint stores its weights in float16, whose largest number is 65,504; training moves a
# value by about lr x steps (1.5 in the quick recipe), so this leaves room for it.
LARGEST_PARAMETER = 60_000


def parameter_spec(name: str, spec) -> dict:
    """A learned parameter's spec as config.json holds it: {"init": number or [low, high], "floor": number or None}."""
    require(isinstance(spec, dict) and not set(spec) - set(SPEC_KEYS) and "init" in spec,
            f"parameter {name}: expected {{'init': number or [low, high], 'floor': number or null}}, got {spec!r}")
    init, floor = spec["init"], spec.get("floor")

    def number(x) -> bool:  # stored in float16 (checkpoint_files.STORAGE_DTYPE): a larger value is saved as inf
        return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) <= LARGEST_PARAMETER

    uniform = isinstance(init, (list, tuple)) and len(init) == 2 and all(number(x) for x in init) and init[0] <= init[1]
    require(number(init) or uniform, f"parameter {name}: init must be a number or a range [low, high] of numbers within "
                                     f"±{LARGEST_PARAMETER:g} (a checkpoint stores it in float16), got {init!r}")
    require(floor is None or number(floor), f"parameter {name}: floor must be a number within ±{LARGEST_PARAMETER:g} "
                                            f"or null, got {floor!r}")
    # an initial value below the floor is allowed: KERPLE's reference draws r1 ~ U(0, 2) and floors it at 0.01
    return {"init": [float(init[0]), float(init[1])] if uniform else float(init),
            "floor": None if floor is None else float(floor)}


@dataclasses.dataclass
class FormulaOptions:
    formula: str  # no default: a formula method is the formula (posviz.positions.formula_language's language)
    parameters: dict = dataclasses.field(default_factory=dict)  # name -> {"init": ..., "floor": ...}, one per name[...]

    def __post_init__(self):
        parsed = parse_formula(self.formula)  # FormulaError: words on what is not allowed
        require(isinstance(self.parameters, dict), "formula parameters must be a mapping of name -> spec")
        missing, extra = sorted(set(parsed.parameters) - set(self.parameters)), sorted(set(self.parameters) - set(parsed.parameters))
        require(not missing, f"the formula's learned parameter(s) {', '.join(missing)} need an initial value "
                             "(e.g. --param a=1.0, or a range --param a=0:2)")
        require(not extra, f"parameter(s) {', '.join(extra)} are not in the formula {self.formula!r}")
        self.parameters = {name: parameter_spec(name, self.parameters[name]) for name in sorted(self.parameters)}


class FormulaBias(PositionMethod):
    name = "formula"
    display_name = "your formula"
    visitor = True  # registered apart from the literature's methods: see posviz.positions.VISITOR_METHODS
    summary = "A logit bias written as a formula in the Workshop."
    acts_on = "logits"
    kind = "relative"
    learned = True
    Options = FormulaOptions

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.formula = parse_formula(self.options.formula)
        walks = shape.n_layer if self.by_layer else 1
        if not self.formula.shift_invariant() and self.formula.size * walks > WORKSHOP_FORMULA_NODES:
            # a bias of the pairs is walked once per layer when it differs by layer: the cap is on the walks' parts
            raise FormulaError(f"A formula of i or j that differs by layer is computed for each of the {walks} layers: "
                               f"at most {WORKSHOP_FORMULA_NODES // walks} parts are allowed (this one has "
                               f"{self.formula.size}). Drop layer, or write it with d alone.")
        self.floors = {}
        for name, index in sorted(self.formula.parameters.items()):
            size = (shape.n_head,) if index == ("h",) else (shape.n_layer, shape.n_head)
            spec = self.options.parameters[name]
            init = spec["init"]
            value = torch.full(size, init) if isinstance(init, float) else torch.empty(size).uniform_(*init)
            self.register_parameter(f"param_{name}", nn.Parameter(value))
            self.floors[name] = spec["floor"]
        self._checked = {}  # layer -> (positions checked, the parameter versions they were checked at)
        self.check_up_to(shape.train_length)  # a formula that is no bias within the trained context: say so now

    def values_of(self, layer: int) -> dict:
        """name -> the parameter as the forward pass uses it: at least its floor (straight through, as KERPLE's)."""
        out = {}
        for name in self.formula.parameters:
            p, floor = getattr(self, f"param_{name}"), self.floors[name]
            out[name] = p if floor is None else at_least(p, floor)
        return out

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Keep each stored parameter at or above its floor, as KERPLE's reference does with its own."""
        for name, floor in self.floors.items():
            if floor is not None:
                getattr(self, f"param_{name}").clamp_(min=floor)

    @property
    def by_layer(self) -> bool:
        """Whether the bias differs by layer: the formula reads ``layer`` or a name[layer, h] parameter."""
        return "layer" in self.formula.reads or ("layer", "h") in self.formula.parameters.values()

    def _shared_tag(self, layer: int) -> tuple:
        """What the bias depends on beyond the positions: its layer only when the formula reads one."""
        return ("layer", layer) if self.by_layer else ()

    def logit_bias(self, layer, q, q_pos, k_pos):
        H, L = self.shape.n_head, self.shape.train_length

        def compute():
            values = self.values_of(layer)
            if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
                bias = formula_values(self.formula, pair_scope(q_pos, k_pos, H, L, layer), values, layer)  # autograd
                return bias.expand(H, q_pos.numel(), k_pos.numel()).unsqueeze(0).to(torch.float32)  # (1, H, Tq, Tk)
            # no gradient: walked in pieces into one float32 block, so a long context's walk is bounded in memory
            out = None
            for r0, r1, piece in pair_pieces(self.formula, q_pos, k_pos, H, L, layer, values):
                if out is None:  # (1, H or 1, Tq, Tk): a formula that does not read h is one block for every head
                    out = torch.empty(1, piece.shape[0], q_pos.numel(), k_pos.numel(), device=q_pos.device)
                out[0, :, r0:r1] = piece
            return out.expand(1, H, q_pos.numel(), k_pos.numel())
        if self.by_layer:  # no other layer can use it: kept, each layer's block would stay alive to the pass's end
            return compute().to(q.dtype)
        return self._memoized(q_pos, k_pos, compute).to(q.dtype)  # the same block in every layer: built once

    def distance_bias(self, layer, q_pos, lo, hi):
        if not self.formula.shift_invariant():
            return None  # reads i or j: no function of the distance alone

        def compute(lo, top):
            scope = distance_scope(lo, top, self.shape.n_head, self.shape.train_length, layer)
            table = formula_values(self.formula, scope, self.values_of(layer), layer)
            return table.expand(self.shape.n_head, top - lo + 1).to(torch.float32)  # (H, D)
        return self._kept_distances(("distance", *self._shared_tag(layer)), lo, hi, compute, list(self.parameters()))

    def is_shift_invariant(self) -> bool:
        return self.formula.shift_invariant()

    def check_positions(self, pos: torch.Tensor) -> None:
        """Refuse, with words, positions at which the formula is no bias (NaN, +inf, too large for float32, or a query
        with no finite key): ``check_up_to`` the longest. Not while training, whose loss shows it."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()) and self.training:
            return
        self.check_up_to(position_range(pos)[1] + 1)

    def check_up_to(self, n: int) -> None:
        """``check_formula`` for every position below ``n``, once per length and parameter values: for one layer when
        the bias is the same in every layer, else for each."""
        stamp = tuple(p._version for p in self.parameters() if not p.is_inference())
        H, L = self.shape.n_head, self.shape.train_length
        with torch.no_grad():
            for layer in range(self.shape.n_layer if self.by_layer else 1):
                if self._checked.get(layer, (0, None))[0] >= n and self._checked[layer][1] == stamp:
                    continue
                check_formula(self.formula, n, H, L, layer, self.values_of(layer))
                self._checked[layer] = (n, stamp)
