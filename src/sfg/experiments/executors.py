"""Executors: run a grid's configs into a results store, locally or on Ray (docs/concepts/training.md#pairing).

* ``local``: ``workers=1`` runs in this process; ``workers=N`` (``0`` = one per CPU) starts N
  worker processes (spawned, each with ``cpu_count // N`` BLAS/torch threads). Every worker
  claims runs from the store and writes each result itself in one transaction, so a killed
  worker loses only its current run, which another worker (or the next invocation) reclaims.
* ``ray``: every run is one Ray task with ``num_cpus=cpus_per_run`` and fractional
  ``num_gpus=gpus_per_run`` (0.25: four runs share a GPU). The driver claims the runs,
  heartbeats them, and writes every result to the store as its task finishes; tasks never
  touch the store, so the store only needs to be on the driver's disk (SQLite must not sit on
  a network filesystem anyway). Workers need ``sfg`` importable (same environment, or a Ray
  ``runtime_env``), and so do the plugins (:mod:`sfg.plugins`: the driver's ``--plugin`` and
  ``SFG_PLUGINS`` modules are passed to every task, entry points are read where it runs). ``address``: None starts (or joins) a local instance, ``"auto"`` joins
  the running cluster, ``"local"`` forces a new local instance, ``"ray://host:10001"`` uses
  Ray Client. If Ray is already initialised in this process it is used as it is.

The parent shows a rich progress bar (runs done/total, ETA) when ``show_progress`` is set.
Results do not depend on the executor: a run is a pure function of its config.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sfg.errors import SfgError
from sfg.experiments.config import RunConfig, run_id
from sfg.experiments.store import Store, new_worker_id, one_line

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclass
class GridSummary:
    """What one :func:`run_grid` call did."""

    total: int
    already_done: int
    done: int
    failed: int
    pending: int
    seconds: float
    failures: list[tuple[str, str]] = field(default_factory=list)  # (run_id, error)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.pending == 0


# ---------------------------------------------------------------------- one run
class Heartbeat:
    """Background thread refreshing the lease of every run ``worker`` holds."""

    def __init__(self, store_path: str | os.PathLike, worker: str, interval: float):
        self.store_path, self.worker, self.interval = store_path, worker, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sfg-heartbeat", daemon=True)

    def _loop(self) -> None:
        store = Store(self.store_path, create=False)
        try:
            while not self._stop.wait(self.interval):
                try:
                    store.heartbeat(self.worker)
                except SfgError:
                    pass  # store busy for a long time: try again next beat
        finally:
            store.close()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def execute_one(store: Store, rid: str, config: dict, worker: str, *,
                progress: Callable[[int, int], None] | None = None) -> bool:
    """Run one claimed run and record it (done or failed); True when it finished."""
    from sfg.experiments.runner import run_config

    t0 = time.perf_counter()
    try:
        result = run_config(RunConfig(**config), progress=progress)
    except Exception as e:  # a failed run is recorded; the grid goes on
        store.fail(rid, worker, one_line(e), traceback=traceback.format_exc(),
                   seconds=time.perf_counter() - t0)
        return False
    except BaseException:  # interrupted (Ctrl-C): back to the queue, not failed
        store.release(rid, worker)
        raise
    return store.finish(rid, worker, result, seconds=time.perf_counter() - t0)


def worker_loop(store_path: str | os.PathLike, run_ids: Sequence[str], *,
                worker: str | None = None, lease: float = 60.0, max_attempts: int = 3,
                on_start: Callable[[str, dict], None] | None = None,
                on_end: Callable[[str, bool], None] | None = None,
                progress: Callable[[int, int], None] | None = None) -> int:
    """Claim and run runs of ``run_ids`` until none is claimable; returns how many it ran."""
    worker = worker or new_worker_id()
    n = 0
    with Store(store_path, create=False) as store, Heartbeat(store_path, worker, lease / 4):
        while (claimed := store.claim(run_ids, worker, lease=lease,
                                      max_attempts=max_attempts)) is not None:
            rid, config = claimed
            if on_start is not None:
                on_start(rid, config)
            ok = execute_one(store, rid, config, worker, progress=progress)
            n += 1
            if on_end is not None:
                on_end(rid, ok)
    return n


def _worker_process(store_path: str, run_ids: list[str], lease: float, max_attempts: int,
                    threads: int) -> None:
    """Entry point of a spawned local worker process.

    The parent sets OMP/MKL/OpenBLAS thread variables to ``threads`` before spawning, so
    numpy and torch (which reads OMP_NUM_THREADS) use ``cpu_count // workers`` threads each.
    The plugins (:mod:`sfg.plugins`: entry points, and ``SFG_PLUGINS``, inherited from the
    parent) are loaded first; one that fails is noted, and a run that needs it fails naming it
    (:func:`sfg.plugins.broken_note`); a plugin module name that is not one is one error line
    and exit status 2.
    """
    from sfg.plugins import load

    try:
        load(strict=False)
    except SfgError as e:
        import sys

        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    worker_loop(store_path, run_ids, lease=lease, max_attempts=max_attempts)


# ---------------------------------------------------------------------- progress
class _Bar:
    """A rich progress bar for the grid (or nothing when disabled)."""

    def __init__(self, enabled: bool, total: int, done: int, label: str):
        self.progress = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                                 MofNCompleteColumn(),
                                 TextColumn("{task.fields[note]}", markup=False),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        self.task = self.progress.add_task(label, total=total, completed=done, note="")
        self.round_task = None

    def __enter__(self) -> _Bar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, counts: dict[str, int]) -> None:
        if self.progress is not None:
            note = f"failed {counts['failed']}" if counts["failed"] else ""
            self.progress.update(self.task, completed=counts["done"] + counts["failed"],
                                 note=note)

    def rounds(self, done: int, total: int) -> None:
        if self.progress is None:
            return
        if self.round_task is None:
            self.round_task = self.progress.add_task("  current run", total=total, note="")
        self.progress.update(self.round_task, completed=done, total=total)


# ---------------------------------------------------------------------- executors
def _run_inprocess(store_path: Path, ids: list[str], bar: _Bar, store: Store, *,
                   lease: float, max_attempts: int) -> None:
    worker_loop(store_path, ids, lease=lease, max_attempts=max_attempts,
                on_end=lambda rid, ok: bar.update(store.counts(ids)), progress=bar.rounds)


def _run_pool(store_path: Path, ids: list[str], bar: _Bar, store: Store, *, workers: int,
              lease: float, max_attempts: int, poll: float = 0.5) -> None:
    """Keep up to ``workers`` spawned worker processes busy until nothing is claimable.

    A worker that dies (killed, out of memory) is replaced while claimable runs remain; the
    run it held is reclaimed by another worker (its pid is gone).
    """
    ctx = mp.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // workers)
    procs: list[Any] = []
    deaths, last_finished = 0, -1

    def start() -> None:
        p = ctx.Process(target=_worker_process, name="sfg-grid-worker",
                        args=(str(store_path), ids, lease, max_attempts, threads))
        saved = {v: os.environ.get(v) for v in _THREAD_VARS}
        os.environ.update(dict.fromkeys(_THREAD_VARS, str(threads)))  # inherited at spawn
        try:
            p.start()
        finally:
            for v, old in saved.items():
                if old is None:
                    os.environ.pop(v, None)
                else:
                    os.environ[v] = old
        procs.append(p)

    try:
        for _ in range(min(workers, len(ids))):
            start()
        while True:
            time.sleep(poll)
            counts = store.counts(ids)
            bar.update(counts)
            finished = counts["done"] + counts["failed"]
            for p in [p for p in procs if not p.is_alive()]:
                p.join()
                procs.remove(p)
                if p.exitcode != 0:
                    deaths = deaths + 1 if finished == last_finished else 1
                    last_finished = finished
            if deaths > 3 * workers:
                raise SfgError("grid workers keep dying without finishing runs; run with "
                               "--workers 1 to see the error")
            claimable = store.claimable(ids, lease=lease)
            if claimable == 0 and not procs:
                break  # all finished (or held by another live invocation)
            while len(procs) < workers and claimable > 0:
                start()
                claimable -= 1
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()


def _ray_task(config: dict, plugins: Sequence[str] = ()) -> dict:
    """One run inside a Ray worker: the result, or the one-line error (never raises).
    ``plugins``: the driver's plugin modules (``--plugin``, ``SFG_PLUGINS``), loaded first with
    the worker's own entry points (:mod:`sfg.plugins`)."""
    from sfg.experiments.runner import run_config
    from sfg.plugins import load

    t0 = time.perf_counter()
    try:
        load(plugins, strict=False)  # a broken one: named by a run that needs it
        result = run_config(RunConfig(**config))
    except Exception as e:
        return {"ok": False, "error": one_line(e), "traceback": traceback.format_exc(),
                "seconds": time.perf_counter() - t0}
    return {"ok": True, "result": result, "seconds": time.perf_counter() - t0}


