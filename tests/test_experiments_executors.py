"""Executors: crash-safe resume after SIGKILL, worker pools, failures, Ray == local."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from sfg.errors import SfgError
from sfg.experiments.config import make_config, run_id
from sfg.experiments.executors import run_grid, worker_loop
from sfg.experiments.store import Store, records

GRID = """
name: killme
base: {kind: selftest, n_clients: 60, rounds: 400, eval_every: 50, local_steps: 4}
processes: ["none", "bursty:u=0.8"]
rules: [dfedavg, sfg, sfg-l]
seeds: [1]
"""


def _grid_configs():
    from sfg.experiments.grid import parse_grid

    return list(parse_grid(GRID).configs)


def _by_id(path):
    return {r["run_id"]: (r["metrics"], r["curves"]) for r in records(path)}


class HoldEvent:
    """The selftest's hold (``SFG_SELFTEST_HOLD``, :func:`sfg.experiments.runner._hold`): a run
    announces on a FIFO that it is running and stays so until killed; :meth:`wait` blocks on
    the FIFO (select, bounded) — an event, not a poll that could miss a short run."""

    def __init__(self, d, run: str | None = None):
        d.mkdir(parents=True, exist_ok=True)
        if run is not None:
            (d / "run_id").write_text(run)
        os.mkfifo(d / "event")
        self.fd = os.open(d / "event", os.O_RDONLY | os.O_NONBLOCK)
        self.env = {"SFG_SELFTEST_HOLD": str(d)}

    def wait(self, timeout: float = 120.0) -> int:
        """The held run's process id."""
        import select

        ready, _, _ = select.select([self.fd], [], [], timeout)
        assert ready, f"no selftest run started within {timeout:g} s"
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(self.fd, 64)
            assert chunk, "the held run closed the event without its pid"
            line += chunk
        os.close(self.fd)
        return int(line)


def _state(path):
    try:
        with Store(path, create=False) as s:
            return s.runs()
    except SfgError:
        return []


def _partial_rows(path):
    with Store(path, create=False) as s:
        orphan_curves = s._con.execute(
            "SELECT COUNT(*) FROM curves WHERE run_id NOT IN "
            "(SELECT run_id FROM runs WHERE status = 'done')").fetchone()[0]
        half_done = s._con.execute(
            "SELECT COUNT(*) FROM runs WHERE status != 'done' AND metrics IS NOT NULL"
        ).fetchone()[0]
    return orphan_curves + half_done


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.sqlite"
    summary = run_grid(_grid_configs(), path, workers=1)
    assert summary.ok and summary.done == 6
    return _by_id(path)


def test_sigkill_a_grid_process_then_resume(tmp_path, reference):
    store = tmp_path / "grid.sqlite"
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    third = run_id(_grid_configs()[2])  # runs are claimed in the grid's order
    hold = HoldEvent(tmp_path / "hold", third)
    proc = subprocess.Popen([sys.executable, "-m", "sfg.experiments", "run", str(grid),
                             "--store", str(store), "--workers", "1", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **hold.env})
    try:
        assert hold.wait() == proc.pid  # the third run is running (and held) in the grid
        rows = {r["run_id"]: r["status"] for r in _state(store)}
        assert rows[third] == "running" and sum(s == "done" for s in rows.values()) == 2
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = {r["run_id"]: r for r in _state(store)}
    killed = [r for r in before.values() if r["status"] == "running"]
    assert len(killed) == 1 and killed[0]["metrics"] == {}
    assert _partial_rows(store) == 0  # no curves or metrics without a done run
    done_before = {k: r["finished"] for k, r in before.items() if r["status"] == "done"}
    assert len(done_before) >= 2

    summary = run_grid(_grid_configs(), store, workers=1)
    assert summary.ok and summary.total == 6
    assert summary.already_done == len(done_before)
    after = {r["run_id"]: r for r in _state(store)}
    assert all(r["status"] == "done" for r in after.values()) and len(after) == 6
    for rid, finished in done_before.items():  # finished exactly once: not redone
        assert after[rid]["finished"] == finished and after[rid]["attempts"] == 1
    assert after[killed[0]["run_id"]]["attempts"] == 2
    assert _partial_rows(store) == 0
    assert _by_id(store) == reference  # identical to an uninterrupted grid


