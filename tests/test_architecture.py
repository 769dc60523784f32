"""The house's architecture, held by tests: posviz/ imports nothing in a circle, no module outgrows what
it is about, and the labs and pages do not ask which kind of model or text they hold (the model
interface answers instead: ``posviz.models.interface.LabModel``)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

# What asks a model or a text for its kind instead of asking the interface (see README: one text contract).
KIND_QUESTION = re.compile(r'unit *[!=]= *"(byte|token)"|\.published\b|is_published|isinstance\([^)]*(Published|Checkpoint)'
                           r'|getattr\([^,]+, *"(length_cap_reason|context_known|loaded|needs_loading)"')
MOST_KIND_QUESTIONS = 5
MOST_LINES = {"posviz": 500, "views": 500, "posviz_tools": 800}


def python_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The posviz modules ``path`` imports anywhere in it (function-level imports too): ``from a.b import c``
    is a.b.c when that is a module, else a.b."""
    out = set()
    package = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                base = ".".join(parent[: len(parent) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
    return {m for m in out if m in known}


def import_graph(folders=("posviz",)) -> dict[str, set[str]]:
    files = [f for folder in folders for f in python_files(folder)]
    known = {module_name(f) for f in files}
    graph = {module_name(f): imported_modules(f, known) for f in files}
    # a package's __init__ runs before any of its modules: importing posviz.a.b imports posviz and posviz.a
    return {m: {d for d in deps if d != m and not m.startswith(d + ".")} for m, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of imports, each once (Tarjan's strongly connected components of more than one module)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_nothing_imports_in_a_circle():
    """posviz, the pages and the tools: a function-level import counts (it is a circle the day it runs first)."""
    graph = import_graph(("posviz", "views", "posviz_tools"))
    assert len(graph) > 60 and graph["posviz.labs.extrapolation"] and graph["views._page"], "the import graph was not read"
    assert not cycles(graph), cycles(graph)


def test_the_position_methods_import_nothing_of_the_pages_rooms():
    """A method (the formula's too) is the core's: posviz/positions imports no workshop, lab or page module."""
    graph = import_graph()
    reaches = {m: sorted(d for d in deps if d.startswith(("posviz.workshop", "posviz.labs", "posviz.explore")))
               for m, deps in graph.items() if m.startswith("posviz.positions")}
    assert not {m: d for m, d in reaches.items() if d}, reaches


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_model_kinds_depend_on_the_interface_not_the_other_way():
    graph = import_graph()
    interface = graph["posviz.models.interface"]
    assert not {m for m in interface if m.startswith(("posviz.models.shipped", "posviz.models.hf"))}, interface
    assert "posviz.models.interface" in graph["posviz.models.shipped"]


def test_no_module_outgrows_what_it_is_about():
    too_long = [f"{p.relative_to(ROOT)} ({n} lines)" for folder, most in MOST_LINES.items()
                for p in python_files(folder) if (n := len(p.read_text().splitlines())) > most]
    assert not too_long, too_long


def test_labs_and_pages_ask_the_interface_not_the_kind():
    asks = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for folder in ("posviz", "views")
            for p in python_files(folder) for i, line in enumerate(p.read_text().splitlines(), 1)
            if KIND_QUESTION.search(line)]
    assert len(asks) <= MOST_KIND_QUESTIONS, asks
    assert all("#" in a for a in asks), f"each must say in a comment why it cannot be otherwise: {asks}"
    assert KIND_QUESTION.search('if model.unit == "byte":') and KIND_QUESTION.search("catalog.published")
    assert KIND_QUESTION.search('getattr(models[n], "length_cap_reason", None)')
