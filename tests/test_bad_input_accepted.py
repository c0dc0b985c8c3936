"""Inputs that were silently altered or wrongly refused, and the budgets themselves.

* an availability quartile with no client (N = 3) is reported empty, the run succeeds;
* a store on read-only storage is read by ``sfg report`` and ``sfg grid status`` (not called
  "not an SQLite database"), and reading a store leaves no ``-wal``/``-shm`` files behind;
* options that may repeat (``--rule``) still repeat;
* every budget names its figure and its override, and raising the override lets the input in;
* an archive's head is scanned once however many dataset detectors ask.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from badinput import run_inprocess

import sfg
from sfg.errors import SfgError
from sfg.experiments.config import make_config
from sfg.experiments.store import Store
from sfg.util import safety


def _sfg(args, tmp_path, **env):
    (tmp_path / "out").mkdir(exist_ok=True)
    return run_inprocess(args, tmp_path, {"SFG_CACHE_DIR": str(tmp_path / "out"), **env})


# ------------------------------------------------------------------------------ empty quartile
def test_three_clients_report_their_empty_quartile(tmp_path):
    res = _sfg(["run", "--clients", "3", "--graph", "ring:k=1", "--rounds", "10", "--eval-every",
                "5", "--local-steps", "1", "--json"], tmp_path)
    assert res.code == 0, res.err
    m = json.loads(res.out)["metrics"]
    quartiles = [m[f"acc_q{q}"] for q in range(1, 5)]
    assert sum(q is None for q in quartiles) == 1  # 3 clients fill three quartiles
    assert all(0 <= q <= 1 for q in quartiles if q is not None)
    assert 0 <= m["acc_mean"] <= 1


def test_the_table_says_empty(tmp_path):
    res = _sfg(["run", "--clients", "3", "--graph", "ring:k=1", "--rounds", "10", "--eval-every",
                "5", "--local-steps", "1"], tmp_path)
    assert res.code == 0, res.err
    assert "empty (no client)" in res.out


# ------------------------------------------------------------------------------ stores
def _store(path: Path) -> Path:
    with Store(path) as s:
        s.add_runs([make_config(kind="selftest", seed=i, rounds=5, eval_every=5)
                    for i in range(5)])
    return path


def test_reading_a_store_leaves_no_side_files(tmp_path):
    p = _store(tmp_path / "s.sqlite")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.sqlite"]
    before = p.stat().st_mtime_ns
    res = _sfg(["grid", "status", "--store", str(p), "--json"], tmp_path)
    assert res.code == 0 and json.loads(res.out)["counts"]["queued"] == 5
    with Store(p, create=False, readonly=True) as s:
        assert s.counts()["queued"] == 5
        with pytest.raises(SfgError, match="read-only"):
            s.add_runs([make_config(kind="selftest", seed=9)])
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out", "s.sqlite"]
    assert p.stat().st_mtime_ns == before


READ_ONLY_CHILD = """
import json, sys
from sfg.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _read_only_run(folder: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run sfg with ``folder`` mounted read-only (a private mount namespace)."""
    env = {**os.environ, "PYTHONPATH": str(Path(sfg.__file__).resolve().parents[1]),
           "SFG_CACHE_DIR": str(cwd / "cache")}
    if os.geteuid() != 0:  # permissions alone make it read-only
        os.chmod(folder / "s.sqlite", 0o444)
        os.chmod(folder, 0o555)
        try:
            return subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, *args], cwd=cwd,
                                  env=env, capture_output=True, text=True, timeout=120)
        finally:
            os.chmod(folder, 0o755)
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("running as root without mount namespaces: no way to make storage "
                    "read-only here")
    script = (f"mount --bind -o ro {folder} {folder} && exec {sys.executable} -c "
              f"'{READ_ONLY_CHILD}' " + " ".join(f"'{a}'" for a in args))
    return subprocess.run([unshare, "-m", "sh", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [["grid", "status", "--json"],
                                     ["report", "--out", "OUT"]])
def test_report_and_status_read_a_store_on_read_only_storage(tmp_path, command):
    folder = tmp_path / "ro"
    folder.mkdir()
    p = _store(folder / "s.sqlite")
    from sfg.experiments.store import Store as _S

    with _S(p) as s:  # one finished run, so that the report has something to say
        rid, _ = s.claim(s.add_runs([make_config(kind="selftest", seed=1, rounds=5,
                                                 eval_every=5)]), "w:1:x")
    args = [c.replace("OUT", str(tmp_path / "report")) for c in command] + ["--store", str(p)]
    res = _read_only_run(folder, args, tmp_path)
    assert "not an SQLite" not in res.stderr, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    if command[0] == "grid":
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["counts"]["running"] == 1
    else:  # no run is done yet: the report says so, as for any store
        assert res.returncode == 2 and "no run records" in res.stderr, res.stderr
    assert sorted(x.name for x in folder.iterdir()) == ["s.sqlite"]


# ------------------------------------------------------------------------------ repeatable options
def test_repeatable_options_still_repeat(tmp_path):
    res = _sfg(["replay", "--rounds", "20", "--clients", "8", "--seeds", "1", "--graph",
                "ring:k=1", "--engine", "numpy", "--horizon", "5", "--rule", "sfg",
                "--rule", "dfedavg", "--json"], tmp_path)
    assert res.code == 0, res.err
    assert {r["rule"] for r in json.loads(res.out)["summary"]} == {"sfg", "dfedavg"}


# ------------------------------------------------------------------------------ budgets
def test_sizes_parse_and_print():
    assert safety.parse_size("4G") == 4 << 30
    assert safety.parse_size("512M") == 512 << 20
    assert safety.parse_size("8GiB") == 8 << 30
    assert safety.parse_size("1.5k") == 1536
    assert safety.parse_size("1000") == 1000
    with pytest.raises(SfgError, match="'lots' is not a size; write e.g. 4G"):
        safety.parse_size("lots")
    assert safety.human_bytes(4 << 30) == "4 GiB"
    assert safety.human_bytes(1.5 * (1 << 30)) == "1.5 GiB"
    assert safety.human_bytes(300) == "300 B"


def test_budget_message_has_the_figure_and_the_override(monkeypatch):
    monkeypatch.setenv("SFG_MAX_MEMORY", "1G")
    with pytest.raises(SfgError) as e:
        safety.check_cells(4.2e8, 30, 1, "this trace", fix="pass rounds=")
    msg = str(e.value)
    assert msg.startswith("this trace spans 4.2e+08 rounds x 30 devices = 11.7 GiB, over the "
                          "limit of 1 GiB (raise it with SFG_MAX_MEMORY=")
    assert msg.endswith("; pass rounds=")
    safety.check_cells(1000, 30, 1, "this trace")  # well inside: no error
    monkeypatch.setenv("SFG_MAX_MEMORY", "a lot")
    with pytest.raises(SfgError, match="SFG_MAX_MEMORY 'a lot' is not a size"):
        safety.max_memory()
    monkeypatch.setenv("SFG_MAX_RUNS", "-3")
    with pytest.raises(SfgError, match="SFG_MAX_RUNS='-3' must be positive"):
        safety.max_runs()


def test_raising_the_budget_lets_the_input_in(tmp_path, monkeypatch):
    from sfg.world.traces.tabular import load_tabular

    p = tmp_path / "t.csv"
    p.write_text("device,round,available\nx,3000000,1\ny,0,1\n")  # 3e6 rounds x 2 devices
    monkeypatch.setenv("SFG_MAX_MEMORY", "4M")
    with pytest.raises(SfgError, match=r"spans 3,000,001 rounds x 2 devices = 5.7 MiB, over the "
                                       r"limit of 4 MiB"):
        load_tabular(p)
    monkeypatch.setenv("SFG_MAX_MEMORY", "64M")
    trace = load_tabular(p)
    assert trace.available.shape == (3_000_001, 2) and trace.available.sum() == 2


def test_grid_size_limit_can_be_raised(monkeypatch):
    from sfg.experiments.grid import parse_grid

    text = ("base: {kind: selftest, rounds: 5, eval_every: 5}\n"
            "seeds: [" + ",".join(map(str, range(30))) + "]\n")
    monkeypatch.setenv("SFG_MAX_RUNS", "20")
    with pytest.raises(SfgError, match=r"g.yaml:1: this grid expands to 30 runs \(30 seeds x 1 "
                                       r"overrides\), over the limit of 20"):
        parse_grid(text, source="g.yaml")
    monkeypatch.setenv("SFG_MAX_RUNS", "30")
    assert len(parse_grid(text, source="g.yaml")) == 30


def test_yaml_anchors_within_the_node_budget_still_work():
    from sfg.experiments.grid import parse_grid

    text = ("base: &b {kind: selftest, rounds: 5, eval_every: 5}\n"
            "overrides: [{}, {lr: 0.1}]\nrules: &r [dfedavg, sfg]\n")
    assert len(parse_grid(text, source="g.yaml")) == 4


# ------------------------------------------------------------------------------ archives
def test_an_archive_head_is_scanned_once(tmp_path, monkeypatch):
    from sfg.world.data import files

    p = tmp_path / "a.tar.gz"
    with tarfile.open(p, "w:gz") as tf:
        for i in range(5):
            src = tmp_path / f"f{i}.bin"
            src.write_bytes(bytes(100))
            tf.add(src, arcname=f"train/c/{i}.bin")
    opened = []
    real = tarfile.open

    def counting_open(*a, **k):
        opened.append(a)
        return real(*a, **k)

    monkeypatch.setattr(files.tarfile, "open", counting_open)
    first = files.tar_file_names(p)
    assert files.tar_file_names(p, limit=4096) == first and files.tar_file_names(p, 2) == first[:2]
    assert len(first) == 5 and len(opened) == 1
    # reading the members is one more pass, with the same limits
    assert len(dict(files.iter_tar_files(p, lambda n: True))) == 5


def test_an_archive_member_over_the_limit_is_refused_before_reading(tmp_path, monkeypatch):
    from sfg.world.data import files

    p = tmp_path / "a.tar"
    with tarfile.open(p, "w") as tf:
        src = tmp_path / "big.bin"
        src.write_bytes(np.zeros(3 << 20, np.uint8).tobytes())
        tf.add(src, arcname="big.bin")
    monkeypatch.setenv("SFG_MAX_MEMBER", "1M")
    files._HEADS.clear()
    with pytest.raises(SfgError, match=r"member big.bin declares 3 MiB decompressed, over the "
                                       r"per-member limit of 1 MiB"):
        files.tar_file_names(p)
    with pytest.raises(SfgError, match="per-member limit"):
        list(files.iter_tar_files(p, lambda n: True))


# ------------------------------------------------------------------------------ STUNner time
def test_never_online_decade_long_users_cost_no_window_each(tmp_path):
    """400 users offline for ten years each: 1.5 million candidate windows, none built."""
    from badinput import _alarm

    from sfg.world.traces.stunner import load_stunner

    p = tmp_path / "s.txt"
    p.write_text("".join(f"u{i} 0 0 0 315360000000\n" for i in range(400)))
    with _alarm(60):  # a hang guard: the windows used to be built one by one (~2 min here)
        trace = load_stunner(p)
    assert trace.n_devices == 0 and trace.meta["devices_low_availability"] == 400


def test_the_first_qualifying_window_after_a_long_offline_spell_is_found(tmp_path):
    from sfg.world.traces.stunner import load_stunner

    day = 86_400_000
    # 40 days offline, then online for 3 days; 10-minute variant: 300 rounds = 50 h
    p = tmp_path / "s.txt"
    p.write_text(f"u1 0 0 0 {40 * day} {3 * day}\n")
    trace = load_stunner(p, min_availability=0.9)
    assert trace.devices == ["u1"] and trace.start == ["1970-02-10T00:00"]  # day 40
    assert trace.available.all()
