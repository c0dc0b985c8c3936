"""The lowest versions of sfg's core dependencies that pyproject.toml allows, as pins:
``make test-lowest`` installs them (``python tests/lowest.py --install``: this checkout with
:data:`EXTRAS`, the pins and the test tools; without arguments it prints the pins) in a
virtual environment of its own, ``.venv-lowest``, and runs the core and training smoke tests
there (the Makefile's ``LOWEST_TESTS``: lower bounds that are tested); ``--check``
there confirms that the lowest versions are the ones installed.

Lowered: numpy, numba, scipy, pydantic and typer (the rest install as pip resolves them
against these pins; torch is the CPU build the project's Makefile installs)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
LOWERED = ("numpy", "numba", "scipy", "pydantic", "typer")
#: sfg's extras installed there (the tests' imports: training, nodes, plots)
EXTRAS = "net,report"
#: what the tests themselves need there, installed beside the pins
TEST_TOOLS = ("pytest>=7", "hypothesis>=6")


def lower_bounds() -> dict[str, str]:
    """name -> the ``>=`` bound of each :data:`LOWERED` dependency in pyproject.toml."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out: dict[str, str] = {}
    for req in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", req)
        assert m, req
        name = m.group(1).lower()
        if name in LOWERED:
            low = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", m.group(2))
            assert low, f"{req}: no lower bound"
            out[name] = low.group(1)
    missing = set(LOWERED) - set(out)
    assert not missing, f"not in pyproject.toml's dependencies: {sorted(missing)}"
    return out


def pins() -> list[str]:
    return [f"{name}=={version}" for name, version in lower_bounds().items()]


def check() -> list[str]:
    """The lowered dependencies whose installed version is not the lower bound (empty: all
    are), each as ``name: installed X, lower bound Y``."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    bad = []
    for name, low in lower_bounds().items():
        try:
            got = version(name)
        except PackageNotFoundError:
            got = "none"
        if got == "none" or Version(got) != Version(low):
            bad.append(f"{name}: installed {got}, lower bound {low}")
    return bad


def install() -> int:
    """Install this checkout (editable, with :data:`EXTRAS`), the pins and the test tools into
    the environment of the Python running this (``make test-lowest``'s ``.venv-lowest``)."""
    import subprocess

    args = [sys.executable, "-m", "pip", "install", "-q", "-e", f".[{EXTRAS}]", *pins(),
            *TEST_TOOLS]
    return subprocess.run(args, cwd=ROOT).returncode


if __name__ == "__main__":
    if sys.argv[1:] == ["--install"]:
        sys.exit(install())
    if sys.argv[1:] == ["--check"]:  # in the environment made from the pins
        bad = check()
        print("; ".join(bad) if bad else "lowest: " + ", ".join(
            f"{n} {v}" for n, v in lower_bounds().items()))
        sys.exit(1 if bad else 0)
    print(" ".join(pins()))
