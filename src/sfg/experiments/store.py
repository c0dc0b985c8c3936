"""Crash-safe SQLite results store (docs/concepts/training.md#pairing, docs/concepts/statistics.md#paired-statistics): runs, their status, metrics and curves.

Tables::

    meta   (key PRIMARY KEY, value)      application, schema_version, created
    runs   (run_id PRIMARY KEY, config JSON, status queued|running|done|failed, error,
            traceback, worker, attempts, queued, started, heartbeat, finished, seconds,
            metrics JSON, dataset, process, rule, seed)
    curves (run_id, name, round, value)  round = position in the run's curve list
    diagnostics (run_id PRIMARY KEY, data JSON)  training diagnostics (docs/concepts/diagnostics.md#training-diagnostics) of runs that
                                         recorded them; created with the first such run
    grid_runs (grid, run_id)             which named grids queued which runs (a run shared by
                                         two grids is listed under both); created with the
                                         first run queued under a grid name

Guarantees:

* WAL journal, a busy timeout and ``BEGIN IMMEDIATE`` write transactions, so several
  processes (local workers, several ``sfg grid run`` invocations) can write at once.
* A run's metrics and curves are written in ONE transaction together with ``status='done'``;
  a run killed mid-way leaves only a ``running`` row without metrics or curves.
* Claiming (:meth:`Store.claim`) is atomic. A run is claimable when it is ``queued``, or
  ``running`` under a worker that is gone: its process no longer exists on this host, or its
  heartbeat is older than the lease (workers on other hosts). A run whose worker died
  ``max_attempts`` times is marked failed instead of being retried forever.
* Opening a file that is not an sfg store (another SQLite database, a non-SQLite file, or an
  sfg store of another schema version) raises :class:`SfgError` without modifying it.

The store file must live on a local filesystem (SQLite's WAL locking does not work over
NFS); on a cluster, let the driver write (the Ray executor does).
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar, cast

from sfg.errors import SfgError
from sfg.experiments.config import RunConfig, canonical_json, run_id
from sfg.metrics import upgrade
from sfg.util.safety import sqlite_message

APPLICATION = "sfg-results"
SCHEMA_VERSION = 1
STATUSES = ("queued", "running", "done", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id    TEXT PRIMARY KEY,
    config    TEXT NOT NULL,
    status    TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')),
    error     TEXT,
    traceback TEXT,
    worker    TEXT,
    attempts  INTEGER NOT NULL DEFAULT 0,
    queued    REAL,
    started   REAL,
    heartbeat REAL,
    finished  REAL,
    seconds   REAL,
    metrics   TEXT,
    dataset   TEXT,
    process   TEXT,
    rule      TEXT,
    seed      INTEGER
);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status);
CREATE TABLE IF NOT EXISTS curves (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    name   TEXT NOT NULL,
    round  INTEGER NOT NULL,
    value  REAL,
    PRIMARY KEY (run_id, name, round)
) WITHOUT ROWID;
"""


_DIAGNOSTICS_TABLE = """CREATE TABLE IF NOT EXISTS diagnostics (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id),
    data   TEXT NOT NULL
) WITHOUT ROWID"""

_GRID_RUNS_TABLE = """CREATE TABLE IF NOT EXISTS grid_runs (
    grid   TEXT NOT NULL,
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    PRIMARY KEY (grid, run_id)
) WITHOUT ROWID"""