def test_sigkill_a_pool_worker_the_grid_still_completes(tmp_path, reference, monkeypatch):
    store = tmp_path / "pool.sqlite"
    hold = HoldEvent(tmp_path / "hold")
    monkeypatch.setenv("SFG_SELFTEST_HOLD", hold.env["SFG_SELFTEST_HOLD"])  # spawned workers
    out = {}
    thread = threading.Thread(target=lambda: out.update(
        summary=run_grid(_grid_configs(), store, workers=2)))
    thread.start()
    try:
        pid = hold.wait()  # a worker process is running a run (held)
        assert pid != os.getpid()
        running = [r for r in _state(store) if r["status"] == "running"
                   and int(r["worker"].split(":")[1]) == pid]
        assert len(running) == 1
        victim = running[0]
        os.kill(pid, signal.SIGKILL)
    finally:
        thread.join(timeout=120)
    assert not thread.is_alive()
    summary = out["summary"]
    assert summary.ok and summary.done == 6, summary
    rows = {r["run_id"]: r for r in _state(store)}
    assert rows[victim["run_id"]]["attempts"] == 2  # reclaimed after its worker died
    assert rows[victim["run_id"]]["worker"] != victim["worker"]
    assert sum(r["attempts"] for r in rows.values()) == 7  # everything else ran once
    assert _partial_rows(store) == 0
    assert _by_id(store) == reference


def test_failed_runs_are_recorded_and_the_grid_goes_on(tmp_path):
    good = [make_config(kind="selftest", n_clients=10, rounds=10, seed=s) for s in (1, 2)]
    bad = make_config(kind="selftest", n_clients=10, rounds=10, process="iid:u=1.5")
    store = tmp_path / "f.sqlite"
    summary = run_grid([good[0], bad, good[1]], store)
    assert (summary.done, summary.failed, summary.pending) == (2, 1, 0) and not summary.ok
    assert summary.failures == [(run_id(bad), summary.failures[0][1])]
    assert summary.failures[0][1].startswith("SfgError: selftest: process 'iid:u=1.5'")
    with Store(store) as s:
        row = s.runs("failed")[0]
        assert "\n" not in row["error"] and "Traceback" in row["traceback"]
        finished = {r["run_id"]: r["finished"] for r in s.runs("done")}
    again = run_grid([good[0], bad, good[1]], store)  # resume: failed retried, done kept
    assert (again.already_done, again.done, again.failed) == (2, 2, 1)
    with Store(store) as s:
        assert {r["run_id"]: r["finished"] for r in s.runs("done")} == finished


def test_interrupt_puts_the_run_back_in_the_queue(tmp_path):
    cfg = make_config(kind="selftest", n_clients=10, rounds=10, eval_every=5)
    store = tmp_path / "i.sqlite"
    with Store(store) as s:
        ids = s.add_runs([cfg])

    def ctrl_c(done, total):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        worker_loop(store, ids, progress=ctrl_c)
    with Store(store) as s:
        row = s.runs()[0]
        assert (row["status"], row["worker"], row["attempts"]) == ("queued", None, 0)
    assert run_grid([cfg], store).done == 1


def test_run_grid_rejects_bad_options(tmp_path):
    cfgs = [make_config(kind="selftest", rounds=10)]
    for kw, words in [({"executor": "slurm"}, "unknown executor 'slurm'"),
                      ({"workers": -1}, "workers must be >= 0"),
                      ({"gpus_per_run": 0.25}, "applies to --executor ray"),
                      ({"executor": "ray"}, None)]:
        if words is None:  # cuda configs on Ray without GPUs: refused before Ray starts
            cuda = [make_config(kind="selftest", rounds=10, device="cuda")]
            with pytest.raises(SfgError, match="1 runs use device cuda but --gpus-per-run is 0"):
                run_grid(cuda, tmp_path / "x.sqlite", **kw)
            continue
        with pytest.raises(SfgError, match=words):
            run_grid(cfgs, tmp_path / "x.sqlite", **kw)


