"""Harness of the bad-input suite: run ``sfg`` on one bad input and check how it failed.

Each case runs the real command line (``sfg.cli.main.main``), in-process for speed, or in a child
process under an address-space limit (``RLIMIT_AS``) for inputs built to ask for a lot of
memory. Every case asserts the exit status (2 for bad input, 1 for failed work), exactly one
non-empty line on stderr and that it starts with ``error: ``, no traceback, and that no file
appeared outside the case's output folder.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sfg

SRC = str(Path(sfg.__file__).resolve().parents[1])
GiB = 1 << 30
TIME_LIMIT = 90  # seconds: a hang, not a slow run, trips it


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class Case:
    """One bad input: ``build(folder) -> argv`` writes its files into ``folder``."""

    id: str
    build: Callable[[Path], list[str]]
    match: str
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)
    limit_gib: float = 0.0  # > 0: run in a child process under this address-space limit


def _env(work: Path, extra: dict[str, str]) -> dict[str, str]:
    return {"SFG_CACHE_DIR": str(work / "out" / "cache"),
            "XDG_CACHE_HOME": str(work / "out" / "xdg"), "COLUMNS": "200", **extra}


@contextlib.contextmanager
def _alarm(seconds: int):
    def boom(*_):
        raise TimeoutError(f"sfg did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_inprocess(argv: list[str], work: Path, env: dict[str, str]) -> Result:
    from sfg.cli.main import main

    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _alarm(TIME_LIMIT):
            try:
                code = main(list(argv))
            except SystemExit as e:  # a main that exits instead of returning
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001 - recorded as a traceback, which the test refuses
                import traceback

                err.write(traceback.format_exc())
                code = -1
    finally:
        os.chdir(cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Result(int(code or 0), out.getvalue(), err.getvalue())


def run_limited(argv: list[str], work: Path, env: dict[str, str], limit_gib: float) -> Result:
    limit = int(limit_gib * GiB)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    code = "import sys; from sfg.cli.main import main; sys.exit(main(sys.argv[1:]))"
    # the budget well under the address-space limit, so that a refusal is what keeps it there
    full_env = {**os.environ, "SFG_MAX_MEMORY": "256M", **env, "PYTHONPATH": SRC + os.pathsep + os.environ.get(
        "PYTHONPATH", ""), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", code, *argv], cwd=work, env=full_env,
                       capture_output=True, text=True, timeout=TIME_LIMIT, preexec_fn=cap)
    return Result(p.returncode, p.stdout, p.stderr)


def snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in files + dirs:
            p = Path(dirpath) / name
            if p == skip:
                continue
            st = p.lstat()  # folders by name only: SQLite may make and remove side files
            out[str(p.relative_to(root))] = (0, 0) if p.is_dir() else (st.st_size,
                                                                       st.st_mtime_ns)
    return out


def check_case(case: Case, tmp: Path) -> Result:
    """Build the case's files, run sfg on them and assert the failure contract."""
    inputs, work = tmp / "in", tmp / "work"
    inputs.mkdir()
    (work / "out").mkdir(parents=True)
    argv = [a.replace("{out}", str(work / "out")) for a in case.build(inputs)]
    before = snapshot(tmp, work / "out")
    env = _env(work, case.env)
    res = (run_limited(argv, work, env, case.limit_gib) if case.limit_gib
           else run_inprocess(argv, work, env))
    assert_failed(res, case.code, case.match, argv)
    after = snapshot(tmp, work / "out")
    assert after == before, f"files written or changed outside the output folder: " \
                            f"{sorted(set(after.items()) ^ set(before.items()))}"
    return res


def assert_failed(res: Result, code: int, match: str, argv: list[str] | None = None) -> None:
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    shown = f"argv={argv}\nexit={res.code}\nstderr:\n{res.err[-3000:]}\nstdout:\n{res.out[-500:]}"
    assert "Traceback" not in res.err + res.out, shown
    assert res.code == code, shown
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    assert re.search(match, lines[0]), f"message does not match {match!r}:\n{shown}"
