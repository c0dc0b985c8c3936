"""A stranger's path, as a script (``make stranger``; not part of ``make test``).

What a new user does from a copy of the source, end to end, in fresh folders: copy the source
(the files a clone has), build the wheel,
make a new virtual environment, install the pinned CPU build of PyTorch first and then the
wheel with the ``train``, ``report`` and ``net`` extras, and run, with that environment's
``sfg`` and ``python`` only (no ``src/`` on the path):

* every runnable example of the README and of the how-to pages (the blocks tagged
  ``<!-- runnable -->``, each in a fresh folder with the sample files beside its page; the
  doc test's own reading of the pages, ``tests/test_docs.py``);
* a sample plugin of one's own: a module with one rule, loaded with ``--plugin``, replayed and
  trained; the same rule with a typo is one ``error:`` line naming its file and line.

Prints each step's time and the total; exits 1 at the first step that fails (its output shown).
``python tests/stranger.py [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
PLUGIN = '''
import numpy as np

from sfg.round.jit import njit
from sfg.round.rules import Unit, rule


@rule("half-stale", tags=("control",))
@njit(cache=True)
def half_stale(x, share: Unit = 0.5):
    """half-stale: candidates older than the receiver score ``share``, the rest 1."""
    return np.where(x.age > x.age[0], share, 1.0)
'''


def _step(what: str, args: list[str], *, cwd: Path, env: dict | None = None,
          expect: int = 0, timeout: float = 900) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    print(f"{took:7.1f} s  {what}", flush=True)
    if r.returncode != expect:
        print(f"FAILED (exit {r.returncode}, expected {expect}): {shlex.join(args)}\n"
              f"{r.stdout[-3000:]}{r.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(1)
    return r


def _examples():
    sys.path.insert(0, str(ROOT / "tests"))
    import test_docs  # the doc test's own reading of the pages

    pages = {ROOT / "README.md", *(ROOT / "docs" / "howto").glob("*.md")}
    for page, lang, code, tag, ident in test_docs._examples():
        if page in pages and tag == "runnable" and lang in ("console", "python"):
            yield page, lang, code, ident, test_docs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    a = ap.parse_args(argv)
    work = a.keep or Path(tempfile.mkdtemp(prefix="sfg-stranger-"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    try:
        dist, venv, copy = work / "dist", work / "venv", work / "source"
        # a copy of the source as a clone has it (the tracked files and those git does not
        # ignore), so nothing built here before (build/, egg-info) reaches the wheel
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            if (ROOT / name).is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, copy / name)
        _step("build the wheel", [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                                  "--no-build-isolation", "-w", str(dist), str(copy)], cwd=work)
        (wheel,) = dist.glob("sfg-*.whl")
        _step("a fresh virtual environment", [sys.executable, "-m", "venv", str(venv)], cwd=work)
        py, sfg = venv / "bin" / "python", venv / "bin" / "sfg"
        _step(f"pip install {TORCH} (the CPU build, first)",
              [str(py), "-m", "pip", "install", "-q", TORCH], cwd=work)
        _step("pip install the wheel with train, report, net",
              [str(py), "-m", "pip", "install", "-q", f"sfg[train,report,net] @ {wheel.as_uri()}"],
              cwd=work)
        _step("sfg --version", [str(sfg), "--version"], cwd=work)
        for n, (page, lang, code, ident, docs) in enumerate(_examples()):
            here = work / f"example-{n}"
            here.mkdir()
            docs._samples(page, code, here)
            if lang == "python":
                (here / "example.py").write_text(code)
                _step(ident, [str(py), "example.py"], cwd=here)
                continue
            for command in docs._commands(code, "console"):
                _step(f"{ident}: {command[:70]}", [str(sfg), *shlex.split(command)[1:]],
                      cwd=here)
        plug = work / "plugin"
        plug.mkdir()
        (plug / "my_rules.py").write_text(textwrap.dedent(PLUGIN))
        env = {"PATH": str(venv / "bin"), "PYTHONPATH": str(plug), "HOME": str(work)}
        _step("a plugin rule in the replay", [str(sfg), "--plugin", "my_rules", "replay", "-p",
                                             "bursty:u=0.8", "-r", "half-stale:share=0.3",
                                             "-r", "dfedavg", "-n", "20", "-T", "30",
                                             "--seeds", "1"], cwd=plug, env=env)
        _step("a plugin rule in training", [str(sfg), "--plugin", "my_rules", "run", "-r",
                                           "half-stale", "-n", "8", "-T", "3", "-K", "1"],
              cwd=plug, env=env)
        (plug / "typo_rules.py").write_text(textwrap.dedent(PLUGIN).replace(
            "half-stale", "typo-stale").replace("x.age > x.age[0]", "x.agee > x.age[0]"))
        r = _step("a plugin rule with a typo: one error line", [
            str(sfg), "--plugin", "typo_rules", "replay", "-r", "typo-stale", "-n", "20",
            "-T", "5", "--seeds", "1"], cwd=plug, env=env, expect=2)
        lines = r.stderr.strip().splitlines()
        if len(lines) != 1 or "typo_rules.py:" not in lines[0]:
            print(f"FAILED: the typo's error is not one line naming the file:\n{r.stderr}",
                  file=sys.stderr)
            return 1
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{time.perf_counter() - t_all:7.1f} s  the stranger's path, in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