def _record_ray(store: Store, worker: str, rid: str, ref: Any, ray: Any) -> None:
    try:
        out = ray.get(ref)
    except Exception as e:  # the Ray worker died, the task was cancelled...
        store.fail(rid, worker, f"RayError: {one_line(e)}")
        return
    if out["ok"]:
        store.finish(rid, worker, out["result"], seconds=out["seconds"])
    else:
        store.fail(rid, worker, out["error"], traceback=out["traceback"],
                   seconds=out["seconds"])


#: seconds to wait for a Ray cluster's port to accept a TCP connection before ray.init
RAY_CONNECT_TIMEOUT = 5.0


def ray_endpoint(address: str | None) -> tuple[str, int] | None:
    """(host, port) of a cluster ``address`` (``ray://host:port`` or ``host:port``; IPv6 in
    brackets); None for ``auto``, ``local``, None or a form without a port (Ray decides)."""
    if not address:
        return None
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    if "://" in rest or rest in ("auto", "local"):
        return None
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


def _check_reachable(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT) -> None:
    """One TCP connection to the cluster's port before ``ray.init``: an address that refuses
    or does not answer within ``timeout`` seconds is one error line at once (Ray's client
    would retry for about 30 s and print its own warnings first)."""
    import socket

    end = ray_endpoint(address)
    if end is None:
        return
    try:
        with socket.create_connection(end, timeout=timeout):
            pass
    except TimeoutError:
        raise SfgError(f"cannot reach Ray at address {address!r}: no answer from "
                       f"{end[0]} port {end[1]} within {timeout:g} s; check --address "
                       "(is the cluster up, the port open?)") from None
    except OSError as e:
        raise SfgError(f"cannot reach Ray at address {address!r}: "
                       f"{e.strerror or type(e).__name__} ({end[0]} port {end[1]}); "
                       "check --address (is the cluster up, the port open?)") from None


