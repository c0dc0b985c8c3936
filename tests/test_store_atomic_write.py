"""The store's one-transaction write (docs/concepts/training.md#pairing): a run's metrics, curves and ``status='done'``
are committed together or not at all.

Failures are injected *inside* :meth:`Store.finish`'s transaction with real SQLite: a temporary
trigger on the curves table either aborts the write half-way, or (in a child process) calls a
function that blocks, so that the child can be SIGKILLed in the middle of the write. Afterwards
the run must be wholly absent (no metrics, no curves, not done) and a resumed grid must redo it
completely.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sfg
from sfg.errors import SfgError
from sfg.experiments.config import make_config, run_id
from sfg.experiments.executors import run_grid
from sfg.experiments.runner import run_config
from sfg.experiments.store import Store, new_worker_id

CFG = make_config(kind="selftest", rounds=20, eval_every=2, seed=3)
RID = run_id(CFG)


def _row(path: Path) -> dict:
    with Store(path, create=False) as s:
        run = next(r for r in s.runs() if r["run_id"] == RID)
        curves = s.curves(RID).get(RID, {})
    return {"status": run["status"], "metrics": run["metrics"], "curves": curves}


def _assert_complete(path: Path, expected: dict) -> None:
    row = _row(path)
    assert row["status"] == "done"
    assert row["metrics"] == pytest.approx(expected["metrics"], nan_ok=True)
    assert set(row["curves"]) == set(expected["curves"])
    for name, values in expected["curves"].items():
        assert row["curves"][name] == pytest.approx(values, nan_ok=True)


def test_a_failure_inside_the_write_leaves_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    result = run_config(CFG)
    n_points = sum(len(v) for v in result["curves"].values())
    assert n_points >= 6  # the abort below happens with curve points already inserted
    with Store(path) as s:
        s.add_runs([CFG])
        worker = new_worker_id()
        assert s.claim([RID], worker)[0] == RID
        # the 4th curve point aborts the transaction, after the runs row was set to done
        s._con.execute("CREATE TEMP TABLE seen (n INTEGER)")
        s._con.execute(
            "CREATE TEMP TRIGGER boom BEFORE INSERT ON main.curves BEGIN "
            "INSERT INTO seen VALUES (1); "
            "SELECT RAISE(ABORT, 'injected failure') WHERE (SELECT COUNT(*) FROM seen) >= 4; "
            "END")
        with pytest.raises(SfgError, match="injected failure"):
            s.finish(RID, worker, result, seconds=1.0)
        s._con.execute("DROP TRIGGER temp.boom")
        # an hour passes: the failed worker (this process, still alive) lets its lease lapse
        s._con.execute("UPDATE runs SET heartbeat = heartbeat - 3600 WHERE run_id = ?", (RID,))
    row = _row(path)
    assert row == {"status": "running", "metrics": {}, "curves": {}}
    # resuming the grid reclaims the run whose lease lapsed and redoes it completely
    summary = run_grid([CFG], path, workers=1, show_progress=False)
    assert summary.done == 1 and summary.failed == 0
    _assert_complete(path, result)


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from sfg.experiments.config import make_config, run_id
    from sfg.experiments.runner import run_config
    from sfg.experiments.store import Store, new_worker_id

    path, marker = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = make_config(kind="selftest", rounds=20, eval_every=2, seed=3)
    rid = run_id(cfg)
    result = run_config(cfg)
    with Store(path) as s:
        s.add_runs([cfg])
        worker = new_worker_id()
        assert s.claim([rid], worker)[0] == rid

        def stop_here():  # called by the trigger inside finish()'s transaction
            marker.write_text("inside")
            time.sleep(600)
            return 0

        s._con.create_function("stop_here", 0, stop_here)
        s._con.execute("CREATE TEMP TABLE seen (n INTEGER)")
        s._con.execute(
            "CREATE TEMP TRIGGER pause BEFORE INSERT ON main.curves BEGIN "
            "INSERT INTO seen VALUES (1); "
            "SELECT stop_here() WHERE (SELECT COUNT(*) FROM seen) = 4; END")
        s.finish(rid, worker, result, seconds=1.0)
    print("finished without being killed")
""")


def test_sigkill_inside_the_write_leaves_nothing_and_resume_redoes_it(tmp_path):
    path, marker = tmp_path / "r.sqlite", tmp_path / "inside"
    env = {**os.environ, "PYTHONPATH": str(Path(sfg.__file__).resolve().parents[1])
           + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(marker)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never reached the write"
            time.sleep(0.02)
        # the child is inside finish(): runs row updated to done, 3 curve points inserted
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    row = _row(path)
    assert row == {"status": "running", "metrics": {}, "curves": {}}
    # a resumed grid sees the run's worker gone, claims it again and completes it
    summary = run_grid([CFG], path, workers=1, show_progress=False)
    assert summary.done == 1 and summary.already_done == 0 and summary.failed == 0
    _assert_complete(path, run_config(CFG))
