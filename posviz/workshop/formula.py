"""A position method a visitor writes as a formula of a logit bias: parsed against a whitelist, never ``eval``ed.

The language (issue #47): the variables ``i`` (query position), ``j`` (key position), ``d`` (= i - j), ``h`` (head),
``H`` (heads), ``L`` (the training length) and ``layer``; numbers and ``inf``; ``+ - * / **``, unary minus and the
comparisons; the functions ``log``, ``log1p``, ``exp``, ``sqrt``, ``abs``, ``min``, ``max``, ``floor``, ``clip``,
``sign`` and ``where(cond, a, b)``; and learned parameters written ``name[h]`` (one per head) or ``name[layer, h]``.
KERPLE-log reads ``-a[layer, h] * log(1 + b[layer, h] * d)``.

The text is parsed by Python's ``ast`` into a tree whose every node kind is on a whitelist; the tree is then walked
with torch operations on the causal pairs (j <= i) only. Anything else (an attribute, an import, a lambda, a
comprehension, a string, a call or subscript of another name, more than ``MAX_CHARACTERS`` characters) is refused
with words that name it, and so is a value that overflows or is NaN on the causal pairs, or a row with no finite key.
No plotting and no Streamlit here.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Mapping

import torch

from posviz.errors import PosvizError

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


class FormulaError(PosvizError):
    """A formula that is not allowed, or whose values are not a bias; the message says which part and why."""


@dataclasses.dataclass(frozen=True)
class Formula:
    text: str
    tree: ast.Expression
    parameters: dict  # name -> ("h",) or ("layer", "h"): how it is indexed
    reads: frozenset  # the variables it reads

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
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise FormulaError(f"The formula is not an expression: {getattr(exc, 'msg', None) or exc}.") from None
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
    return Formula(text, tree, parameters, frozenset(reads))


def _is_indexed(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Subscript) and n.value is name for n in ast.walk(tree))


def formula_values(formula: Formula, scope: Mapping[str, torch.Tensor], parameters: Mapping[str, torch.Tensor],
                   layer: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
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
        if isinstance(node, ast.Compare):
            left, out = walk(node.left), None
            for op, comparator in zip(node.ops, node.comparators):
                right = walk(comparator)
                step = COMPARE[type(op)](left, right).to(dtype)
                out = step if out is None else out * step
                left = right
            return out
        if isinstance(node, ast.Call):
            return FUNCTIONS[node.func.id][1](*[walk(a) for a in node.args])
        raise FormulaError(f"{_describe(node)} is not allowed in a formula.")  # parse_formula let nothing else through

    return walk(formula.tree)


def pair_scope(q_pos: torch.Tensor, k_pos: torch.Tensor, H: int, L: int, layer: int,
               dtype: torch.dtype = torch.float64) -> dict:
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


def distance_scope(lo: int, hi: int, H: int, L: int, layer: int, dtype: torch.dtype = torch.float64,
                   device=None) -> dict:
    """The variables of a formula of the distance alone, for distances lo..hi: d (1, D) and h (H, 1)."""
    return {"d": torch.arange(lo, hi + 1, dtype=dtype, device=device).view(1, -1),
            "h": torch.arange(H, dtype=dtype, device=device).view(H, 1),
            "H": torch.tensor(float(H), dtype=dtype), "L": torch.tensor(float(L), dtype=dtype),
            "layer": torch.tensor(float(layer), dtype=dtype)}


def check_values(bias: torch.Tensor, where: str = "") -> None:
    """Refuse a bias (H, ...) with a NaN or +inf value: only -inf (a hard cut) is allowed."""
    if torch.isnan(bias).any():
        raise FormulaError(f"The formula is NaN on some causal pair{where} (a log or sqrt of a negative number, "
                           "0/0, ...).")
    if torch.isposinf(bias).any():
        raise FormulaError(f"The formula overflows to +inf on some causal pair{where}; only -inf (a hard cut) is "
                           "allowed.")


def evaluate(formula: Formula, T: int, H: int, L: int, layer: int = 0,
             parameters: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """(H, T, T) float64: the bias of every causal pair (j <= i) of a T-position context, -inf above the diagonal.
    ``parameters``: name -> (H,) or (n_layer, H) values. Refused (FormulaError) when a causal value is NaN or +inf, or
    a row has no finite key."""
    pos = torch.arange(T)
    with torch.no_grad():
        bias = formula_values(formula, pair_scope(pos, pos, H, L, layer), dict(parameters or {}), layer)
        bias = bias.expand(H, T, T).clone()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    check_values(bias[:, causal])
    bias[:, ~causal] = float("-inf")
    if (~torch.isfinite(bias).any(dim=-1)).any():
        raise FormulaError("Some query has no key with a finite bias: every row needs at least one key it may attend.")
    return bias