def new_worker_id() -> str:
    """``host:pid:random``: identifies one live worker (process) for claims and heartbeats."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped) counts as dead
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def worker_gone(worker: str | None) -> bool:
    """True when ``worker`` (a :func:`new_worker_id`) ran on this host and its process is gone."""
    if not worker:
        return True
    parts = worker.split(":")
    if len(parts) < 3 or parts[0] != socket.gethostname():
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    return not _pid_alive(pid)


def _claimable(status: str, owner: str | None, beat: float | None, now: float,
               lease: float) -> bool:
    if status == "queued":
        return True
    if status != "running":
        return False
    return beat is None or beat < now - lease or worker_gone(owner)


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line (the stored error of a failed run)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _leftovers(path: Path) -> list[Path]:
    """The ``-wal`` and ``-shm`` files beside ``path`` that do not exist yet."""
    return [q for q in (Path(f"{path}-wal"), Path(f"{path}-shm")) if not q.exists()]


def _remove_new(paths: list[Path]) -> None:
    """Remove the side files that opening a refused store created (never pre-existing ones)."""
    for q in paths:
        try:
            if q.exists() and (q.name.endswith("-shm") or q.stat().st_size == 0):
                q.unlink()
        except OSError:
            pass


def _connect_readonly(path: Path, *, timeout: float = 5.0) -> sqlite3.Connection:
    """A read-only connection; on read-only storage (no ``-shm`` can be made) an immutable one.

    A WAL database needs its ``-shm`` file even to read; where that cannot be created (a
    read-only mount or folder) SQLite is told the file cannot change (``immutable=1``), which
    holds there since nobody can write it either.
    """
    uri = path.resolve().as_uri()
    con = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=timeout)
    try:
        con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return con
    except sqlite3.OperationalError as e:
        con.close()
        if "unable to open" not in str(e) and "readonly" not in str(e):
            raise
    return sqlite3.connect(uri + "?immutable=1", uri=True, timeout=timeout)


def _inspect(path: Path) -> bool:
    """Check an existing file read-only. True: an sfg store of this version; False: empty.

    Only SQLite touches the file: opening and closing it any other way (``open()``) in a
    process that holds SQLite connections to it would drop their POSIX locks and break WAL
    for every other process.
    """
    try:
        con = _connect_readonly(path)
        try:
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            meta = dict(con.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e):
            raise SfgError(f"{path} is not an SQLite database ({e}), so not an sfg results "
                           "store; give a new file name for --store") from None
        raise SfgError(sqlite_message(path, e)) from None
    if not tables:
        return False
    if meta.get("application") != APPLICATION:
        shown = ", ".join(sorted(tables)[:6])
        raise SfgError(f"{path} is an SQLite database but not an sfg results store (tables: "
                       f"{shown}); give a new file name for --store")
    version = meta.get("schema_version")
    if version != str(SCHEMA_VERSION):
        raise SfgError(f"{path} is an sfg results store of schema version {version}, but this "
                       f"sfg reads version {SCHEMA_VERSION}; use the sfg version that wrote it "
                       "or a new store file")
    return True


def _writable(path: Path) -> bool:
    """Whether this process may write ``path`` and create its ``-wal``/``-shm`` beside it."""
    return os.access(path, os.W_OK) and os.access(path.parent if str(path.parent) else ".",
                                                  os.W_OK)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _guarded(method: _Method) -> _Method:
    """Turn SQLite failures inside a store method (a damaged page...) into one-line errors."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as e:
            if self.readonly and "readonly" in str(e).lower():
                raise SfgError(f"results store {self.path} was opened read-only; running a "
                               "grid needs a writable store") from None
            raise SfgError(sqlite_message(self.path, e)) from None

    return cast(_Method, wrapper)