class _quiet_ray_client:
    """While ``ray.init`` connects: Ray's client logs its kwargs at INFO and warns on a timed
    out connection before raising; the raised error is what sfg reports (one line)."""

    def __enter__(self) -> None:
        import logging
        import warnings

        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", module=r"ray\.")
        warnings.filterwarnings("ignore", message="Ray Client")
        self._loggers = [logging.getLogger(n) for n in ("ray.util.client",
                                                       "ray.client_builder")]
        self._levels = [lg.level for lg in self._loggers]
        for lg in self._loggers:
            lg.setLevel(logging.WARNING)

    def __exit__(self, *exc: object) -> None:
        for lg, level in zip(self._loggers, self._levels, strict=True):
            lg.setLevel(level)
        self._warnings.__exit__(*exc)


def _run_ray(store_path: Path, ids: list[str], bar: _Bar, store: Store, *, address: str | None,
             cpus_per_run: float, gpus_per_run: float, lease: float,
             max_attempts: int) -> None:
    try:
        import ray
    except ImportError:
        from sfg.util.extras import MissingExtra

        raise MissingExtra("the ray executor", "ray") from None
    started_here = False
    if not ray.is_initialized():
        _check_reachable(address)
        try:
            with _quiet_ray_client():
                ray.init(address=address, include_dashboard=False, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SfgError(f"cannot start or reach Ray at address {address!r}: "
                           f"{one_line(e)}; check --address") from None
        started_here = True
    try:
        have = ray.cluster_resources()
        if gpus_per_run > 0 and have.get("GPU", 0) < gpus_per_run:
            raise SfgError(f"--gpus-per-run {gpus_per_run} but the Ray cluster has "
                           f"{have.get('GPU', 0)} GPUs; use --gpus-per-run 0 or a GPU cluster")
        if have.get("CPU", 0) < cpus_per_run:
            raise SfgError(f"--cpus-per-run {cpus_per_run} exceeds the Ray cluster's "
                           f"{have.get('CPU', 0)} CPUs")
        task = ray.remote(num_cpus=cpus_per_run, num_gpus=gpus_per_run)(_ray_task)
        from sfg.plugins import env_modules

        plugins = env_modules()  # Ray's workers do not inherit the driver's environment
        worker = new_worker_id()
        pending: dict[Any, str] = {}
        try:
            with Heartbeat(store_path, worker, lease / 4):
                while (claimed := store.claim(ids, worker, lease=lease,
                                              max_attempts=max_attempts)) is not None:
                    rid, config = claimed
                    pending[task.remote(config, plugins)] = rid
                while pending:
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                    for ref in ready:
                        _record_ray(store, worker, pending.pop(ref), ref, ray)
                    bar.update(store.counts(ids))
        except BaseException:
            for rid in pending.values():  # interrupted: back to the queue
                store.release(rid, worker)
            raise
    finally:
        if started_here:
            ray.shutdown()


def run_grid(configs: Sequence[RunConfig], store_path: str | os.PathLike, *,
             executor: str = "local", workers: int = 1, address: str | None = None,
             cpus_per_run: float = 1.0, gpus_per_run: float = 0.0, lease: float = 60.0,
             max_attempts: int = 3, retry_failed: bool = True, show_progress: bool = False,
             label: str = "grid", grid: str | None = None) -> GridSummary:
    """Run every config not yet done in the store at ``store_path``; resumable.

    ``grid``: the grid's name, recorded in the store with its runs (:meth:`Store.grids`;
    ``sfg report --tensorboard/--mlflow`` file the runs under it).

    Runs already done are skipped; failed ones are retried when ``retry_failed``; runs left
    ``running`` by dead workers are reclaimed. A failing run is recorded as failed with its
    one-line error and the others go on. Returns a :class:`GridSummary`.
    """
    if executor not in ("local", "ray"):
        raise SfgError(f"unknown executor {executor!r}; use local or ray")
    if workers < 0:
        raise SfgError(f"workers must be >= 0 (got {workers}); 0 means one per CPU")
    if not gpus_per_run >= 0 or not cpus_per_run > 0:
        raise SfgError("gpus_per_run must be >= 0 and cpus_per_run > 0")
    if executor == "local" and gpus_per_run > 0:
        raise SfgError("--gpus-per-run applies to --executor ray; local runs use the device "
                       "named in each config")
    if lease <= 0 or max_attempts < 1:
        raise SfgError("lease must be > 0 seconds and max_attempts >= 1")
    if executor == "ray" and gpus_per_run == 0:
        cuda = sum(c.device.startswith("cuda") for c in configs)
        if cuda:
            raise SfgError(f"{cuda} runs use device cuda but --gpus-per-run is 0, so Ray would "
                           "give them no GPU; set --gpus-per-run (e.g. 0.25) or device: cpu")
    workers = workers or (os.cpu_count() or 1)
    from sfg.plugins import load

    # the plugins' components, here and (through SFG_PLUGINS) in spawned workers; a broken
    # one is named by the runs that need it
    load(strict=False)
    by_id: dict[str, RunConfig] = {}
    for cfg in configs:  # duplicates run once, in order of first appearance
        by_id.setdefault(run_id(cfg), cfg)
    ids, unique = list(by_id), list(by_id.values())
    path = Path(store_path)
    t0 = time.perf_counter()
    with Store(path) as store:
        store.add_runs(unique, retry_failed=retry_failed, grid=grid)
        already = store.counts(ids)["done"]  # adding never changes done runs
        with _Bar(show_progress, len(ids), already, label) as bar:
            if executor == "ray":
                _run_ray(path, ids, bar, store, address=address, cpus_per_run=cpus_per_run,
                         gpus_per_run=gpus_per_run, lease=lease, max_attempts=max_attempts)
            elif workers == 1:
                _run_inprocess(path, ids, bar, store, lease=lease, max_attempts=max_attempts)
            else:
                _run_pool(path, ids, bar, store, workers=workers, lease=lease,
                          max_attempts=max_attempts)
            counts = store.counts(ids)
            bar.update(counts)
        idset = set(ids)
        failures = [(r["run_id"], r["error"] or "") for r in store.runs("failed")
                    if r["run_id"] in idset]
    return GridSummary(total=len(ids), already_done=already, done=counts["done"],
                       failed=counts["failed"], pending=counts["queued"] + counts["running"],
                       seconds=time.perf_counter() - t0, failures=failures)
