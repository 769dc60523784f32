"""A position method a visitor writes as a formula of a logit bias: parsed against a whitelist, never ``eval``ed.

The language (issue #47): the variables ``i`` (query position), ``j`` (key position), ``d`` (= i - j), ``h`` (head),
``H`` (heads), ``L`` (the training length) and ``layer``; numbers and ``inf``; ``+ - * / **``, unary minus and the
comparisons; the functions ``log``, ``log1p``, ``exp``, ``sqrt``, ``abs``, ``min``, ``max``, ``floor``, ``clip``,
``sign`` and ``where(cond, a, b)``; and learned parameters written ``name[h]`` (one per head) or ``name[layer, h]``.
KERPLE-log reads ``-a[layer, h] * log(1 + b[layer, h] * d)``.

The text is parsed by Python's ``ast`` into a tree whose every node kind is on a whitelist; the tree is then walked
with torch operations on the causal pairs (j <= i) only. Anything else (an attribute, an import, a lambda, a
comprehension, a string, a call or subscript of another name, more than ``MAX_CHARACTERS`` characters) is refused
with words that name it, and so is a formula past the caps on its size (``posviz.limits``), a number that does not fit
float32, and a value on the causal pairs that is NaN, +inf or too large for the precision attention runs in, or a row
with no finite key; each refusal names the first pair where it happens.

Cost: a walk makes one tensor of the scope's shape per operation and keeps a nested operation's operands alive until
it is done; the caps on the tree's nodes and depth bound both, and ``walk_pairs`` goes over a long context's pairs in
pieces of ``WORKSHOP_WALK_ELEMENTS``, so no shape of formula holds more than (2 * depth + 1) pieces at once.
No plotting and no Streamlit here.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import threading
from typing import Callable, Mapping

import torch

from posviz.errors import PosvizError
from posviz.limits import WORKSHOP_FORMULA_DEPTH, WORKSHOP_FORMULA_NODES, WORKSHOP_WALK_ELEMENTS

MAX_CHARACTERS = 300  # a formula, not a program: also bounds the nesting the walk recurses through
VARIABLES = ("i", "j", "d", "h", "H", "L", "layer")
CONSTANTS = {"inf": float("inf")}
FUNCTIONS = {  # name -> (argument counts allowed, the torch operation)
    "log": ((1,), torch.log), "log1p": ((1,), torch.log1p), "exp": ((1,), torch.exp), "sqrt": ((1,), torch.sqrt),
    "abs": ((1,), torch.abs), "floor": ((1,), torch.floor), "sign": ((1,), torch.sign),
    "min": ((2,), torch.minimum), "max": ((2,), torch.maximum),
    "clip": ((3,), lambda x, lo, hi: torch.minimum(torch.maximum(x, lo), hi)),
    "where": ((3,), lambda c, a, b: torch.where(c.bool(), a, b)),
}
BINARY = {ast.Add: torch.add, ast.Sub: torch.sub, ast.Mult: torch.mul, ast.Div: torch.div, ast.Pow: torch.pow}
COMPARE = {ast.Lt: torch.lt, ast.LtE: torch.le, ast.Gt: torch.gt, ast.GtE: torch.ge, ast.Eq: torch.eq, ast.NotEq: torch.ne}
INDEXES = {("h",), ("layer", "h")}  # a learned parameter is one value per head, or per layer and head
# The walk runs in float32, the precision attention adds the bias in: what is checked is what the model computes, an
# overflow included (float64 held values that turned infinite when cast, and its pow is 2-4x slower). Under a GPU's
# autocast the bias is cast to bfloat16, whose largest number is a little smaller: a finite value past it is refused.
WALK_DTYPE = torch.float32
BIAS_DTYPES = (torch.float32, torch.bfloat16)
LARGEST_BIAS = min(torch.finfo(dtype).max for dtype in BIAS_DTYPES)
# CPython's conversion of a parsed tree into ast objects keeps its recursion depth in state that threads share: with
# twenty visitors at once (Python 3.11.7), one session's parse raised "SystemError: AST constructor recursion depth
# mismatch". Our parses go one at a time (a parse of 300 characters takes microseconds), and one that fails so anyway
# (Streamlit compiling a page in another thread shares the state too) is parsed again.
_PARSING = threading.Lock()
_TOKENS = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop)  # parts of a node, not nodes of the walk


class FormulaError(PosvizError):
    """A formula that is not allowed, or whose values are not a bias; the message says which part and why."""


@dataclasses.dataclass(frozen=True)
class Formula:
    text: str
    tree: ast.Expression
    parameters: dict  # name -> ("h",) or ("layer", "h"): how it is indexed
    reads: frozenset  # the variables it reads
    size: int = 0  # its syntax tree's nodes: what one walk costs, per value walked

    def shift_invariant(self) -> bool:
        """Whether the bias depends on the distance alone (no i or j): a KV cache's window may then start anywhere."""
        return not ({"i", "j"} & self.reads)