class Store:
    """One connection to a results store (use one per process or thread).

    ``Store(path)`` creates the file when it is missing (``create=False``: raise instead).
    """

    def __init__(self, path: str | os.PathLike, *, create: bool = True,
                 busy_timeout: float = 120.0, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._con: sqlite3.Connection | None = None
        if self.path.is_dir():
            raise SfgError(f"results store {self.path} is a directory; give a file name such "
                           "as results.sqlite")
        if self.path.exists() and not self.path.is_file():
            raise SfgError(f"results store {self.path} is not a regular file; give a file name "
                           "such as results.sqlite")
        exists = self.path.exists() and self.path.stat().st_size > 0
        new_side_files = _leftovers(self.path)
        if exists:
            try:
                _inspect(self.path)
            except SfgError:
                _remove_new(new_side_files)
                raise
        if readonly or (exists and not create and not _writable(self.path)):
            if not exists:
                raise SfgError(f"no results store at {self.path}; run `sfg grid run GRID.yaml "
                               f"--store {self.path}` first or fix the path")
            self.readonly = True
            try:
                if _writable(self.path):
                    # an ordinary connection that never writes: SQLite then removes the -wal
                    # and -shm files it made when it closes (a mode=ro one would leave them)
                    self._con = sqlite3.connect(self.path, timeout=busy_timeout,
                                                isolation_level=None, check_same_thread=False)
                    self._con.execute("PRAGMA query_only = ON")
                else:
                    self._con = _connect_readonly(self.path, timeout=busy_timeout)
                self._con.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            except sqlite3.DatabaseError as e:
                self._close_quietly()
                _remove_new(new_side_files)
                raise SfgError(sqlite_message(self.path, e)) from None
            return
        if not exists and not create:
            raise SfgError(f"no results store at {self.path}; run `sfg grid run GRID.yaml "
                           f"--store {self.path}` first or fix the path")
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SfgError(f"cannot create the folder of results store {self.path} "
                               f"({e.strerror or e}); give a path in a writable folder") from None
        self._con = None
        # Several processes opening a new store at once race to switch it to WAL; SQLite then
        # answers "database is locked" at once, without waiting on the busy handler, so the
        # opening is retried (with a short back-off) until busy_timeout has passed.
        deadline = time.monotonic() + busy_timeout
        delay = 0.01
        while True:
            try:
                self._open(busy_timeout)
                return
            except sqlite3.OperationalError as e:
                self._close_quietly()
                if "locked" not in str(e) or time.monotonic() + delay > deadline:
                    _remove_new(new_side_files)
                    raise SfgError(sqlite_message(self.path, e, "open")) from None
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
            except (sqlite3.DatabaseError, SfgError) as e:
                self._close_quietly()
                _remove_new(new_side_files)
                if isinstance(e, SfgError):
                    raise
                raise SfgError(sqlite_message(self.path, e, "open")) from None

    def _open(self, busy_timeout: float) -> None:
        self._con = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None,
                                    check_same_thread=False)
        self._con.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self._con.execute("PRAGMA journal_mode = WAL")
        self._con.execute("PRAGMA synchronous = NORMAL")
        self._con.execute("PRAGMA foreign_keys = ON")
        meta = self._read_meta()
        if not meta:
            self._create_schema()
        elif (meta.get("application"), meta.get("schema_version")) != (
                APPLICATION, str(SCHEMA_VERSION)):
            raise SfgError(f"{self.path} is not an sfg results store of schema version "
                           f"{SCHEMA_VERSION}; give a new file name for --store")

    @property
    def _db(self) -> sqlite3.Connection:
        """The open connection (set once ``__init__`` has succeeded)."""
        if self._con is None:
            raise SfgError(f"results store {self.path} is not open")
        return self._con

    def _close_quietly(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def _read_meta(self) -> dict[str, str]:
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            return dict(self._db.execute("SELECT key, value FROM meta"))
        return {}

    def _create_schema(self) -> None:
        """Create the tables once (several processes may race to create a new store)."""
        with self._write() as con:
            meta = self._read_meta()
            if not meta:
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    con.execute(stmt)
                con.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
                    ("application", APPLICATION),
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("created", datetime.now(timezone.utc).isoformat(timespec="seconds")),
                ])
            elif (meta.get("application"), meta.get("schema_version")) != (
                    APPLICATION, str(SCHEMA_VERSION)):
                raise SfgError(f"{self.path} is not an sfg results store of schema version "
                               f"{SCHEMA_VERSION}; give a new file name for --store")

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        if self._con is not None:
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: takes the write lock up front)."""
        if self.readonly:
            raise SfgError(f"results store {self.path} is read-only here (read-only storage); "
                           "`sfg report` and `sfg grid status` can read it, but running a grid "
                           "needs a writable copy")
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise SfgError(sqlite_message(self.path, e, "write to")) from None
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @_guarded
    def meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta"))

    # ------------------------------------------------------------------ queue
    @_guarded
    def add_runs(self, configs: Iterable[RunConfig], *, retry_failed: bool = True,
                 grid: str | None = None) -> list[str]:
        """Queue ``configs`` (runs already present keep their state); return their run ids.

        ``retry_failed``: failed runs among them go back to the queue (a resumed grid redoes
        them). Done runs are never redone. ``grid``: the name of the grid they belong to,
        recorded for every one of them (see :meth:`grids`).
        """
        now = time.time()
        rows, ids = [], []
        for cfg in configs:
            rid = run_id(cfg)
            ids.append(rid)
            rows.append((rid, canonical_json(cfg), now, cfg.dataset, cfg.process, cfg.rule,
                         cfg.seed))
        with self._write() as con:
            con.executemany(
                "INSERT OR IGNORE INTO runs (run_id, config, status, queued, dataset, process, "
                "rule, seed) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)", rows)
            if grid is not None:
                con.execute(_GRID_RUNS_TABLE)
                con.executemany("INSERT OR IGNORE INTO grid_runs (grid, run_id) VALUES (?, ?)",
                                [(grid, rid) for rid in ids])
            if retry_failed:
                con.execute(
                    "UPDATE runs SET status = 'queued', worker = NULL, error = NULL, "
                    "traceback = NULL, attempts = 0, queued = ? WHERE status = 'failed' AND "
                    "run_id IN (SELECT value FROM json_each(?))", (now, json.dumps(ids)))
        return ids

    @_guarded
    def claim(self, run_ids: Sequence[str], worker: str, *, lease: float = 60.0,
              max_attempts: int = 3) -> tuple[str, dict] | None:
        """Atomically take the next claimable run of ``run_ids`` (in their order) for ``worker``.

        Returns ``(run_id, config dict)`` or None when nothing is claimable.
        """
        now = time.time()
        ids = json.dumps(list(run_ids))
        with self._write() as con:
            rows = con.execute(
                "SELECT r.run_id, r.config, r.status, r.worker, r.heartbeat, r.attempts "
                "FROM json_each(?) AS j JOIN runs AS r ON r.run_id = j.value "
                "WHERE r.status IN ('queued', 'running') ORDER BY r.status = 'running', j.key",
                (ids,)).fetchall()
            for rid, config, status, owner, beat, attempts in rows:
                if not _claimable(status, owner, beat, now, lease):
                    continue
                if status == "running":
                    if attempts >= max_attempts:
                        con.execute(
                            "UPDATE runs SET status = 'failed', finished = ?, error = ? "
                            "WHERE run_id = ?",
                            (now, f"WorkerLost: its worker died {attempts} times while running "
                                  "it (killed, out of memory?); fix and rerun the grid", rid))
                        continue
                con.execute("DELETE FROM curves WHERE run_id = ?", (rid,))
                con.execute(
                    "UPDATE runs SET status = 'running', worker = ?, started = ?, heartbeat = ?, "
                    "attempts = attempts + 1, error = NULL, traceback = NULL, metrics = NULL "
                    "WHERE run_id = ?", (worker, now, now, rid))
                return rid, json.loads(config)
        return None

    @_guarded
    def claimable(self, run_ids: Sequence[str], *, lease: float = 60.0) -> int:
        """How many of ``run_ids`` :meth:`claim` could take now (read-only)."""
        now = time.time()
        rows = self._db.execute(
            "SELECT r.status, r.worker, r.heartbeat FROM runs AS r WHERE r.status IN "
            "('queued', 'running') AND r.run_id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(run_ids)),)).fetchall()
        return sum(_claimable(status, owner, beat, now, lease) for status, owner, beat in rows)

    @_guarded
    def heartbeat(self, worker: str) -> int:
        """Refresh the lease of every run ``worker`` holds; returns how many."""
        with self._write() as con:
            return con.execute("UPDATE runs SET heartbeat = ? WHERE worker = ? AND "
                               "status = 'running'", (time.time(), worker)).rowcount

    @_guarded
    def finish(self, rid: str, worker: str, result: dict, *, seconds: float) -> bool:
        """Record a finished run (metrics, curves, status done) in one transaction.

        Returns False (and writes nothing) when ``worker`` no longer holds the run.
        """
        now = time.time()
        metrics = json.dumps(result["metrics"], sort_keys=True)
        points = [(rid, name, i, None if math.isnan(v) else v)
                  for name, values in result["curves"].items() for i, v in enumerate(values)]
        with self._write() as con:
            cur = con.execute(
                "UPDATE runs SET status = 'done', metrics = ?, finished = ?, heartbeat = ?, "
                "seconds = ?, error = NULL, traceback = NULL "
                "WHERE run_id = ? AND worker = ? AND status = 'running'",
                (metrics, now, now, seconds, rid, worker))
            if cur.rowcount != 1:
                return False  # nothing changed; committing the empty transaction is harmless
            con.execute("DELETE FROM curves WHERE run_id = ?", (rid,))
            con.executemany("INSERT INTO curves (run_id, name, round, value) VALUES (?, ?, ?, ?)",
                            points)
            if result.get("diagnostics") is not None:
                con.execute(_DIAGNOSTICS_TABLE)
                con.execute("INSERT OR REPLACE INTO diagnostics (run_id, data) VALUES (?, ?)",
                            (rid, json.dumps(result["diagnostics"], sort_keys=True)))
        return True

    @_guarded
    def fail(self, rid: str, worker: str, error: str, *, traceback: str | None = None,
             seconds: float | None = None) -> bool:
        """Record a failed run (one-line ``error``); False when ``worker`` lost the run."""
        now = time.time()
        with self._write() as con:
            cur = con.execute(
                "UPDATE runs SET status = 'failed', error = ?, traceback = ?, finished = ?, "
                "seconds = ? WHERE run_id = ? AND worker = ? AND status = 'running'",
                (" ".join(error.split()), traceback, now, seconds, rid, worker))
            return cur.rowcount == 1

    @_guarded
    def release(self, rid: str, worker: str) -> None:
        """Put a run ``worker`` holds back in the queue (interrupted, not failed)."""
        with self._write() as con:
            con.execute("UPDATE runs SET status = 'queued', worker = NULL, "
                        "attempts = MAX(attempts - 1, 0) "
                        "WHERE run_id = ? AND worker = ? AND status = 'running'", (rid, worker))

    # ------------------------------------------------------------------ reading
    @_guarded
    def counts(self, run_ids: Sequence[str] | None = None) -> dict[str, int]:
        """Runs per status (all four keys present), over ``run_ids`` or the whole store."""
        if run_ids is None:
            rows = self._db.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")
        else:
            rows = self._db.execute(
                "SELECT r.status, COUNT(*) FROM runs AS r WHERE r.run_id IN "
                "(SELECT value FROM json_each(?)) GROUP BY r.status",
                (json.dumps(list(run_ids)),))
        out = dict.fromkeys(STATUSES, 0)
        out.update(dict(rows.fetchall()))
        return out

    @_guarded
    def runs(self, status: str | None = None) -> list[dict]:
        """Every run row (no curves) as a dict, in insertion order; metrics under today's
        names (a run stored by sfg 0.2.0: :func:`sfg.metrics.upgrade`)."""
        cols = ("run_id", "status", "error", "traceback", "worker", "attempts", "started",
                "heartbeat", "finished", "seconds", "dataset", "process", "rule", "seed", "config",
                "metrics")
        where, args = ("WHERE status = ?", (status,)) if status else ("", ())
        rows = self._db.execute(f"SELECT {', '.join(cols)} FROM runs {where} ORDER BY rowid",
                                 args).fetchall()
        out = []
        for row in rows:
            d = dict(zip(cols, row, strict=True))
            d["config"] = json.loads(d["config"])
            # a run stored by an older sfg reads with today's metric names (sfg.metrics)
            d["metrics"] = upgrade(json.loads(d["metrics"]), str(d["config"].get("kind"))) \
                if d["metrics"] else {}
            out.append(d)
        return out

    @_guarded
    def curves(self, rid: str | None = None) -> dict[str, dict[str, list[float]]]:
        """``{run_id: {name: [value per round index]}}`` (NaN restored from NULL)."""
        where, args = ("WHERE run_id = ?", (rid,)) if rid else ("", ())
        out: dict[str, dict[str, list[float]]] = {}
        for r, name, _i, value in self._db.execute(
                f"SELECT run_id, name, round, value FROM curves {where} "
                "ORDER BY run_id, name, round", args):
            out.setdefault(r, {}).setdefault(name, []).append(
                math.nan if value is None else float(value))
        return out

    @_guarded
    def diagnostics(self) -> dict[str, dict]:
        """``{run_id: diagnostics}`` of the runs that recorded training diagnostics."""
        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                 "name = 'diagnostics'").fetchone():
            return {}
        return {rid: json.loads(data) for rid, data in
                self._db.execute("SELECT run_id, data FROM diagnostics")}

    @_guarded
    def grids(self) -> dict[str, list[str]]:
        """``{run_id: [grid names, sorted]}`` of the runs queued under a grid name.

        Runs queued without one (stores written before grids were recorded, ``sfg swarm``) are
        absent.
        """
        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                 "name = 'grid_runs'").fetchone():
            return {}
        out: dict[str, list[str]] = {}
        for grid, rid in self._db.execute("SELECT grid, run_id FROM grid_runs "
                                           "ORDER BY grid, run_id"):
            out.setdefault(rid, []).append(grid)
        return out

    @_guarded
    def records(self, status: str | None = "done") -> list[dict]:
        """Runs with ``status`` (None: all) as report records, see :func:`records`."""
        if status is not None and status not in STATUSES:
            raise SfgError(f"unknown run status {status!r}; use one of {', '.join(STATUSES)}")
        curves = self.curves()
        diags = self.diagnostics()
        out = [{"run_id": r["run_id"], "dataset": r["dataset"], "process": r["process"],
                "rule": r["rule"], "seed": r["seed"], "status": r["status"],
                "config": r["config"], "metrics": r["metrics"],
                "curves": curves.get(r["run_id"], {})}
               for r in self.runs(status)]
        for rec in out:
            if rec["run_id"] in diags:
                rec["diagnostics"] = diags[rec["run_id"]]
        return out


def records(store: Store | str | os.PathLike, status: str | None = "done") -> list[dict]:
    """``[{"run_id", "dataset", "process", "rule", "seed", "status", "config", "metrics",
    "curves"}]`` for runs with ``status`` (insertion order); what statistics and reports read.
    """
    if isinstance(store, Store):
        return store.records(status)
    with Store(store, create=False, readonly=True) as s:
        return s.records(status)
