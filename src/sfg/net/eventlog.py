"""Event logs of real runs (docs/concepts/clock.md#the-node-on-the-clock): what a deployed node saw, in the order and at the times
it saw it, so that ``sfg swarm --replay-log FILE --clock virtual`` (:mod:`sfg.net.replaylog`)
can re-execute the run with the same node code under the virtual clock.

A node with an :class:`EventLog` (``NodeConfig(events=...)``; ``sfg node --record-log``,
``sfg swarm --mode async --record-log``) appends one JSON line per event to its own file; every
line is one ``write`` of a whole line, so a SIGKILLed node leaves whole lines and its restarted
incarnation appends to the same file. Format version :data:`VERSION`::

    {"format": "sfg-event-log", "version": 1, "kind": "node", "node": 3, "world": {...},
     "edges": null, "settings": {"mode": "async", "period": 0.4, ...}, "sfg": "0.2.0"}
    {"ev": "open", "t": ..., "m": ..., "resume": false, "restored": null, "pid": 123, "clock": "..."}
    {"ev": "start", "t": ..., "m": ..., "t0": 1717.2, "restored": null}
    {"ev": "wake", "t": ..., "m": ..., "round": 0, "available": true}
    {"ev": "availability", "t": ..., "m": ..., "available": true}
    {"ev": "arrival", "t": ..., "m": ..., "sender": 5, "round": 0, "sha256": "9f0c...",
     "age": 0, "lag": 0.0, "count": 2, "local_count": 1}
    {"ev": "trained", "t": ..., "m": ..., "round": 0, "interrupted": false}
    {"ev": "end", "t": ..., "m": ..., "round": 12, "sha256": "..."}

``t`` is the node's ``clock.time()`` and ``m`` its ``clock.monotonic()`` — the very readings the
node used: a wake's are those its round started with (availability by time, waited
staleness), an arrival's ``t`` is the time its availability was checked at and ``m`` the
arrival time it stores, a ``trained`` event's ``t`` is the time its interruption check read.
``open`` starts an incarnation (a process start; ``restored`` is the checkpoint's round
after a crash), ``start`` is the start of its rounds (``restored``: the restore record with
the missed rounds), ``availability`` marks a change of the node's availability between
consecutive wakes. ``clock`` names the machine's monotonic clock (its boot id): nodes with the
same one share a time axis. The final model is written next to the log as safetensors
(:func:`models_path`, tensor ``node-<id>``); ``end`` carries its SHA-256.

``sfg swarm`` merges its nodes' files into one (:func:`merge`): a header of ``"kind":
"swarm"``, every node's lines with a ``"node"`` field, and a trailer ``{"end_of_log": true,
"events": K}``; a file without it was cut short. :func:`read_logs` reads either kind (one
swarm log, or the node logs of every node) and checks every line; anything malformed is an
:class:`~sfg.errors.SfgError` naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError

FORMAT = "sfg-event-log"
VERSION = 1
_NUM = (int, float)

# per event: required fields and their types (besides "ev", "t", "m")
SCHEMA: dict[str, dict[str, Any]] = {
    "open": {"resume": bool, "restored": (int, type(None))},
    "start": {"t0": _NUM, "restored": (dict, type(None))},
    "wake": {"round": int, "available": bool},
    "availability": {"available": bool},
    "arrival": {"sender": int, "round": int, "sha256": str, "age": int, "lag": _NUM,
                "count": int, "local_count": int},
    "trained": {"round": int, "interrupted": bool},
    "end": {"round": int, "sha256": str},
}


def clock_id() -> str:
    """The machine's monotonic clock: its host and boot id (Linux), shared by its processes."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = f"pid-{os.getpid()}"  # unknown: never matches another process
    return f"{socket.gethostname()}/{boot}"


def models_path(log: str | Path) -> Path:
    """Where the final models of the run logged in ``log`` are kept: ``<log>.models.safetensors``."""
    p = Path(log)
    return p.with_name(p.name + ".models.safetensors")


def model_digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x, "<f4").tobytes()).hexdigest()


def _line(obj: dict) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()


