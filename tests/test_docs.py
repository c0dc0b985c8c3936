"""The documentation site (MkDocs, docs/ and mkdocs.yml) and its examples.

* the strict build succeeds (a broken link, anchor or API reference fails it);
* every example — each ```console, ```bash and ```python block of docs/**/*.md and README.md —
  is accounted for by the comment on the line before it: ``<!-- runnable -->`` (it runs as
  written: each ``$ sfg ...`` line of a console block exits 0, a Python block runs as a
  script; in a fresh folder holding the sample files it names from beside its page) or
  ``<!-- not-run: REASON -->`` (a GPU, several hosts, an install, hours), whose ``sfg``
  command lines are still parsed against the command tree (every option and value is one
  the command takes); an untagged block fails;
* the command-line reference lists every command and option of the click tree, and is current;
* the README stays a landing page (at most 200 lines, links into the docs that exist).

See docs/contributing.md.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
RUNNABLE = "<!-- runnable -->"
NOT_RUN = re.compile(r"^<!-- not-run: (\S.*?) -->$")
#: the blocks that are examples (each must be tagged)
EXAMPLES = ("console", "bash", "python")
#: a runnable example's bound (its budget is 30 s on an idle machine; the bound leaves room for
#: a loaded one)
BOUND_S = 120


def _blocks(path: Path):
    """``(info, code, tag, line)`` for every fenced block of a Markdown file; ``tag`` is the
    comment on the line before it: "runnable", "not-run: REASON" or None."""
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
        nr = NOT_RUN.match(prev)
        tag = "runnable" if prev == RUNNABLE else f"not-run: {nr.group(1)}" if nr else None
        out.append((info, "\n".join(body) + "\n", tag, i + 1))
        i = j + 1
    return out


def _lang(info: str) -> str:
    words = info.replace("{", " ").replace("}", " ").split()
    return words[0] if words else ""


def _examples():
    """(page, lang, code, tag, id) of every example block."""
    for page in PAGES:
        for info, code, tag, line in _blocks(page):
            lang = _lang(info)
            if lang in EXAMPLES:
                yield page, lang, code, tag, f"{page.relative_to(ROOT).as_posix()}:{line}"


def _collect(lang: str, tag: str):
    return [pytest.param(page, code, id=ident) for page, lg, code, t, ident in _examples()
            if lg == lang and (t or "").startswith(tag)]


def _commands(code: str, lang: str) -> list[str]:
    """The ``sfg`` command lines of a console (``$ sfg ...``) or bash (``sfg ...``) block, with
    continuation lines joined, comments and leading ``VAR=value`` assignments dropped."""
    text = re.sub(r"\\\n\s*", " ", code)
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if lang == "console":
            if not ln.startswith("$ "):
                continue
            ln = ln[2:]
        words = shlex.split(ln, comments=True)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words = words[1:]
        if words and words[0] == "sfg":
            out.append(shlex.join(words))
    return out


def _samples(page: Path, code: str, into: Path) -> None:
    """Copy the sample files beside ``page`` that ``code`` names into ``into``."""
    if page.parent == ROOT:
        return
    for f in page.parent.iterdir():
        if f.is_file() and f.suffix != ".md" and re.search(rf"\b{re.escape(f.name)}\b", code):
            shutil.copy(f, into / f.name)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


def test_every_example_is_runnable_or_says_why_not():
    untagged = [ident for _, _, _, tag, ident in _examples() if tag is None]
    assert not untagged, ("tag each example `<!-- runnable -->` or `<!-- not-run: REASON -->`"
                          f" (docs/contributing.md): {untagged}")
    for _page, lang, code, tag, ident in _examples():
        if tag == "runnable" and lang in ("console", "bash"):
            assert lang == "console", f"{ident}: a runnable command block is ```console"
            lines = [ln for ln in code.splitlines() if ln.startswith("$ ")]
            assert lines and all(ln.startswith("$ sfg ") for ln in lines), (
                f"{ident}: a runnable block runs `$ sfg ...` lines only")


def _parse(args: list[str]):
    """Parse ``sfg ARGS`` against the command tree without running it (click's
    ``make_context`` down to the sub-command): an unknown option, a missing value or one of
    the wrong type raises."""
    import typer

    from sfg.cli.main import app

    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("sfg", list(args))
    while hasattr(cmd, "commands"):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, cmd, rest = cmd.resolve_command(ctx, rest)
        ctx = cmd.make_context(name, rest, parent=ctx)
    return ctx


@pytest.mark.parametrize("page, code", [*_collect("console", "not-run"),
                                        *_collect("bash", "not-run")])
def test_a_not_run_command_parses(page, code):
    lang = "console" if "$ " in code else "bash"
    for command in _commands(code, lang):
        _parse(shlex.split(command)[1:])


def test_the_parse_check_can_fail():
    with pytest.raises(Exception, match="No such option"):
        _parse(["replay", "--no-such-option"])
    with pytest.raises(Exception, match="valid integer"):
        _parse(["replay", "--clients", "many"])
    assert _commands("$ SFG_PLUGINS=m sfg replay \\\n   -r sfg  # note\n", "console") == [
        "sfg replay -r sfg"]


@pytest.mark.parametrize("page, code", _collect("python", "runnable"))
def test_python_example_runs(page, code, tmp_path):
    _samples(page, code, tmp_path)
    script = tmp_path / "example.py"  # a file, so that numba can cache what it compiles
    script.write_text(code, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=BOUND_S)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.parametrize("page, code", _collect("console", "runnable"))
def test_runnable_cli_example(page, code, tmp_path):
    _samples(page, code, tmp_path)
    commands = _commands(code, "console")
    assert commands, "a runnable console block needs at least one `$ sfg ...` line"
    for command in commands:
        args = shlex.split(command)[1:]
        r = subprocess.run([sys.executable, "-m", "sfg", *args], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=BOUND_S)
        assert r.returncode == 0, f"$ {command}\n{r.stdout[-2000:]}{r.stderr[-4000:]}"


def test_examples_found():
    assert len(_collect("python", "runnable")) >= 10
    assert len(_collect("console", "runnable")) >= 8
    assert len(_collect("console", "not-run")) >= 10


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
