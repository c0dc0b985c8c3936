"""The documentation site (MkDocs, docs/ and mkdocs.yml) and its examples.

* the strict build succeeds (a broken link, anchor or API reference fails it);
* every ```python block in docs/**/*.md and README.md runs (fence info ``norun`` opts out);
* every ```console block preceded by ``<!-- runnable -->`` runs: each ``$ sfg ...`` line exits 0;
* the command-line reference lists every command and option of the click tree, and is current;
* the README stays a landing page (at most 200 lines, links into the docs that exist).

See docs/contributing.md.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
RUNNABLE = "<!-- runnable -->"


def _blocks(path: Path):
    """``(info, code, runnable, line)`` for every fenced block of a Markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        prev = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        out.append((info, "\n".join(body) + "\n", prev == RUNNABLE, i + 1))
        i = j + 1
    return out


def _collect(kind: str):
    cases = []
    for page in PAGES:
        for info, code, runnable, line in _blocks(page):
            words = info.replace("{", " ").replace("}", " ").split()
            lang = words[0] if words else ""
            rel = page.relative_to(ROOT).as_posix()
            if kind == "python" and lang == "python" and "norun" not in words:
                cases.append(pytest.param(code, id=f"{rel}:{line}"))
            if kind == "console" and lang == "console" and runnable:
                cases.append(pytest.param(code, id=f"{rel}:{line}"))
    return cases


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


@pytest.mark.parametrize("code", _collect("python"))
def test_python_example_runs(code, tmp_path):
    script = tmp_path / "example.py"  # a file, so that numba can cache what it compiles
    script.write_text(code, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.parametrize("code", _collect("console"))
def test_runnable_cli_example(code, tmp_path):
    commands = [ln[2:] for ln in code.splitlines() if ln.startswith("$ sfg ")]
    assert commands, "a runnable console block needs at least one `$ sfg ...` line"
    for command in commands:
        args = shlex.split(command)[1:]
        r = subprocess.run([sys.executable, "-m", "sfg", *args], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"$ {command}\n{r.stdout[-2000:]}{r.stderr[-4000:]}"


def test_examples_found():
    assert len(_collect("python")) >= 5
    assert len(_collect("console")) >= 4


# ---------------------------------------------------------------- command-line reference


def _gen_cli():
    spec = importlib.util.spec_from_file_location("sfg_docs_gen_cli", DOCS / "gen_cli.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^#{2,3} `(sfg[^`]*)` \{#[^}]*\}$", text, flags=re.M)
    return {parts[k]: parts[k + 1] for k in range(1, len(parts), 2)}


def test_cli_reference_lists_every_command_and_option():
    gen = _gen_cli()
    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    sections = _sections(text)
    root = gen.command_tree()
    seen = 0
    for path, cmd in gen.walk(root):
        if not path:
            continue
        name = "sfg " + " ".join(path)
        assert name in sections, f"{name} missing from docs/reference/cli.md"
        body = sections[name]
        for p in cmd.params:
            if p.param_type_name != "option" or p.hidden:
                continue
            for opt in [*p.opts, *p.secondary_opts]:
                assert f"`{opt}`" in body, f"{name} {opt} missing from docs/reference/cli.md"
                seen += 1
    assert len(sections) == sum(1 for p, _ in gen.walk(root) if p)
    assert seen > 100


def test_cli_reference_is_current():
    gen = _gen_cli()
    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert text == gen.render(gen.command_tree()), "run: python docs/gen_cli.py"


def test_store_schema_page_lists_every_table():
    from sfg.experiments import store

    ddl = store._SCHEMA + store._DIAGNOSTICS_TABLE + store._GRID_RUNS_TABLE
    tables = re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", ddl)
    page = (DOCS / "reference" / "store.md").read_text(encoding="utf-8")
    for table in tables:
        assert f"| `{table}` |" in page, table
    for column in re.findall(r"^\s+(\w+)\s+(?:TEXT|INTEGER|REAL)", ddl, flags=re.M):
        assert f"`{column}`" in page, column


# ---------------------------------------------------------------- README and build


def test_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).exists(), link
    assert "make demo" in text and "make test" in text
    # the measured numbers and findings live in the docs; the README points to them
    assert "docs/figures.md" in text and "docs/findings/" in text
    assert "docs/concepts/" in text  # the model's reference pages
    assert not re.search(r"\d+(\.\d+)?\s?(pp|%)\b|\[[+-]\d", text), "numbers belong in docs/"


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                        "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()