def _describe(node: ast.AST) -> str:
    kinds = {ast.Attribute: "an attribute (x.y)", ast.Lambda: "a lambda", ast.ListComp: "a comprehension",
             ast.GeneratorExp: "a comprehension", ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
             ast.List: "a list", ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set", ast.BoolOp: "and/or",
             ast.IfExp: "if/else (use where(cond, a, b))", ast.NamedExpr: "an assignment (:=)", ast.Starred: "*args",
             ast.JoinedStr: "a string", ast.Await: "await", ast.Yield: "yield", ast.Slice: "a slice"}
    return kinds.get(type(node), type(node).__name__)


def parse_formula(text: str) -> Formula:
    """``text`` as a ``Formula``, or a ``FormulaError`` that names what is not allowed."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaError("Write a formula of the bias, e.g. -0.5 * d (ALiBi with one slope).")
    if len(text) > MAX_CHARACTERS:
        raise FormulaError(f"The formula has {len(text):,} characters; at most {MAX_CHARACTERS} are allowed.")
    if "\x00" in text:
        raise FormulaError("The formula contains a NUL byte; type it again without control characters.")
    try:
        tree = _parse(text.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise FormulaError(f"The formula is not an expression: {getattr(exc, 'msg', None) or exc}.") from None
    size = _check_size(tree)
    parameters, reads = {}, set()
    index_tuples = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Tuple)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and id(node) in index_tuples:
            continue  # the (layer, h) of a parameter: checked with its subscript
        if isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.unaryop, ast.cmpop)):
            if isinstance(node, (ast.operator,)) and type(node) not in BINARY:
                raise FormulaError(f"The operator {type(node).__name__} is not allowed; use + - * / **.")
            if isinstance(node, ast.unaryop) and not isinstance(node, (ast.USub, ast.UAdd)):
                raise FormulaError(f"The operator {type(node).__name__} is not allowed.")
            continue
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Compare)):
            continue
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise FormulaError(f"Only numbers are allowed as constants, not {node.value!r}.")
            _check_number(node, text)
            continue
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name not in FUNCTIONS:
                raise FormulaError(f"Calling {name or _describe(node.func)} is not allowed; the functions are "
                                   f"{', '.join(FUNCTIONS)}.")
            if node.keywords or len(node.args) not in FUNCTIONS[name][0]:
                raise FormulaError(f"{name} takes {' or '.join(map(str, FUNCTIONS[name][0]))} argument(s), by position.")
            continue
        if isinstance(node, ast.Subscript):
            index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            names = tuple(n.id if isinstance(n, ast.Name) else None for n in index)
            if not isinstance(node.value, ast.Name) or names not in INDEXES:
                raise FormulaError("A learned parameter is written name[h] or name[layer, h]; nothing else may be indexed.")
            name = node.value.id
            if name in VARIABLES or name in FUNCTIONS or name in CONSTANTS or name.startswith("_"):
                raise FormulaError(f"{name!r} cannot be a learned parameter's name: it is taken or private.")
            if parameters.setdefault(name, names) != names:
                raise FormulaError(f"The parameter {name} is indexed two ways; use one of [h] or [layer, h].")
            continue
        if isinstance(node, ast.Name):
            if node.id in FUNCTIONS or node.id in parameters or node.id in CONSTANTS:
                continue
            if node.id in VARIABLES:
                reads.add(node.id)
                continue
            raise FormulaError(f"Unknown name {node.id!r}: the variables are {', '.join(VARIABLES)}, and a learned "
                               "parameter is written name[h] or name[layer, h].")
        raise FormulaError(f"{_describe(node)} is not allowed in a formula.")
    # a parameter's own name also appears as a bare Name inside its subscript: known once the walk has seen it
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in parameters and not _is_indexed(tree, node):
            raise FormulaError(f"The parameter {node.id} must be indexed: {node.id}[h] or {node.id}[layer, h].")
    return Formula(text, tree, parameters, frozenset(reads), size)


def _parse(text: str) -> ast.Expression:
    """``ast.parse`` one at a time, and once more if CPython's shared depth count failed it (see ``_PARSING``)."""
    with _PARSING:
        try:
            return ast.parse(text, mode="eval")
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
            return ast.parse(text, mode="eval")