@pytest.fixture
def local_ray():
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_executor_matches_local(tmp_path, local_ray):
    # real rules: two rules x two seeds of the model-free replay, plus two short training runs
    cfgs = [make_config(kind="replay", n_clients=40, rounds=60, horizon=10,
                        process="bursty:u=0.7", rule=r, seed=s)
            for r in ("dfedavg", "sfg-cut") for s in (1, 2)]
    cfgs += [make_config(kind="train", dataset="digits", model="mlp", n_clients=10, rounds=4,
                         local_steps=2, batch_size=8, eval_every=2, graph="knn:k=3",
                         process="bursty:u=0.6", rule=r, seed=1, backend="batched")
             for r in ("dfedavg", "sfg-cut")]
    ray_summary = run_grid(cfgs, tmp_path / "ray.sqlite", executor="ray")
    assert ray_summary.ok and ray_summary.done == 6
    local_summary = run_grid(cfgs, tmp_path / "local.sqlite", executor="local")
    assert local_summary.ok
    ray_res, local_res = _by_id(tmp_path / "ray.sqlite"), _by_id(tmp_path / "local.sqlite")
    assert set(ray_res) == {run_id(c) for c in cfgs}
    assert ray_res == local_res
    with Store(tmp_path / "ray.sqlite") as s:
        assert all(r["seconds"] > 0 for r in s.runs("done"))
    # resume through Ray: nothing left to do
    assert run_grid(cfgs, tmp_path / "ray.sqlite", executor="ray").already_done == 6
    with pytest.raises(SfgError, match="GPUs"):
        run_grid(cfgs, tmp_path / "gpu.sqlite", executor="ray", gpus_per_run=0.25)


# ----------------------------------------------------------- an unreachable Ray cluster (#32)
def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address, endpoint", [
    ("ray://127.0.0.1:10001", ("127.0.0.1", 10001)), ("10.0.0.5:6379", ("10.0.0.5", 6379)),
    ("ray://[::1]:10001", ("::1", 10001)), ("ray://head.example:10001/x", ("head.example", 10001)),
    ("auto", None), ("local", None), (None, None), ("ray://head", None),
    ("anyscale://prod", None)])
def test_which_addresses_are_probed_before_ray_starts(address, endpoint):
    from sfg.experiments.executors import ray_endpoint

    assert ray_endpoint(address) == endpoint


def test_an_unreachable_ray_address_is_one_error_line_before_ray_starts(tmp_path, monkeypatch):
    """A refused port: one error line, exit 2, and Ray's client is never started (it would
    retry for ~30 s and print its own warnings first)."""
    import ray

    calls = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: calls.append(a))
    address = f"ray://127.0.0.1:{_closed_port()}"
    cfgs = [make_config(kind="selftest", rounds=10)]
    with pytest.raises(SfgError, match=r"cannot reach Ray at address 'ray://127\.0\.0\.1:\d+': "
                                       r"Connection refused \(127\.0\.0\.1 port \d+\)"):
        run_grid(cfgs, tmp_path / "x.sqlite", executor="ray", address=address)
    assert calls == []
    grid = tmp_path / "g.yaml"
    grid.write_text("name: tiny\nbase: {kind: selftest, n_clients: 10, rounds: 10}\n"
                    "processes: [none]\nrules: [dfedavg]\nseeds: [1]\n")
    r = subprocess.run([sys.executable, "-m", "sfg", "grid", "run", str(grid), "--store",
                        str(tmp_path / "s.sqlite"), "--executor", "ray", "--address",
                        address, "--no-progress"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach Ray at address"), r.stderr


def test_a_silent_ray_address_is_refused_after_the_connect_timeout():
    """A port that does not answer (a listener whose queue is full drops the connection
    request): the probe gives up after its timeout with one line naming it."""
    import socket

    from sfg.experiments.executors import _check_reachable

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        held = []
        try:
            for _ in range(8):  # fill the accept queue (never accepted)
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex(("127.0.0.1", port))
                held.append(c)
            with pytest.raises(SfgError, match=r"no answer from 127\.0\.0\.1 port \d+ within "
                                               r"0\.5 s; check --address"):
                _check_reachable(f"ray://127.0.0.1:{port}", timeout=0.5)
        finally:
            for c in held:
                c.close()
