"""The SQLite results store: atomic results, claims and leases, concurrency, version checks."""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from sfg.errors import SfgError
from sfg.experiments.config import make_config, run_id
from sfg.experiments.store import SCHEMA_VERSION, Store, new_worker_id, records


def _configs(n=4, **kw):
    return [make_config(kind="selftest", rounds=10, seed=s, **kw) for s in range(1, n + 1)]


def _result(x):
    return {"metrics": {"acc": x, "nan": math.nan}, "curves": {"acc": [x, x + 1, math.nan]}}


def test_new_store_has_schema_and_meta(tmp_path):
    path = tmp_path / "sub" / "r.sqlite"
    with Store(path) as s:
        meta = s.meta()
        assert meta["application"] == "sfg-results"
        assert meta["schema_version"] == str(SCHEMA_VERSION) and meta["created"]
        assert s.counts() == {"queued": 0, "running": 0, "done": 0, "failed": 0}
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"meta", "runs", "curves"} <= tables


def test_add_claim_finish_records(tmp_path):
    cfgs = _configs(3)
    with Store(tmp_path / "r.sqlite") as s:
        ids = s.add_runs(cfgs)
        assert ids == [run_id(c) for c in cfgs]
        assert s.add_runs(cfgs) == ids and s.counts()["queued"] == 3  # idempotent
        w = new_worker_id()
        rid, config = s.claim(ids, w)
        assert rid == ids[0] and config["seed"] == 1  # grid order
        assert s.counts()["running"] == 1
        assert s.finish(rid, w, _result(0.5), seconds=1.5)
        rid2, _ = s.claim(ids, w)
        assert rid2 == ids[1]
        assert s.fail(rid2, w, "ValueError: boom\nsecond line")
        recs = s.records()
        assert len(recs) == 1
        r = recs[0]
        assert {k: r[k] for k in ("run_id", "dataset", "process", "rule", "seed")} == {
            "run_id": ids[0], "dataset": "digits", "process": "bursty:u=0.8",
            "rule": "dfedavg", "seed": 1}
        assert r["config"] == json.loads(cfgs[0].model_dump_json())
        assert r["metrics"]["acc"] == 0.5 and math.isnan(r["metrics"]["nan"])
        assert r["curves"]["acc"][:2] == [0.5, 1.5] and math.isnan(r["curves"]["acc"][2])
        failed = s.records("failed")
        assert [f["run_id"] for f in failed] == [ids[1]] and failed[0]["curves"] == {}
        assert s.runs("failed")[0]["error"] == "ValueError: boom second line"
        # a resumed grid retries failed runs but never redoes done ones
        s.add_runs(cfgs)
        assert s.counts(ids) == {"queued": 2, "running": 0, "done": 1, "failed": 0}
        with pytest.raises(SfgError, match="unknown run status"):
            s.records("finished")
    assert records(tmp_path / "r.sqlite")[0]["run_id"] == ids[0]


