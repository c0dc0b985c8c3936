"""Installable parts: the wheel and sdist from ``python -m build``, the core installed alone in a
fresh virtual environment (no torch) running the replay, the rules and the one-receiver form,
a command whose extra is missing naming it, and one version everywhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import sfg
from sfg.cli.main import main
from sfg.util import extras

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DATA = ("sfg/assets/demo.yaml", "sfg/py.typed")


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


# ------------------------------------------------------------------------------ one version
def test_one_version_in_pyproject_init_and_changelog():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sfg.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", sfg.__version__)
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$",
                          (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert released and released[0] == sfg.__version__  # the newest entry is this version


# ------------------------------------------------------------------------------ the extras
def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_extras_table_matches_pyproject():
    deps = PYPROJECT["project"]["dependencies"]
    opt = PYPROJECT["project"]["optional-dependencies"]
    core = _names(deps)
    assert {"numpy", "numba"} <= core
    assert not core & {"torch", "matplotlib", "grpcio", "pillow", "statsmodels"}
    for module, extra in extras.EXTRA_OF.items():
        package = extras._PACKAGE.get(module, module).lower()
        assert package in _names(opt[extra]), (module, extra)  # the table names the right extra
        assert package not in core
    assert set(extras.EXTRA_OF.values()) | {"all", "dev", "docs"} == set(opt)
    everything = re.fullmatch(r"sfg\[(.*)\]", opt["all"][0]).group(1).split(",")
    assert set(everything) == set(opt) - {"all", "dev", "docs"}
    assert "sfg[all,docs]" in opt["dev"]
    # the docs extra is light: the site's tools only, none of all's heavy parts
    assert _names(opt["docs"]) == {"mkdocs", "mkdocs-material", "mkdocstrings",
                                   "mkdocstrings-python"}


def test_upper_bounds_are_the_newest_versions_tested():
    """The dependencies whose internals sfg uses (sfg.util.internals; torch: an aten op) are
    bounded above by the minor release after the one installed here, the newest tested."""
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    opt = PYPROJECT["project"]["optional-dependencies"]
    reqs = {Requirement(r).name.lower(): Requirement(r)
            for r in PYPROJECT["project"]["dependencies"] + opt["train"]}
    for name in ("numba", "numpy", "torch"):
        installed = Version(Version(version(name)).public.split("+")[0])
        spec = reqs[name].specifier
        assert spec.contains(installed), (name, installed, spec)
        (upper,) = [s for s in spec if s.operator == "<"]
        assert Version(upper.version) == Version(f"{installed.major}.{installed.minor + 1}"), (
            f"{name}: bound {upper}, tested {installed}")
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"


def test_make_test_ends_with_the_lowest_versions():
    """``make test``'s last step builds and runs .venv-lowest (tests/lowest.py) on test files
    that exist, with the lower bounds pyproject.toml states."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import lowest
    finally:
        sys.path.remove(str(ROOT / "tests"))
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test: .*\n((?:\t.*\n)+)", make, re.M).group(1).splitlines()
    assert recipe[-1].strip() == "$(MAKE) --no-print-directory test-lowest"
    files = re.search(r"^LOWEST_TESTS := ((?:.*\\\n)*.*)$", make, re.M).group(1)
    files = files.replace("\\\n", " ").split()
    assert len(files) >= 6 and all((ROOT / f).is_file() for f in files), files
    assert "tests/test_sim.py" in files and "tests/test_round.py" in files  # training, core
    assert lowest.pins() == ["numpy==1.24", "numba==0.59", "scipy==1.10", "typer==0.16",
                             "pydantic==2"]
    assert ".venv-lowest/" in (ROOT / ".gitignore").read_text().split()


def test_missing_extra_is_one_error_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(extras, "installed", lambda m: m not in ("torch", "matplotlib"))
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert error_lines(err) == [err.strip()] and "pip install 'sfg[train]'" in err
    assert "torch is not installed" in err and err.startswith("error: sfg run needs the 'train'")
    assert main(["demo"]) == 2
    assert "pip install 'sfg[train,report]'" in capsys.readouterr().err
    assert main(["swarm"]) == 2
    assert "'net' extra (torch is not installed): pip install 'sfg[net]'" in capsys.readouterr().err


