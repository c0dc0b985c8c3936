"""The layout: old import paths still import (as the module they became, with a warning naming
the new one), and the folders hold no import circle."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

from sfg.moved import MOVED, new_name

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_path_is_the_new_module_with_a_warning(old):
    new = MOVED[old]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
               for w in caught) or old in __import__("sys").modules


def test_submodules_of_moved_packages_resolve():
    assert new_name("sfg.rules.library") == "sfg.round.rules.library"
    assert new_name("sfg.data.partition") == "sfg.world.data.partition"
    assert new_name("sfg.replay.api") is None  # did not move
    from sfg.rules.library import rule  # noqa: F401 - old path, new module

    from sfg.round.rules import library

    assert importlib.import_module("sfg.rules.library") is library


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sfg"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("sfg"))
    return out


def test_no_import_circle_between_modules():
    """Module-level and function-level imports alike; a package's face (``__init__``) may
    gather its own modules."""
    mods = {}
    for path in (SRC / "sfg").rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        if rel[-1] != "__init__":
            mods[name] = path
    graph = {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                raise AssertionError(" -> ".join([*stack[stack.index(n):], n]))
            if n not in state:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_two_module_names_differ_by_one_letter():
    names = sorted({p.stem for p in (SRC / "sfg").rglob("*.py") if p.stem != "__init__"})

    def one_apart(a, b):
        if abs(len(a) - len(b)) > 1 or a == b:
            return False
        if len(a) == len(b):
            return sum(x != y for x, y in zip(a, b, strict=True)) == 1
        short, long_ = sorted((a, b), key=len)
        return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))

    assert [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if one_apart(a, b)] == []


def test_every_name_a_package_face_exports_resolves():
    import sfg.replay
    import sfg.round
    import sfg.world.traces

    for package in (sfg.round, sfg.replay, sfg.world.traces):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
