"""The layout: the import paths of 0.1 are gone (no import hook at ``import sfg``), and the
folders hold no import circle."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


#: the import paths of 0.1, removed in 0.3 (the CHANGELOG names where each lives now)
OLD_PATHS = [
    "sfg.rounds", "sfg.staleness", "sfg.defences", "sfg.attacks", "sfg.jit", "sfg.rules",
    "sfg.graphs", "sfg.models", "sfg.outages", "sfg.traces", "sfg.data", "sfg.stats",
    "sfg.report", "sfg.report_diagnostics", "sfg.attack_report", "sfg.console",
    "sfg.replay_cli", "sfg.sim.cli", "sfg.net.cli", "sfg.experiments.cli", "sfg.report_cli",
    "sfg.pretrain_cli", "sfg.demo", "sfg.pretrain", "sfg.spec", "sfg.safety", "sfg.rng",
    "sfg.lazy", "sfg.alloc", "sfg.net.state",
]


def test_import_sfg_installs_no_import_hook_and_the_old_paths_are_gone():
    """In a fresh interpreter (this one has imported half of sfg): ``import sfg`` adds to
    ``sys.meta_path`` only the finder of the model-free package's 0.2 name, ``sfg.replay.*``
    (:mod:`sfg.util.moved`, until 0.4), and no path of 0.1 imports."""
    code = (
        "import importlib, json, sys\n"
        "before = list(sys.meta_path)\n"
        "import sfg\n"
        f"old = {OLD_PATHS!r}\n"
        "found = []\n"
        "for name in old:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        found.append(name)\n"
        "    except ImportError:\n"
        "        pass\n"
        "print(json.dumps({'hooks': [f'{type(f).__module__}.{type(f).__name__}'"
        " for f in sys.meta_path if f not in before],"
        " 'found': found}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=SRC.parent)
    assert json.loads(out.stdout) == {"hooks": ["sfg.util.moved._Finder"], "found": []}


def test_the_changelog_says_where_each_old_path_went():
    text = (SRC.parent / "CHANGELOG.md").read_text()
    removed = text[text.index("### Removed"):]
    removed = removed[:removed.index("\n## ")]
    assert [p for p in OLD_PATHS if f"`{p}`" not in removed] == []


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
    import sfg.modelfree
    import sfg.round
    import sfg.world.traces

    for package in (sfg.round, sfg.modelfree, sfg.world.traces):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