def _check_size(tree: ast.Expression) -> int:
    """Refuse a tree past the caps on its nodes and its depth (``posviz.limits``: they bound a walk's time and memory);
    its number of nodes."""
    nodes = sum(1 for n in ast.walk(tree.body) if not isinstance(n, _TOKENS))
    if nodes > WORKSHOP_FORMULA_NODES:
        raise FormulaError(f"The formula has {nodes} parts (names, numbers, operations, calls); at most "
                           f"{WORKSHOP_FORMULA_NODES} are allowed, so that checking and training it stays quick.")
    deepest, stack = 0, [(tree.body, 1)]
    while stack:  # not recursive: a deep tree must be refused, not crash the check
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if not isinstance(child, _TOKENS))
    if deepest > WORKSHOP_FORMULA_DEPTH:
        raise FormulaError(f"The formula is nested {deepest} levels deep; at most {WORKSHOP_FORMULA_DEPTH} are allowed "
                           "(each level keeps a value of every pair alive while it is computed).")
    return nodes


def _check_number(node: ast.Constant, text: str) -> None:
    """Refuse a number that is no float32 (the precision attention runs in): too large, or written as infinite."""
    shown = (ast.get_source_segment(text.strip(), node) or "a number")
    shown = shown if len(shown) <= 24 else shown[:23] + "…"
    try:
        value = float(node.value)
    except OverflowError:  # an integer past float64 (e.g. 0x followed by 257 f's)
        value = LARGEST_BIAS * 2
    if not math.isfinite(value):
        raise FormulaError(f"The number {shown} is infinite as a float; write inf (or -inf, a hard cut) for that.")
    if abs(value) > LARGEST_BIAS:
        raise FormulaError(f"The number {shown} does not fit float32, the precision attention runs in "
                           f"(at most {LARGEST_BIAS:.3g} in size).")


def _is_indexed(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Subscript) and n.value is name for n in ast.walk(tree))


def formula_values(formula: Formula, scope: Mapping[str, torch.Tensor], parameters: Mapping[str, torch.Tensor],
                   layer: int, dtype: torch.dtype = WALK_DTYPE) -> torch.Tensor:
    """The formula walked with torch over ``scope`` (variable -> a tensor, broadcastable together; the head index
    ``h`` on the first axis), with autograd: what a forward pass trains through. ``parameters``: name -> (H,) or
    (n_layer, H) values; this layer's row of each is read. No check of the values: ``evaluate`` checks them."""
    missing = set(formula.parameters) - set(parameters)
    if missing:
        raise FormulaError(f"No values for the learned parameter(s) {', '.join(sorted(missing))}.")
    H = int(scope["H"])
    lead = [1] * (scope["h"].dim() - 1)

    def const(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=dtype, device=scope["h"].device)

    def walk(node: ast.AST) -> torch.Tensor:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return const(float(node.value))
        if isinstance(node, ast.Name):
            return const(CONSTANTS[node.id]) if node.id in CONSTANTS else scope[node.id]
        if isinstance(node, ast.Subscript):
            table = torch.as_tensor(parameters[node.value.id]).to(dtype)
            row = table if formula.parameters[node.value.id] == ("h",) else table[layer]
            return row.reshape(H, *lead)
        if isinstance(node, ast.UnaryOp):
            return -walk(node.operand) if isinstance(node.op, ast.USub) else walk(node.operand)
        if isinstance(node, ast.BinOp):
            return BINARY[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Compare):  # a chain a < b < c: booleans combined, cast once (a byte a value)
            left, out = walk(node.left), None
            for op, comparator in zip(node.ops, node.comparators):
                right = walk(comparator)
                step = COMPARE[type(op)](left, right)
                out = step if out is None else out & step
                left = right
            return out.to(dtype)
        if isinstance(node, ast.Call):
            return FUNCTIONS[node.func.id][1](*[walk(a) for a in node.args])
        raise FormulaError(f"{_describe(node)} is not allowed in a formula.")  # parse_formula let nothing else through

    return walk(formula.tree)