class EventLog:
    """One node's event log file, appended to (see the module docstring). The node calls
    :meth:`record` through its ``_log`` hook; the header is written on the first event."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._available: bool | None = None
        self._ended = False  # after its last round a node may still answer; that changes nothing

    def _open(self, node) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size == 0:
                os.write(self._fd, _line(header_of(node)))
        return self._fd

    def record(self, node, event: str, fields: dict[str, Any]) -> None:
        if self._ended:
            return
        fd = self._open(node)
        restored = fields.get("restored")
        if event == "start" and isinstance(restored, dict) and "at" in restored:
            fields.setdefault("t", restored["at"])  # the time the missed rounds were counted at
        fields.setdefault("t", node.clock.time())
        fields.setdefault("m", node.clock.monotonic())
        if event == "open":
            fields.update(pid=os.getpid(), clock=clock_id())
        elif event == "end":
            x = fields.pop("final")
            save_models(models_path(self.path), {int(node.i): x})
            fields["sha256"] = model_digest(x)
        elif event == "wake" and fields["available"] != self._available:
            self._available = bool(fields["available"])
            os.write(fd, _line({"ev": "availability", "t": fields["t"], "m": fields["m"],
                                "available": self._available}))
        os.write(fd, _line({"ev": event, **fields}))
        if event == "end":
            self._ended = True
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def header_of(node) -> dict[str, Any]:
    """A node log's header: the world's settings and the node's protocol settings."""
    import sfg

    w, c = node.world, node.cfg
    edges = w.graph.edges.tolist() if w.graph.name == "peers" else None
    # the node's peers chosen per exchange (its NodeConfig's, else the run's) are the world's
    # for the replay, which runs every node with the world's settings
    world = w.cfg if node.membership.fixed else {**w.cfg, "peers": str(node.membership.peers)}
    return {"format": FORMAT, "version": VERSION, "kind": "node", "node": int(node.i),
            "world": world, "edges": edges,
            "settings": {"mode": c.mode, "period": c.period, "jitter": c.jitter,
                         "window": c.window,
                         "partitions": [p.text() for p in c.partitions]},
            "sfg": getattr(sfg, "__version__", "")}


def save_models(path: Path, models: dict[int, np.ndarray]) -> None:
    from safetensors.numpy import save

    from sfg.net.checkpoints import write_atomic

    write_atomic(path, save({f"node-{i}": np.ascontiguousarray(x, np.float32)
                             for i, x in sorted(models.items())}))


def load_models(path: Path) -> dict[int, np.ndarray]:
    """The final models next to a log (empty if there are none)."""
    if not path.is_file():
        return {}
    from safetensors.numpy import load

    try:
        d = load(path.read_bytes())
        return {int(k.removeprefix("node-")): v.astype(np.float32).reshape(-1)
                for k, v in d.items() if k.startswith("node-")}
    except Exception as e:  # noqa: BLE001 - a damaged file: one line
        raise SfgError(f"cannot read the final models {path}: {str(e).splitlines()[0]}") from None


# ----------------------------------------------------------------------------------- reading
@dataclass
class Recording:
    """A logged run: the world's settings, the nodes' protocol settings, each node's events
    (dicts, in order) and the real run's final models where they were kept."""

    paths: list[Path]
    world: dict[str, Any]
    edges: list | None
    settings: dict[str, Any]
    events: dict[int, list[dict]] = field(default_factory=dict)
    final: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        return sum(len(v) for v in self.events.values())


def _bad(path: Path, k: int | None, what: str) -> SfgError:
    where = f"{path}" if k is None else f"{path} line {k}"
    return SfgError(f"event log {where}: {what}; record it again with "
                    "`sfg swarm --protocol async --record-log FILE`")


def _check_event(path: Path, k: int, ev: Any) -> dict:
    if not isinstance(ev, dict) or not isinstance(ev.get("ev"), str):
        raise _bad(path, k, "not an event (a JSON object with an 'ev' field)")
    name = ev["ev"]
    schema = SCHEMA.get(name)
    if schema is None:
        raise _bad(path, k, f"unknown event {name!r} (known: {', '.join(SCHEMA)})")
    for key, typ in {"t": _NUM, "m": _NUM, **schema}.items():
        v = ev.get(key, KeyError)
        ok = v is not KeyError and isinstance(v, typ) and not (
            typ in (_NUM, int) and isinstance(v, bool)) and not (
            isinstance(v, float) and not math.isfinite(v))
        if not ok:
            raise _bad(path, k, f"event {name!r} needs {key!r} of type "
                                f"{getattr(typ, '__name__', 'number')}")
    if name in ("arrival", "end"):
        s = ev["sha256"]
        if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
            raise _bad(path, k, f"{name} digest {s[:16]!r} is not a SHA-256 in hex")
    if "round" in schema and ev["round"] < 0:
        raise _bad(path, k, f"negative round {ev['round']}")
    return ev