def test_finish_by_a_worker_that_lost_the_run_writes_nothing(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        ids = s.add_runs(_configs(1))
        rid, _ = s.claim(ids, "a:1:x")
        assert not s.finish(rid, "someone-else", _result(1.0), seconds=1.0)
        assert not s.fail(rid, "someone-else", "nope")
        assert s.counts()["running"] == 1 and s.curves() == {}
        s.release(rid, "a:1:x")
        row = s.runs()[0]
        assert (row["status"], row["worker"], row["attempts"]) == ("queued", None, 0)


def test_claims_respect_live_workers_and_reclaim_dead_ones(tmp_path):
    host = socket.gethostname()
    live = f"{host}:{os.getpid()}:aaaa"
    dead = f"{host}:{2**22 + 12345}:bbbb"  # above the default pid_max: never alive
    remote = "another-host:1:cccc"
    with Store(tmp_path / "r.sqlite") as s:
        ids = s.add_runs(_configs(3))
        assert s.claim(ids, live)[0] == ids[0]
        assert s.claim(ids, dead)[0] == ids[1]
        assert s.claim(ids, remote)[0] == ids[2]
        # all held, but the dead worker's process is gone: only its run is claimable
        assert s.claimable(ids) == 1
        got = s.claim(ids, live)
        assert got is not None and got[0] == ids[1]
        row = {r["run_id"]: r for r in s.runs()}[ids[1]]
        assert row["worker"] == live and row["attempts"] == 2
        assert s.claim(ids, live) is None  # live worker and fresh remote lease: nothing
        # an expired heartbeat frees a remote worker's run
        s._con.execute("UPDATE runs SET heartbeat = ? WHERE run_id = ?", (time.time() - 120,
                                                                           ids[2]))
        assert s.claim(ids, live, lease=60)[0] == ids[2]
        # heartbeats keep leases fresh
        assert s.heartbeat(live) == 3


def test_runs_whose_worker_keeps_dying_are_failed(tmp_path):
    dead = f"{socket.gethostname()}:{2**22 + 777}:dddd"
    with Store(tmp_path / "r.sqlite") as s:
        ids = s.add_runs(_configs(1))
        for _ in range(3):
            assert s.claim(ids, dead, max_attempts=3) is not None
        assert s.claim(ids, dead, max_attempts=3) is None
        row = s.runs()[0]
        assert row["status"] == "failed" and row["error"].startswith("WorkerLost: its worker "
                                                                      "died 3 times")


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_incompatible_files_are_refused_untouched(tmp_path):
    old = tmp_path / "old.sqlite"
    with Store(old) as s:
        s.add_runs(_configs(1))
    con = sqlite3.connect(old)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    before = _digest(old)
    with pytest.raises(SfgError, match="schema version 99, but this sfg reads version 1"):
        Store(old)
    assert _digest(old) == before
    assert not (tmp_path / "old.sqlite-wal").exists() or (
        tmp_path / "old.sqlite-wal").stat().st_size == 0

    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE results (x)")
    con.commit()
    con.close()
    before = _digest(other)
    with pytest.raises(SfgError, match="not an sfg results store"):
        Store(other)
    assert _digest(other) == before

    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a database\n")
    with pytest.raises(SfgError, match="not an SQLite database"):
        Store(text)
    assert text.read_text() == "hello, this is not a database\n"

    with pytest.raises(SfgError, match="is a directory"):
        Store(tmp_path)
    with pytest.raises(SfgError, match="no results store at"):
        Store(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


_WRITER = r"""
import json, os, sys, time
from pathlib import Path
from sfg.experiments.config import make_config
from sfg.experiments.store import Store, new_worker_id
path, n = sys.argv[1], int(sys.argv[2])
cfgs = [make_config(kind="selftest", rounds=10, seed=s) for s in range(1, n + 1)]
Path(f"{path}.ready.{os.getpid()}").touch()
while not Path(f"{path}.go").exists():  # start together: create, insert and claim at once
    time.sleep(0.005)
store = Store(path, busy_timeout=60)
ids = store.add_runs(cfgs)
w = new_worker_id()
mine = []
while (c := store.claim(ids, w)) is not None:
    rid, cfg = c
    x = float(cfg["seed"])
    time.sleep(0.01)  # "work"
    assert store.finish(rid, w, {"metrics": {"x": x}, "curves": {"c": [x] * 25}}, seconds=0.0)
    mine.append(rid)
print(json.dumps(mine))
"""


def test_concurrent_writer_processes_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    n, procs = 60, 4
    runs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(n)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(procs)]
    deadline = time.time() + 60
    while len(list(tmp_path.glob("shared.sqlite.ready.*"))) < procs and time.time() < deadline:
        time.sleep(0.02)
    (tmp_path / "shared.sqlite.go").touch()
    outs = [p.communicate(timeout=120) for p in runs]
    assert all(p.returncode == 0 for p in runs), [e for _, e in outs]
    finished = [json.loads(o) for o, _ in outs]
    flat = [rid for f in finished for rid in f]
    assert len(flat) == n and len(set(flat)) == n  # every run finished exactly once
    assert sum(1 for f in finished if f) >= 2  # the writers really interleaved
    with Store(path) as s:
        assert s.counts() == {"queued": 0, "running": 0, "done": n, "failed": 0}
        recs = s.records()
        assert sorted(r["metrics"]["x"] for r in recs) == [float(i) for i in range(1, n + 1)]
        assert all(r["curves"]["c"] == [r["metrics"]["x"]] * 25 for r in recs)
        total_points = s._con.execute("SELECT COUNT(*) FROM curves").fetchone()[0]
        assert total_points == n * 25


_TWO_CONNECTIONS = r"""
import sys, time
from pathlib import Path
from sfg.experiments.config import make_config
from sfg.experiments.store import Store
path = Path(sys.argv[1])
a = Store(path)
ids = a.add_runs([make_config(kind="selftest", rounds=10, seed=s) for s in (1, 2, 3)])
b = Store(path, create=False)  # a second connection in the same process (as workers have)
for i, rid in enumerate(ids):
    assert b.claim(ids, "w:1:x") is not None
    assert b.finish(rid, "w:1:x", {"metrics": {"i": i}, "curves": {}}, seconds=0.0)
    Path(f"{path}.step{i}").touch()
    while not Path(f"{path}.ack{i}").exists():
        time.sleep(0.01)
"""


def test_other_processes_see_each_commit_of_a_process_with_two_connections(tmp_path):
    # regression: opening the file outside SQLite while a connection is open drops its POSIX
    # locks, after which other processes read a stale database
    path = tmp_path / "vis.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", _TWO_CONNECTIONS, str(path)],
                            stderr=subprocess.PIPE, text=True)
    try:
        for i in range(3):
            deadline = time.time() + 60
            while not (tmp_path / f"vis.sqlite.step{i}").exists():
                assert proc.poll() is None, proc.stderr.read()
                assert time.time() < deadline
                time.sleep(0.01)
            con = sqlite3.connect(path)
            done = con.execute("SELECT COUNT(*) FROM runs WHERE status = 'done'").fetchone()[0]
            con.close()
            assert done == i + 1
            (tmp_path / f"vis.sqlite.ack{i}").touch()
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
