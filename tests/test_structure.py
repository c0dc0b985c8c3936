"""The code's structure, checked on the source (AST):

* no module under src/sfg uses another module's private names: ``from sfg.x import _name``
  (anywhere, inside functions too; relative imports alike) or ``mod._name`` where ``mod`` is
  an imported sfg module. Dunder names are fine, and so is binding a public name to a private
  local alias (``from sfg.round.staleness import waited as _waited``);
* no function or method is over :data:`MAX_LINES` lines anywhere under src/sfg (:data:`SHORT`;
  a compiled kernel too, split into stages).

Each check prints its offenders, one per line (``path:line what``), and each is run once on
planted offenders to show that it catches them.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_LINES = 150
SHORT = ("sfg",)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str, src: Path) -> bool:
    base = src.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The module an ``ImportFrom`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = here.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything but names and attributes."""
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    out.append(node.id)
    return out[::-1]


def private_uses(src: Path, package: str = "sfg") -> list[str]:
    """Every use of another module's private name under ``src/package``."""
    found: list[tuple[str, int, str]] = []
    for path in sorted((src / package).rglob("*.py")):
        here = _module_name(path, src)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = path.relative_to(src)
        modules: dict[str, str] = {}  # local name -> the sfg module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] != package:
                        continue
                    for part in a.name.split(".")[1:]:
                        if _private(part):
                            found.append((str(rel), node.lineno, f"import {a.name}"))
                    if a.asname:
                        modules[a.asname] = a.name
                    else:
                        modules[a.name.split(".")[0]] = package
            elif isinstance(node, ast.ImportFrom):
                mod = _absolute(node, here, path.name == "__init__.py")
                if mod.split(".")[0] != package:
                    continue
                for a in node.names:
                    if _private(a.name) and mod != here:
                        found.append((str(rel), node.lineno, f"from {mod} import {a.name}"))
                    elif _is_module(f"{mod}.{a.name}", src):
                        modules[a.asname or a.name] = f"{mod}.{a.name}"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            chain = _dotted(node.value)
            if chain is None or chain[0] not in modules:
                continue
            target = ".".join([modules[chain[0]], *chain[1:]])
            if _is_module(target, src) and target != here:
                found.append((str(rel), node.lineno,
                              f"{'.'.join(chain)}.{node.attr} ({target}.{node.attr})"))
    return [f"{p}:{line} {what}" for p, line, what in sorted(set(found))]


def long_functions(src: Path, folders=SHORT, limit: int = MAX_LINES) -> list[str]:
    """Every function or method over ``limit`` lines (its ``def`` line to its last line)."""
    found = []
    for folder in folders:
        for path in sorted((src / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        found.append(f"{path.relative_to(src)}:{node.lineno} {node.name} "
                                     f"{n} lines")
    return found


def _report(what: str, found: list[str]) -> str:
    text = f"{len(found)} {what}:\n" + "\n".join(f"  {f}" for f in found)
    print(text)
    return text


def test_no_module_uses_another_modules_private_names():
    found = private_uses(SRC)
    assert not found, _report("uses of another module's private names", found)


def test_no_long_functions():
    found = long_functions(SRC)
    assert not found, _report(f"functions over {MAX_LINES} lines", found)


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for name, code in files.items():
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(code))
    return src


def test_the_checks_catch_planted_offenders(tmp_path):
    body = "\n".join(f"        x{k} = {k}" for k in range(MAX_LINES))
    src = _plant(tmp_path, {
        "sfg/__init__.py": "",
        "sfg/a.py": "_hidden = 1\nopen_ = 2\n\n\ndef _helper():\n    return 1\n",
        "sfg/sub/__init__.py": "",
        "sfg/sub/b.py": """\
            import sfg.a
            import sfg.a as amod
            from sfg import a
            from sfg.a import open_ as _open  # a public name, privately aliased: fine
            from sfg.a import __doc__  # dunder: fine


            def f(self):
                from sfg.a import _hidden  # inside a function
                from ..a import _helper  # relative
                return a._helper(), amod._hidden, sfg.a._hidden, self._own, a.__name__
            """,
        "sfg/sub/c.py": "_mine = 1\n\n\ndef g():\n    from sfg.sub.c import _mine\n    return _mine\n",
        "sfg/sim/long.py": f"def short():\n    pass\n\n\nclass K:\n    def method(self):\n{body}\n",
    })
    got = private_uses(src)
    assert got == [
        "sfg/sub/b.py:9 from sfg.a import _hidden",
        "sfg/sub/b.py:10 from sfg.a import _helper",
        "sfg/sub/b.py:11 a._helper (sfg.a._helper)",
        "sfg/sub/b.py:11 amod._hidden (sfg.a._hidden)",
        "sfg/sub/b.py:11 sfg.a._hidden (sfg.a._hidden)",
    ], _report("found", got)
    assert long_functions(src, folders=("sfg/sim",)) == [
        f"sfg/sim/long.py:6 method {MAX_LINES + 1} lines"]