def pair_scope(q_pos: torch.Tensor, k_pos: torch.Tensor, H: int, L: int, layer: int,
               dtype: torch.dtype = WALK_DTYPE) -> dict:
    """The variables for queries at ``q_pos`` (Tq,) and keys at ``k_pos`` (Tk,), shapes (1, Tq, Tk) and h (H, 1, 1).
    A key after its query (masked by attention anyway) is read as the query's own position, so that no value the
    model computes comes from outside the causal pairs (a log of a negative distance would be NaN, and its
    gradient would poison the parameters' even where masked)."""
    device = q_pos.device
    i = q_pos.to(dtype).view(1, -1, 1)
    j = torch.minimum(k_pos.to(device, dtype).view(1, 1, -1), i)
    return {"i": i, "j": j, "d": i - j, "h": torch.arange(H, dtype=dtype, device=device).view(H, 1, 1),
            "H": torch.tensor(float(H), dtype=dtype), "L": torch.tensor(float(L), dtype=dtype),
            "layer": torch.tensor(float(layer), dtype=dtype)}


def distance_scope(lo: int, hi: int, H: int, L: int, layer: int, dtype: torch.dtype = WALK_DTYPE,
                   device=None) -> dict:
    """The variables of a formula of the distance alone, for distances lo..hi: d (1, D) and h (H, 1)."""
    return {"d": torch.arange(lo, hi + 1, dtype=dtype, device=device).view(1, -1),
            "h": torch.arange(H, dtype=dtype, device=device).view(H, 1),
            "H": torch.tensor(float(H), dtype=dtype), "L": torch.tensor(float(L), dtype=dtype),
            "layer": torch.tensor(float(layer), dtype=dtype)}


