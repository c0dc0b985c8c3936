"""Real traces as outage processes (docs/concepts/outages.md#outage-processes "Real traces", docs/concepts/traces.md#real-availability-traces): ``flash``, ``stunner``, ``trace``.

Each factory parses its file once per Python process (cached by resolved path, file size and
modification time, and the pipeline parameters) and returns a :class:`TraceProcess`, whose
``sample(T, N, seed=s)`` draws N eligible devices WITHOUT replacement from the stream
``sfg.util.rng.stream(s, "trace-devices")`` (so the draw is a random order too: device k of the draw
goes to node k, a random mapping of devices onto nodes) and returns their first T rounds::

    make_process("flash:rule=strict,path=../shared/data/flash/flash_state_traces_subset.json")
        .sample(300, 20, seed=1)          # bool[300, 20]

Too few eligible devices raise an :class:`SfgError` naming the options (``replace=true`` or
fewer clients); so does a T longer than the trace's window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.util.components import did_you_mean, format_component
from sfg.util.rng import stream
from sfg.util.safety import check_cells
from sfg.world.outages.registry import PROCESSES
from sfg.world.traces.base import Trace, existing_file, positive_int
from sfg.world.traces.flash import FlashStates, flash_trace, parse_flash
from sfg.world.traces.stunner import Sessions, parse_sessions, stunner_trace
from sfg.world.traces.tabular import load_tabular

SOURCES = ("flash", "stunner", "tabular")
_PARSED: dict[tuple, FlashStates | Sessions] = {}
_TRACES: dict[tuple, Trace] = {}


def _file_key(path: str | Path, what: str) -> tuple:
    p = existing_file(path, what)
    st = p.stat()
    return (str(p.resolve()), st.st_size, st.st_mtime_ns)


def load_trace(source: str, path: str | Path, **params: Any) -> Trace:
    """Build (or fetch from the in-process cache) the trace of ``source`` at ``path``.

    ``source``: ``flash`` (params of :func:`sfg.world.traces.flash.flash_trace` plus
    ``ignore_unknown``), ``stunner`` (of :func:`sfg.world.traces.stunner.stunner_trace`) or
    ``tabular`` (of :func:`sfg.world.traces.tabular.load_tabular`). ``None`` values mean "default".
    """
    source = str(source).lower()
    if source == "trace":
        source = "tabular"
    if source not in SOURCES:
        raise SfgError(f"unknown trace source {source!r}{did_you_mean(source, SOURCES)}")
    params = {k: v for k, v in params.items() if v is not None}
    what = {"flash": "FLASH trace", "stunner": "STUNner session", "tabular": "trace"}[source]
    fkey = _file_key(path, what)
    key = (source, fkey, tuple(sorted((k, repr(v)) for k, v in params.items())))
    given = (*key, str(path))  # the trace as this path names it (a link: its own name)
    if given in _TRACES:
        return _TRACES[given]
    if key in _TRACES:
        _TRACES[given] = _as_given(_TRACES[key], path)
        return _TRACES[given]
    if source == "flash":
        ignore = bool(params.pop("ignore_unknown", False))
        states = _parsed("flash", path, fkey, ignore)
        assert isinstance(states, FlashStates)
        trace = flash_trace(states, **params)
    elif source == "stunner":
        sessions = _parsed("stunner", path, fkey, False)
        assert isinstance(sessions, Sessions)
        trace = stunner_trace(sessions, **params)
    else:
        trace = load_tabular(path, **params)
    _TRACES[key] = trace
    _TRACES[given] = _as_given(trace, path)
    return _TRACES[given]


def _as_given(trace: Trace, path: str | Path) -> Trace:
    """The cached trace under the path this call named (the cache is keyed by the resolved
    file: a link and its target share one parse, and each is reported as written)."""
    from dataclasses import replace

    if "path" not in trace.meta or trace.meta["path"] == str(path):
        return trace
    return replace(trace, meta={**trace.meta, "path": str(path)})


def _parsed(source: str, path: str | Path, fkey: tuple, ignore: bool) -> FlashStates | Sessions:
    pkey: tuple[Any, ...] = ("flash", fkey, ignore) if source == "flash" else ("stunner", fkey)
    if pkey not in _PARSED:
        _PARSED[pkey] = (parse_flash(path, ignore_unknown=ignore) if source == "flash"
                         else parse_sessions(path))
    return _PARSED[pkey]


def load_parsed(source: str, path: str | Path, *,
                ignore_unknown: bool = False) -> FlashStates | Sessions:
    """The parsed file behind a ``flash`` or ``stunner`` trace (shared with :func:`load_trace`).

    :class:`FlashStates` (per-minute states) or :class:`Sessions` (online/offline sessions in
    ms): the native resolution that :mod:`sfg.world.timeline` reads (docs/concepts/clock.md#the-world-in-time).
    """
    source = str(source).lower()
    if source not in ("flash", "stunner"):
        raise SfgError(f"no parsed file for trace source {source!r}; choose flash or stunner")
    what = {"flash": "FLASH trace", "stunner": "STUNner session"}[source]
    return _parsed(source, path, _file_key(path, what), bool(ignore_unknown))


def clear_cache() -> None:
    """Forget every parsed file and built trace of this process."""
    _PARSED.clear()
    _TRACES.clear()


@dataclass(frozen=True, eq=False)
class TraceProcess:
    """An outage process replaying the devices of a real :class:`Trace` (docs/concepts/outages.md#outage-processes, docs/concepts/traces.md#real-availability-traces)."""

    name: str
    trace: Trace
    replace: bool = False

    def draw(self, N: int, *, seed: int) -> np.ndarray:
        """int64[N]: the trace columns (devices) given to nodes 0..N-1 under ``seed``."""
        N = positive_int(N, "N (number of clients)")
        check_cells(self.trace.rounds, N, 1, "the availability of this run", cols_name="clients",
                    fix="lower --clients")
        D = self.trace.n_devices
        where = _where(self.trace)
        if D == 0:
            raise SfgError(f"no eligible device in {where}; relax the rule or min_availability")
        rng = stream(seed, "trace-devices")
        if self.replace:
            return rng.integers(0, D, size=N).astype(np.int64)
        if N > D:
            raise SfgError(
                f"only {D} eligible devices in {where} but {N} clients requested; pass "
                f"replace=true to draw devices with replacement, or set --clients {D}"
            )
        return rng.choice(D, size=N, replace=False).astype(np.int64)

    def device_ids(self, N: int, *, seed: int) -> list[str]:
        """The device ids given to nodes 0..N-1 under ``seed`` (same draw as :meth:`sample`)."""
        return [self.trace.devices[i] for i in self.draw(N, seed=seed)]

    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray:
        """bool[T, N]: the first T rounds of N devices drawn for ``seed``; positions unused."""
        T = positive_int(T, "T (number of rounds)")
        R = self.trace.rounds
        if T > R:
            raise SfgError(
                f"{_where(self.trace)} has "
                f"{R} rounds of {self.trace.round_minutes:g} min but T={T} were requested; "
                f"use at most {R} rounds or build a longer window (rounds={T})"
            )
        cols = self.draw(N, seed=seed)
        return np.ascontiguousarray(self.trace.available[:T, cols])


def _where(trace: Trace) -> str:
    m = trace.meta
    label = ", ".join(f"{k}={m[k]}" for k in ("rule", "variant") if k in m)
    return f"{m.get('source', 'trace')} trace {m.get('path', '?')}" + (f" ({label})" if label else "")


def _name(kind: str, params: dict[str, Any]) -> str:
    return format_component(kind, {k: v for k, v in params.items() if v is not None})


def _need_path(kind: str, path: Any, example: str) -> str:
    if path is None or str(path).strip() == "":
        raise SfgError(f"outage process {kind!r} needs a file: write e.g. '{kind}:path={example}'")
    return str(path)


def _flash(*, path: str | None = None, rule: str = "strict", rounds: int = 300,
           round_minutes: int = 10, min_availability: float = 0.05,
           ignore_unknown: bool = False, replace: bool = False,
           screen: str = "either") -> TraceProcess:
    path = _need_path("flash", path, "../shared/data/flash/flash_state_traces_subset.json")
    trace = load_trace("flash", path, rule=rule, rounds=rounds, round_minutes=round_minutes,
                       min_availability=min_availability, ignore_unknown=ignore_unknown,
                       screen=str(screen))
    return TraceProcess(_name("flash", {"rule": rule, "path": path,
                                        "screen": None if screen == "either" else screen}),
                        trace, bool(replace))


def _stunner(*, path: str | None = None, variant: str = "10min",
             min_availability: float = 0.05, replace: bool = False) -> TraceProcess:
    path = _need_path("stunner", path, "../shared/data/stunner/peersim_session_100.txt")
    trace = load_trace("stunner", path, variant=str(variant),
                       min_availability=min_availability)
    return TraceProcess(_name("stunner", {"variant": variant, "path": path}), trace,
                        bool(replace))


def _tabular(*, path: str | None = None, round_minutes: float = 10, rounds: int = 0,
             origin: str = "", min_availability: float = 0.0,
             replace: bool = False) -> TraceProcess:
    path = _need_path("trace", path, "my_fleet.csv")
    trace = load_trace("tabular", path, round_minutes=round_minutes, rounds=rounds or None,
                       origin=origin or None, min_availability=min_availability)
    return TraceProcess(_name("trace", {"path": path}), trace, bool(replace))


PROCESSES.register(
    "flash", _flash,
    params={"path": None, "rule": "strict", "rounds": 300, "round_minutes": 10,
            "min_availability": 0.05, "ignore_unknown": False, "replace": False,
            "screen": "either"},
    doc="FLASH smartphone state trace (docs/concepts/traces.md#real-availability-traces): rule=strict|relaxed, "
        "screen=either|last-event|display|lock, 300 x 10-min rounds",
    tags=("trace",),
)
PROCESSES.register(
    "stunner", _stunner,
    params={"path": None, "variant": "10min", "min_availability": 0.05, "replace": False},
    doc="STUNner-derived session trace (docs/concepts/traces.md#real-availability-traces): variant=10min (50 h) | 6day (30-min rounds)",
    tags=("trace",),
)
PROCESSES.register(
    "trace", _tabular,
    params={"path": None, "round_minutes": 10, "rounds": 0, "origin": "",
            "min_availability": 0.0, "replace": False},
    doc="a user trace file: CSV/Parquet device,start,end[,available] or device,round,available",
    tags=("trace",),
)