def test_an_import_that_fails_anyway_names_its_extra(capsys):
    import typer

    from sfg.cli import console

    app = typer.Typer()

    @app.command("plot")
    def plot() -> None:
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib.figure")

    @app.command("other")
    def other() -> None:
        pass

    assert console.run_app(app, ["plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: sfg plot needs the 'report' extra (matplotlib is not "
                   "installed): pip install 'sfg[report]'")
    assert extras.missing_extra(ModuleNotFoundError("x", name="numpy"), "sfg x") is None
    with pytest.raises(KeyError):
        extras.require("sfg x", "numpy")  # not optional: a bug in the caller


# ------------------------------------------------------------------------------ wheel, sdist
def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list[str], *, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def _source_copy(dest: Path) -> Path:
    """What the build reads, copied: the project files and ``src/`` without caches or
    ``*.egg-info`` (setuptools writes egg-info into the tree it builds, and a stale one can
    carry deleted files into the sdist)."""
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md", "MANIFEST.in", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build``: the sdist, then the wheel built from the sdist (as pip would)."""
    out = tmp_path_factory.mktemp("dist")
    src = _source_copy(tmp_path_factory.mktemp("source"))
    r = _run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], cwd=out,
             timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_sdist_and_wheel_carry_the_package_data(dist):
    v = sfg.__version__
    sdist = dist / f"sfg-{v}.tar.gz"
    wheel = dist / f"sfg-{v}-py3-none-any.whl"
    assert sdist.exists() and wheel.exists(), sorted(p.name for p in dist.iterdir())
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {f"src/{p}" for p in PACKAGE_DATA} | {"pyproject.toml", "README.md",
                                                  "CHANGELOG.md"} <= names
    assert "src/sfg/util/extras.py" in names
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())
        meta = z.read(f"sfg-{v}.dist-info/METADATA").decode()
    assert set(PACKAGE_DATA) <= files and "sfg/cli/main.py" in files
    assert f"\nVersion: {v}\n" in meta
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                if line.startswith("Requires-Dist:")]
    assert not [r for r in requires if r.startswith("torch") and "extra ==" not in r]
    assert {"train", "net", "report", "ray", "parquet", "export", "all"} <= {
        line.split(":", 1)[1].strip() for line in meta.splitlines()
        if line.startswith("Provides-Extra:")}


WEIGHTS_ONE = """
import importlib.metadata, sys
import numpy as np
import sfg
from sfg.round.rules import parse_rule

assert importlib.metadata.version("sfg") == sfg.__version__, importlib.metadata.version("sfg")
assert "site-packages" in sfg.__file__, sfg.__file__
w = parse_rule("sfg-cut:L=2").weights_one(ages=[3, 0, 1], lags=[3.5, 0.5, 1.2],
                                           counts=[4, 9, 8], t=10)
assert w.shape == (3,) and abs(w.sum() - 1) < 1e-12 and w[0] == 0, w
print("weights", " ".join(f"{x:.6f}" for x in w))
assert "torch" not in sys.modules
"""


def test_core_alone_in_a_fresh_venv(dist, tmp_path):
    """The wheel with its core requirements only: replay, rules, traces and weights_one work;
    torch is not there; `sfg run` names the extra to install."""
    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    sfg_bin = venv / "bin" / "sfg"
    wheel = dist / f"sfg-{sfg.__version__}-py3-none-any.whl"
    r = _run([str(py), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    r = _run([str(py), "-c", "import torch"], cwd=tmp_path)
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr
    r = _run([str(py), "-m", "pip", "list", "--format=freeze"], cwd=tmp_path)
    installed = {line.split("==")[0].lower() for line in r.stdout.split()}
    assert {"numpy", "numba", "sfg"} <= installed
    assert not installed & {"torch", "matplotlib", "grpcio", "pillow", "statsmodels"}, installed

    r = _run([str(py), "-c", WEIGHTS_ONE], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("weights 0.000000 0.51")

    r = _run([str(sfg_bin), "replay", "-p", "bursty:u=0.8", "-r", "sfg-cut", "--seeds", "1",
              "--clients", "20", "--rounds", "30", "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"sfg-cut"' in r.stdout and '"bursty:u=0.8"' in r.stdout

    r = _run([str(sfg_bin), "rules"], cwd=tmp_path)
    assert r.returncode == 0 and "sfg-cut" in r.stdout, r.stderr

    trace = tmp_path / "fleet.csv"
    trace.write_text("device,round,available\na,0,1\na,1,0\nb,0,1\nb,1,1\n")
    r = _run([str(sfg_bin), "traces", "stats", "--source", "tabular", "--path", str(trace),
              "--json"], cwd=tmp_path)
    assert r.returncode == 0 and '"tabular"' in r.stdout, r.stderr

    r = _run([str(sfg_bin), "run"], cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert error_lines(r.stderr) == [r.stderr.strip()], r.stderr  # one line, no traceback
    assert "'train' extra" in r.stderr and "pip install 'sfg[train]'" in r.stderr
    r = _run([str(sfg_bin), "replay", "-p", "none", "-r", "sfg", "--seeds", "1", "--clients",
              "10", "--rounds", "5", "--plot", str(tmp_path / "s.png")], cwd=tmp_path)
    assert r.returncode == 2 and "pip install 'sfg[report]'" in r.stderr, r.stderr