def pair_pieces(formula: Formula, q_pos: torch.Tensor, k_pos: torch.Tensor, H: int, L: int, layer: int,
                parameters: Mapping[str, torch.Tensor], dtype: torch.dtype = WALK_DTYPE):
    """Yield (r0, r1, values) for the queries ``q_pos[r0:r1]`` against every key of ``k_pos``: the formula walked over
    pieces of at most ``WORKSHOP_WALK_ELEMENTS`` pairs of every head, so that a long context's walk never holds more
    than (2 * depth + 1) pieces at once. ``values``: (H or 1, r1 - r0, Tk) (1 when the formula does not read h)."""
    rows = max(1, WORKSHOP_WALK_ELEMENTS // max(1, H * k_pos.numel()))
    for r0 in range(0, q_pos.numel(), rows):
        r1 = min(q_pos.numel(), r0 + rows)
        scope = pair_scope(q_pos[r0:r1], k_pos, H, L, layer, dtype)
        yield r0, r1, _heads_first(formula_values(formula, scope, parameters, layer, dtype), (r1 - r0, k_pos.numel()))


def _heads_first(values: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``values`` (a number, or broadcastable with the head first) as (H or 1, *shape): 1 when it does not read h."""
    heads = values.shape[0] if values.dim() == len(shape) + 1 else 1
    return torch.broadcast_to(values, (heads, *shape))


def check_values(bias: torch.Tensor, where: str = "", place: Callable[[tuple], str] | None = None,
                 checked: torch.Tensor | None = None) -> None:
    """Refuse a bias (H or 1, ...) that is no bias where attention uses it: NaN, +inf, or a finite value too large for
    the precision attention runs in (float32; bfloat16 under a GPU's autocast). Only -inf (a hard cut) is allowed.
    ``checked``: which entries are causal pairs (broadcastable; None: all); ``place(index)`` names an entry."""

    # one pass for the common case: every value is a number within range, or -inf (NaN compares false)
    bad = ~(bias <= LARGEST_BIAS) | ((bias < -LARGEST_BIAS) & (bias != float("-inf")))
    if checked is not None:
        bad &= checked
    if not bad.any():
        return

    def refuse(bad: torch.Tensor, message: str) -> None:
        if checked is not None:
            bad = bad & checked
        if bad.any():
            index = tuple(int(k) for k in torch.nonzero(bad)[0])
            located = f", first {place(index)}" if place is not None else ""
            raise FormulaError(message.format(where=where + located))

    refuse(torch.isnan(bias), "The formula is NaN on some causal pair{where} (a log or sqrt of a negative number, 0/0, "
                              "...).")
    refuse(torch.isposinf(bias), "The formula overflows to +inf on some causal pair{where}, in float32 (the precision "
                                 "attention runs in, at most 3.4e38); only -inf (a hard cut) is allowed.")
    large = torch.isfinite(bias) & (bias.abs() > LARGEST_BIAS)
    value = float(bias[large].abs().max())  # the largest, masked pairs included: a size, not a place
    refuse(large, f"The formula reaches {value:.3g} in size on some causal pair{{where}}: more than bfloat16, the "
                  f"precision attention runs in on a GPU, holds ({LARGEST_BIAS:.3g}). Write -inf for a hard cut, or "
                  "bound it, e.g. max(..., -1e4).")


def _head(h: int, heads: int) -> str:
    return f" (head {h})" if heads > 1 else ""


def check_formula(formula: Formula, n: int, H: int, L: int, layer: int = 0,
                  parameters: Mapping[str, torch.Tensor] | None = None) -> None:
    """Refuse, with words that name the first pair, a formula that is no bias at some causal pair of an ``n``-position
    context (``check_values``), or leaves a query with no finite key. A formula of the distance alone is checked once
    per distance (n values a head); one that reads i or j, over its causal pairs in pieces (``pair_pieces``)."""
    parameters = dict(parameters or {})
    with torch.no_grad():
        if formula.shift_invariant():
            table = _heads_first(formula_values(formula, distance_scope(0, n - 1, H, L, layer), parameters, layer), (n,))
            check_values(table, f" at a distance below {n:,}",
                         lambda k: f"at distance {k[-1]:,}{_head(k[0], table.shape[0])}")
            if not torch.isfinite(table[:, 0]).all():
                raise FormulaError("The bias at distance 0 is -inf: the first query, which sees only itself, has no key with a "
                                   "finite bias.")
            return
        rows = max(1, WORKSHOP_WALK_ELEMENTS // (H * n))
        for q0 in range(0, n, rows):  # the queries q0..q1-1 see the keys 0..q1-1: the causal pairs, and few others
            q1 = min(n, q0 + rows)
            keys = torch.arange(q1)
            for r0, r1, values in pair_pieces(formula, torch.arange(q0, q1), keys, H, L, layer, parameters):
                causal = keys.view(1, -1) <= torch.arange(q0 + r0, q0 + r1).view(-1, 1)  # (rows, keys)
                check_values(values, f" below position {n:,}",
                             lambda k, v=values, a=q0 + r0: f"at query position {a + k[1]:,}, key position {k[2]:,}"
                                                              f"{_head(k[0], v.shape[0])}", causal)
                if not ((values > float("-inf")) & causal).any(dim=-1).all():  # NaN was refused just above
                    raise FormulaError(f"Some query below position {n:,} has no key with a finite bias.")


def evaluate(formula: Formula, T: int, H: int, L: int, layer: int = 0,
             parameters: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """(H, T, T) float32: the bias of every causal pair (j <= i) of a T-position context, -inf above the diagonal.
    ``parameters``: name -> (H,) or (n_layer, H) values. Refused (``check_formula``) when a causal value is NaN, +inf
    or too large for float32, or a row has no finite key."""
    check_formula(formula, T, H, L, layer, parameters)
    pos = torch.arange(T)
    with torch.no_grad():
        bias = formula_values(formula, pair_scope(pos, pos, H, L, layer), dict(parameters or {}), layer)
        bias = bias.expand(H, T, T).clone()
    bias[:, ~torch.ones(T, T, dtype=torch.bool).tril()] = float("-inf")
    return bias