def _read_one(path: Path) -> tuple[dict, dict[int, list[dict]]]:
    if not path.is_file():
        raise SfgError(f"event log {path} not found; check the path")
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError:
        raise _bad(path, None, "not UTF-8 text (not an event log?)") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        raise _bad(path, len(lines), "the last line is cut short (truncated file)")
    if not lines:
        raise _bad(path, None, "empty file")
    objs = []
    for k, ln in enumerate(lines, 1):
        try:
            objs.append(json.loads(ln))
        except ValueError:
            raise _bad(path, k, "not a JSON line (damaged or truncated file)") from None
    head = objs[0]
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise _bad(path, 1, f"no {FORMAT} header (not an event log?)")
    if head.get("version") != VERSION:
        raise _bad(path, 1, f"format version {head.get('version')!r}; this sfg reads "
                            f"version {VERSION}")
    if head.get("kind") not in ("node", "swarm") or not isinstance(head.get("world"), dict) \
            or not isinstance(head.get("settings"), dict):
        raise _bad(path, 1, "the header needs kind (node or swarm), world and settings")
    events: dict[int, list[dict]] = {}
    body = objs[1:]
    if head["kind"] == "swarm":
        if not body or not isinstance(body[-1], dict) or body[-1].get("end_of_log") is not True:
            raise _bad(path, len(objs), "no end-of-log line: the file was cut short "
                                        "(truncated) or the recording did not finish")
        if body[-1].get("events") != len(body) - 1:
            raise _bad(path, len(objs), f"the end-of-log line counts {body[-1].get('events')} "
                                        f"events, the file has {len(body) - 1}")
        n = head.get("nodes")
        if not isinstance(n, int) or n < 1:
            raise _bad(path, 1, "the header needs the number of nodes")
        for k, ev in enumerate(body[:-1], 2):
            i = ev.get("node") if isinstance(ev, dict) else None
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
                raise _bad(path, k, f"an event needs its node 0..{n - 1}")
            events.setdefault(i, []).append(_check_event(path, k, ev))
        missing = sorted(set(range(n)) - set(events))
        if missing:
            raise _bad(path, None, f"no events of node(s) {missing[:5]}")
    else:
        i = head.get("node")
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise _bad(path, 1, "a node log's header needs its node id")
        events[i] = [_check_event(path, k, ev) for k, ev in enumerate(body, 2)]
    for i, evs in events.items():
        if not evs or evs[0]["ev"] != "open":
            raise _bad(path, None, f"node {i}'s events do not begin with 'open'")
        if evs[-1]["ev"] != "end":
            raise _bad(path, None, f"node {i}'s events end before the node finished (no 'end' "
                                   "event): the file is truncated or the node never finished")
    return head, events


def read_logs(paths: list[str | Path]) -> Recording:
    """Read one swarm log or the node logs of a run; every line is checked (see the module
    docstring). The final models are read from :func:`models_path` where present."""
    if not paths:
        raise SfgError("no event log given; pass --replay-log FILE")
    rec: Recording | None = None
    for p in map(Path, paths):
        head, events = _read_one(p)
        if rec is None:
            rec = Recording([p], head["world"], head.get("edges"), head["settings"])
        else:
            if head["world"] != rec.world or head["settings"] != rec.settings or \
                    head.get("edges") != rec.edges:
                raise SfgError(f"event log {p} records a run with other settings than "
                               f"{rec.paths[0]}; replay the logs of one run together")
            rec.paths.append(p)
        for i, evs in events.items():
            if i in rec.events:
                raise SfgError(f"event log {p}: node {i} is also logged in another file; "
                               "pass each node's log once")
            rec.events[i] = evs
        for i, x in load_models(models_path(p)).items():
            rec.final.setdefault(i, x)
    assert rec is not None
    return rec


# ----------------------------------------------------------------------------------- merging
def merge(parts: list[Path], out: str | Path, *, settings: dict | None = None) -> Path:
    """``sfg swarm``: the nodes' logs ``parts`` as one swarm log ``out`` (header, every node's
    events, end-of-log line; written atomically) and their final models as one
    :func:`models_path` file. ``settings`` (the swarm's own, e.g. kills) join the header."""
    from sfg.net.checkpoints import write_atomic

    rec = read_logs(parts)
    n = int(rec.world["n_clients"])
    missing = sorted(set(range(n)) - set(rec.events))
    if missing:
        raise SfgError(f"no event log of node(s) {missing[:5]} to merge")
    head = {"format": FORMAT, "version": VERSION, "kind": "swarm", "nodes": n,
            "world": rec.world, "edges": rec.edges, "settings": rec.settings,
            "swarm": settings or {}}
    lines = [_line(head)]
    for i in sorted(rec.events):
        lines += [_line({"node": i, **ev}) for ev in rec.events[i]]
    lines.append(_line({"end_of_log": True, "events": rec.n_events}))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if rec.final:
        save_models(models_path(out), rec.final)
    write_atomic(out, b"".join(lines))
    return out
