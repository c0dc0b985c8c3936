"""Availability in time: each device's online intervals on the virtual clock (docs/concepts/clock.md#the-world-in-time).

docs/concepts/clock.md#the-world-in-time: "Availability is a set of online intervals per device. Interval traces (FLASH
minute states, STUNner sessions, tabular intervals) are used at their own resolution; a
round-based process or trace maps round r to [rΔ, (r+1)Δ). Devices are drawn and mapped to
nodes as in docs/concepts/outages.md#outage-processes."

:class:`Intervals` holds the online intervals of n devices, CSR-packed (``indptr``, ``start``,
``end``; per device sorted, disjoint and merged, so that an interval's end is always an
offline instant), in seconds of virtual time over ``[0, horizon)``; time at or past the
horizon is offline. Its queries are vectorised over arrays of (device, time) pairs with
``np.searchsorted`` on the packed arrays: no Python loop over queries.

:func:`make_intervals` gives the N nodes of a run their intervals together with the
round-based availability that ``sfg run`` uses (unchanged), for every outage process:

* synthetic (round-based) processes and per-round tabular traces: :meth:`Intervals.from_rounds`
  of the round-based availability;
* ``flash``: the rule (strict/relaxed, under the screen reading) per minute over the window
  ``flash_trace`` cuts for the device (docs/concepts/traces.md#real-availability-traces), minute m as ``[60m, 60(m+1))`` seconds after
  the window start, adjacent minutes merged;
* ``stunner``: the online sessions of the window ``stunner_trace`` picks, at the file's own
  millisecond times;
* ``trace`` (tabular, interval form): the file's online periods at their own times, relative
  to the origin of round 0 and clipped to the rounds ``load_tabular`` cuts.

Native-resolution traces need ``round_seconds`` equal to the trace's round length (600 s for
the 10-minute rounds of docs/concepts/traces.md#real-availability-traces), since their intervals are in real seconds: a different Δ would
put round r of the round-based availability somewhere else than its minutes.

**Agreement with the round-based pipelines** (tested on the real files):
``to_rounds(Δ, T)`` applies the rule of docs/concepts/traces.md#real-availability-traces "available when online for at least half of the
round" to the exact online seconds. For FLASH and tabular traces that is exactly the matrix
``sfg run`` samples (FLASH counts whole minutes, 5 of 10 suffice; tabular measures the
overlap exactly, as here). STUNner's round pipeline first rounds each minute to online or
offline (online for >= 30 s of it) and then counts minutes, so a round that holds sub-minute
sessions can come out differently from its exact online time: the two agree on every round
whose minutes are each wholly online or wholly offline, and on a round with p partly-online
minutes they can differ only when its exact online time lies within 30·p seconds of Δ/2
(the rounding moves each such minute by at most 30 s). On ``peersim_session_100.txt`` they
agree on more than 99 % of the device-rounds (tests/test_timeline.py). The native sessions
are the faithful reading of docs/concepts/clock.md#the-world-in-time ("STUNner sessions ... at their own resolution"); the
per-minute rounding is an artefact of cutting rounds, not part of the trace.

**STUNner's 45-minute staleness rule** (docs/concepts/traces.md#real-availability-traces) applies to forward-filling raw
measurements. The session files (``peersim_session_*.txt``) carry derived online/offline
sessions that cover every window completely, with no measurement times, so there is nothing
to forward-fill: the sessions are used as they are, as the round pipeline does (cutting
online sessions at 45 minutes would contradict it on the 23 % of online sessions longer than
that, e.g. a phone charging overnight on WiFi).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.util.components import Component, parse_component
from sfg.util.safety import check_cells, check_memory

__all__ = ["Intervals", "make_intervals"]

# to_rounds: a round is available when 2 * online >= Δ (1 - _TOL); the tolerance (6e-8 s of
# a 600-s round, the 1e-9 minute of the tabular pipeline) absorbs float rounding of sums
_TOL = 1e-10
# queries at or above which a batch is searched compiled, per device (sfg.world.locate)
LOCATE_COMPILED = 50_000


def _seconds(value: Any, what: str = "round_seconds") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SfgError(f"{what} must be a positive number of seconds, got {value!r}")
    v = float(value)
    if not 0.0 < v < float("inf"):
        raise SfgError(f"{what} must be a positive finite number of seconds, got {value!r}")
    return v


def _rounds_count(value: Any, what: str = "T (number of rounds)") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SfgError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _frozen(x: Any, dtype: type, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise SfgError(f"Intervals.{what} must be a 1-D array, got shape {a.shape}")
    if a.dtype != dtype or a.flags.writeable or not a.flags.c_contiguous:
        if dtype is np.int64 and a.size and a.dtype.kind not in "iu":
            raise SfgError(f"Intervals.{what} must hold integers, got {a.dtype}")
        a = np.array(a, dtype=dtype)  # a copy that nobody else can write
        a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Intervals:
    """Online intervals of n devices, in seconds of virtual time, CSR-packed (docs/concepts/clock.md#the-world-in-time).

    indptr: int64[n+1]   device d's intervals are ``start[indptr[d]:indptr[d+1]]`` (and end)
    start, end: float64[K]  per device sorted, disjoint and merged (``end[k] < start[k+1]``),
                         ``0 <= start < end <= horizon``; an interval is half-open [start, end)
    horizon: float       the seconds covered; time at or beyond it counts as offline

    Arrays are read-only. Compare two instances with :meth:`equals` (``==`` is identity).
    """

    n: int
    indptr: np.ndarray
    start: np.ndarray
    end: np.ndarray
    horizon: float

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, (int, np.integer)) or self.n < 0:
            raise SfgError(f"Intervals.n must be a non-negative integer, got {self.n!r}")
        n = int(self.n)
        object.__setattr__(self, "n", n)
        try:
            h = float(self.horizon)
        except (TypeError, ValueError):
            raise SfgError(f"Intervals.horizon must be a number of seconds, "
                           f"got {self.horizon!r}") from None
        if not 0.0 <= h < float("inf"):
            raise SfgError(f"Intervals.horizon must be finite and >= 0 seconds, got {h!r}")
        object.__setattr__(self, "horizon", h)
        ip = _frozen(self.indptr, np.int64, "indptr")
        s = _frozen(self.start, np.float64, "start")
        e = _frozen(self.end, np.float64, "end")
        K = s.size
        if ip.size != n + 1 or ip[0] != 0 or ip[-1] != K or (np.diff(ip) < 0).any():
            raise SfgError(f"Intervals.indptr must be non-decreasing from 0 to {K} (the number "
                           f"of intervals) with n + 1 = {n + 1} entries")
        if e.size != K:
            raise SfgError(f"Intervals.start has {K} entries but end has {e.size}")
        if K:
            if not (np.isfinite(s).all() and np.isfinite(e).all()):
                raise SfgError("Intervals.start and end must be finite seconds")
            if not (s < e).all():
                k = int(np.flatnonzero(~(s < e))[0])
                raise SfgError(f"interval {k} is empty or reversed ([{s[k]}, {e[k]})); each "
                               "interval needs start < end")
            if s.min() < 0 or e.max() > h:
                raise SfgError(f"intervals must lie within [0, horizon={h:g}] seconds, got "
                               f"[{s.min():g}, {e.max():g}]")
            same = np.ones(K - 1, bool)
            same[ip[1:-1][(ip[1:-1] > 0) & (ip[1:-1] < K)] - 1] = False  # device boundaries
            bad = same & ~(s[1:] > e[:-1])
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise SfgError(f"intervals {k} and {k + 1} of one device overlap, touch or are "
                               "out of order; per device they must be sorted, disjoint and "
                               "merged")
        object.__setattr__(self, "indptr", ip)
        object.__setattr__(self, "start", s)
        object.__setattr__(self, "end", e)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_rounds(cls, available: np.ndarray, round_seconds: float) -> Intervals:
        """Round r of ``available: bool[T, N]`` as ``[rΔ, (r+1)Δ)``, adjacent rounds merged;
        horizon TΔ (docs/concepts/clock.md#the-world-in-time, "a round-based process or trace")."""
        a = np.asarray(available)
        if a.ndim != 2:
            raise SfgError(f"availability must be a bool[T, N] matrix, got shape {a.shape}")
        if a.dtype != np.bool_:
            if a.dtype.kind not in "iu" or (a.size and not np.isin(a, (0, 1)).all()):
                raise SfgError(f"availability must be a bool[T, N] matrix (or 0/1), got {a.dtype}")
            a = a.astype(bool)
        d = _seconds(round_seconds)
        T, N = a.shape
        check_cells(T + 2, N, 10, "the availability's intervals", cols_name="clients")
        pad = np.zeros((N, T + 2), np.int8)
        pad[:, 1:-1] = a.T
        step = np.diff(pad, axis=1)
        sd, sr = np.nonzero(step == 1)  # row-major: by device, then round
        _, er = np.nonzero(step == -1)
        indptr = np.zeros(N + 1, np.int64)
        np.cumsum(np.bincount(sd, minlength=N), out=indptr[1:])
        return cls(N, indptr, sr * d, er * d, T * d)

    @classmethod
    def from_pairs(cls, n: int, dev: np.ndarray, start: np.ndarray, end: np.ndarray,
                   horizon: float) -> Intervals:
        """The union of online periods ``[start[k], end[k])`` of devices ``dev[k]``, in any
        order, clipped to ``[0, horizon)``; overlapping and touching periods are merged."""
        dev = np.asarray(dev).reshape(-1)
        s = np.asarray(start, np.float64).reshape(-1)
        e = np.asarray(end, np.float64).reshape(-1)
        if not dev.size == s.size == e.size:
            raise SfgError(f"from_pairs needs as many devices ({dev.size}) as starts "
                           f"({s.size}) and ends ({e.size})")
        if dev.size and (dev.dtype.kind not in "iu" or dev.min() < 0 or dev.max() >= n):
            raise SfgError(f"from_pairs: devices must be integers in 0..{n - 1}")
        if np.isnan(s).any() or np.isnan(e).any():
            raise SfgError("from_pairs: start and end must not be NaN")
        h = float(horizon)
        s, e = np.clip(s, 0.0, h), np.clip(e, 0.0, h)
        keep = e > s
        dev, s, e = dev[keep].astype(np.int64), s[keep], e[keep]
        order = np.lexsort((s, dev))
        dev, s, e = dev[order], s[order], e[order]
        if s.size:
            # per-device running maximum of the ends, exact: on ranks offset by device
            vals = np.unique(e)
            V = vals.size
            key = dev * V + np.searchsorted(vals, e)
            run = vals[np.maximum.accumulate(key) - dev * V]
            new = np.ones(s.size, bool)
            new[1:] = (dev[1:] != dev[:-1]) | (s[1:] > run[:-1])
            first = np.flatnonzero(new)
            last = np.append(first[1:] - 1, s.size - 1)
            dev, s, e = dev[first], s[first], run[last]
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(dev, minlength=n), out=indptr[1:])
        return cls(n, indptr, s, e, h)

    # ------------------------------------------------------------------ queries
    @property
    def counts(self) -> np.ndarray:
        """int64[n]: the number of intervals of each device."""
        return np.diff(self.indptr)

    @cached_property
    def _search(self) -> tuple[np.ndarray, np.ndarray]:
        # distinct start times B, and per interval an exact int64 key that sorts the CSR
        # arrays globally: device * (|B| + 1) + (rank of its start in B) + 1
        B = np.unique(self.start)
        dev = np.repeat(np.arange(self.n, dtype=np.int64), self.counts)
        keys = dev * (B.size + 1) + np.searchsorted(B, self.start) + 1
        return B, keys

    def _queries(self, dev: Any, *times: Any) -> tuple[np.ndarray, ...]:
        d = np.asarray(dev)
        if d.dtype.kind not in "iu":
            if d.size == 0:
                d = d.astype(np.int64)
            else:
                raise SfgError(f"devices must be integer indices, got {d.dtype}")
        ts = [np.asarray(t, dtype=np.float64) for t in times]
        d, *ts = np.broadcast_arrays(d, *ts)
        if d.size and (d.min() < 0 or d.max() >= self.n):
            bad = d[(d < 0) | (d >= self.n)].reshape(-1)[0]
            raise SfgError(f"device index {bad} is out of range; there are {self.n} devices "
                           f"(0..{self.n - 1})")
        for t in ts:
            if np.isnan(t).any():
                raise SfgError("query times must not be NaN")
        return (d.astype(np.int64, copy=False), *ts)

    def _locate(self, d: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(j, on): j the global index of d's last interval starting at or before t (or
        indptr[d] - 1 when none does); on whether t lies inside it."""
        lo = self.indptr[d]
        if self.start.size == 0:
            return lo - 1, np.zeros(d.shape, bool)
        if d.size >= LOCATE_COMPILED:  # many queries: compiled, per device (the same answers)
            from sfg.world.locate import locate

            j, on = np.empty(d.shape, np.int64), np.empty(d.shape, bool)
            locate(self.indptr, self.start, self.end, d.reshape(-1), t.reshape(-1),
                   j.reshape(-1), on.reshape(-1))
            return j, on
        B, keys = self._search
        q = np.searchsorted(B, t, side="right")  # distinct starts <= t
        j = np.searchsorted(keys, d * (B.size + 1) + q, side="right") - 1
        valid = j >= lo
        on = valid & (t < self.end[np.where(valid, j, 0)])
        return j, on

    def online_at(self, dev: Any, t: Any) -> np.ndarray:
        """bool: device ``dev`` is online at time ``t`` (inside some [start, end)); vectorised
        (broadcasting ``dev`` and ``t``)."""
        d, t = self._queries(dev, t)
        return self._locate(d, t)[1]

    def online_through(self, dev: Any, t0: Any, t1: Any) -> np.ndarray:
        """bool: online during all of [t0, t1) (t1 >= t0); with t1 == t0 it is
        :meth:`online_at` (t0)."""
        d, t0, t1 = self._queries(dev, t0, t1)
        if (t1 < t0).any():
            k = int(np.flatnonzero((t1 < t0).reshape(-1))[0])
            raise SfgError(f"online_through needs t1 >= t0, got t0={t0.reshape(-1)[k]!r} > "
                           f"t1={t1.reshape(-1)[k]!r}")
        j, on = self._locate(d, t0)
        if not self.start.size:
            return on
        return on & (t1 <= self.end[np.where(on, j, 0)])

    def next_on(self, dev: Any, t: Any) -> np.ndarray:
        """float64: the earliest time >= t at which ``dev`` is online (t itself when online at
        t; ``np.inf`` when it never is again)."""
        d, t = self._queries(dev, t)
        j, on = self._locate(d, t)
        nxt = j + 1
        has = nxt < self.indptr[d + 1]
        if not self.start.size:
            return np.where(on, t, np.inf)
        later = np.where(has, self.start[np.where(has, nxt, 0)], np.inf)
        return np.where(on, t, later)

    def next_off(self, dev: Any, t: Any) -> np.ndarray:
        """float64: the earliest time >= t at which ``dev`` is offline (t itself when offline
        at t; an interval's end otherwise, at the latest the horizon)."""
        d, t = self._queries(dev, t)
        j, on = self._locate(d, t)
        if not self.start.size:
            return t.copy()
        return np.where(on, self.end[np.where(on, j, 0)], t)

    # ------------------------------------------------------------------ summaries
    def online_seconds(self) -> np.ndarray:
        """float64[n]: each device's online seconds."""
        dev = np.repeat(np.arange(self.n), self.counts)
        return np.bincount(dev, weights=self.end - self.start, minlength=self.n)

    def to_rounds(self, round_seconds: float, T: int) -> np.ndarray:
        """bool[T, n]: round r = [rΔ, (r+1)Δ) is available when the device is online for at
        least half of it (2·online >= Δ, the rule of docs/concepts/traces.md#real-availability-traces, measured exactly); rounds past the
        horizon are offline. Inverse of :meth:`from_rounds`."""
        d = _seconds(round_seconds)
        T = _rounds_count(T)
        n = self.n
        check_cells(T, n, 17, "the round availability of these intervals", cols_name="devices",
                    fix="ask for fewer rounds")
        dev = np.repeat(np.arange(n, dtype=np.int64), self.counts)
        s, e = np.clip(self.start, 0.0, T * d), np.clip(self.end, 0.0, T * d)
        keep = e > s
        dev, s, e = dev[keep], s[keep], e[keep]
        r0 = np.floor(s / d).astype(np.int64)
        r1 = np.minimum(np.ceil(e / d).astype(np.int64), T)  # exclusive
        m = np.maximum(r1 - r0, 0)
        total = int(m.sum())
        check_memory(40.0 * total, f"these intervals cover {total:,} device-rounds",
                     fix="ask for fewer rounds or a longer round_seconds")
        rep = np.repeat(np.arange(m.size), m)
        rr = r0[rep] + (np.arange(total) - np.repeat(np.cumsum(m) - m, m))
        overlap = np.minimum(e[rep], (rr + 1) * d) - np.maximum(s[rep], rr * d)
        cover = np.bincount(dev[rep] * T + rr, weights=overlap, minlength=n * T)
        return np.ascontiguousarray((2.0 * cover >= d * (1.0 - _TOL)).reshape(n, T).T)

    # ------------------------------------------------------------------ reshaping
    def take(self, idx: Any) -> Intervals:
        """The intervals of devices ``idx`` (int array; reorders, selects, may repeat): device
        k of the result is device ``idx[k]`` of this one (e.g. drawn devices onto nodes)."""
        i = np.asarray(idx)
        if i.ndim != 1 or (i.size and i.dtype.kind not in "iu"):
            raise SfgError(f"take needs a 1-D array of integer device indices, got "
                           f"{i.dtype} of shape {i.shape}")
        i = i.astype(np.int64)
        if i.size and (i.min() < 0 or i.max() >= self.n):
            raise SfgError(f"take: device indices must lie in 0..{self.n - 1}, got "
                           f"{int(i.min())}..{int(i.max())}")
        c = self.counts[i]
        indptr = np.zeros(i.size + 1, np.int64)
        np.cumsum(c, out=indptr[1:])
        pos = np.repeat(self.indptr[i] - indptr[:-1], c) + np.arange(int(indptr[-1]))
        return Intervals(int(i.size), indptr, self.start[pos], self.end[pos], self.horizon)

    def clip(self, horizon: float) -> Intervals:
        """The same intervals cut at ``horizon`` (<= this horizon), e.g. the first T rounds."""
        h = float(horizon)
        if not 0.0 <= h <= self.horizon:
            raise SfgError(f"clip: horizon must lie in [0, {self.horizon:g}] seconds, got {horizon!r}")
        keep = self.start < h
        dev = np.repeat(np.arange(self.n, dtype=np.int64), self.counts)[keep]
        indptr = np.zeros(self.n + 1, np.int64)
        np.cumsum(np.bincount(dev, minlength=self.n), out=indptr[1:])
        return Intervals(self.n, indptr, self.start[keep], np.minimum(self.end[keep], h), h)

    def equals(self, other: Intervals) -> bool:
        """The same devices, intervals and horizon."""
        return (self.n == other.n and self.horizon == other.horizon
                and np.array_equal(self.indptr, other.indptr)
                and np.array_equal(self.start, other.start)
                and np.array_equal(self.end, other.end))


# ---------------------------------------------------------------------------------- processes
def make_intervals(process: str | Component, T: int, N: int, *, seed: int,
                   positions: np.ndarray | None = None,
                   round_seconds: float = 600.0) -> tuple[Intervals, np.ndarray]:
    """``(intervals, available)`` of the N nodes over ``[0, T·round_seconds)`` (docs/concepts/clock.md#the-world-in-time).

    ``available`` is ``make_process(process).sample(T, N, seed=seed, positions=positions)``,
    the round-based bool[T, N] that ``sfg run`` uses, returned unchanged. ``intervals`` are
    the same devices on the same nodes (a trace's devices drawn for ``seed`` exactly as that
    sample draws them), at the trace's own resolution for FLASH, STUNner and interval-form
    tabular traces, and :meth:`Intervals.from_rounds` of ``available`` otherwise (module
    docstring). Native-resolution traces need ``round_seconds`` = their round length.
    """
    from sfg.world.outages import make_process
    from sfg.world.traces.process import TraceProcess

    d = _seconds(round_seconds)
    T = _rounds_count(T)
    proc = make_process(process)
    available = proc.sample(T, N, seed=seed, positions=positions)
    if not isinstance(proc, TraceProcess):
        return Intervals.from_rounds(available, d), available
    comp = (process if isinstance(process, Component)
            else parse_component(process, kind="outage process"))
    trace = proc.trace
    cols = proc.draw(N, seed=seed)  # the draw sample() made
    uniq, inv = np.unique(cols, return_inverse=True)
    devices = [trace.devices[int(k)] for k in uniq]
    native = _native(comp.name, comp.params, trace, devices, d)
    if native is None:
        return Intervals.from_rounds(available, d), available
    return native.take(inv.reshape(-1)).clip(T * d), available


def _same_round(trace: Any, d: float) -> None:
    rs = float(trace.round_minutes) * 60.0
    if abs(rs - d) > 1e-9 * max(rs, d):
        src = trace.meta.get("source", "trace")
        raise SfgError(
            f"the {src} trace has rounds of {trace.round_minutes:g} min = {rs:g} s but "
            f"round_seconds={d:g}; its intervals are in real seconds, so set round_seconds="
            f"{rs:g} (or build the trace with {trace.round_minutes:g}-minute rounds changed "
            "to match)")


def _native(name: str, params: dict[str, Any], trace: Any, devices: list[str],
            d: float) -> Intervals | None:
    """Intervals of ``devices`` (ids of ``trace``) at the trace's own resolution, or None
    when its rounds are its resolution."""
    from sfg.world.outages.registry import PROCESSES
    from sfg.world.traces.flash import FlashStates, window_minutes
    from sfg.world.traces.process import load_parsed
    from sfg.world.traces.stunner import Sessions, window_sessions
    from sfg.world.traces.tabular import tabular_intervals

    m = trace.meta
    source = m.get("source")
    p = PROCESSES.check_params(name, params)
    n = len(devices)
    if source == "flash":
        _same_round(trace, d)
        states = load_parsed("flash", m["path"], ignore_unknown=bool(p["ignore_unknown"]))
        assert isinstance(states, FlashStates)
        minutes = window_minutes(states, devices, rule=m["rule"], rounds=m["rounds"],
                                 round_minutes=m["round_minutes"], screen=m["screen"])
        return Intervals.from_rounds(minutes.T, 60.0)
    if source == "stunner":
        _same_round(trace, d)
        sessions = load_parsed("stunner", m["path"])
        assert isinstance(sessions, Sessions)
        per = window_sessions(sessions, devices, variant=m["variant"], rounds=m["rounds"],
                              round_minutes=m["round_minutes"],
                              min_availability=m["min_availability"])
        dev = np.repeat(np.arange(n), [len(s) for s, _ in per])
        s_ms = np.concatenate([s for s, _ in per]) if per else np.zeros(0, np.int64)
        e_ms = np.concatenate([e for _, e in per]) if per else np.zeros(0, np.int64)
        W_s = m["rounds"] * m["round_minutes"] * 60.0
        return Intervals.from_pairs(n, dev, s_ms / 1000.0, e_ms / 1000.0, W_s)
    if source == "tabular" and m.get("form") == "intervals":
        _same_round(trace, d)
        got = tabular_intervals(m["path"], round_minutes=p["round_minutes"],
                                rounds=p["rounds"] or None, origin=p["origin"] or None)
        assert got is not None
        ids, dev, s_min, e_min, T_file = got
        where = {x: i for i, x in enumerate(ids)}
        pick = np.full(len(ids), -1, np.int64)
        pick[[where[x] for x in devices]] = np.arange(n)
        node = pick[dev]
        sel = node >= 0
        return Intervals.from_pairs(n, node[sel], s_min[sel] * 60.0, e_min[sel] * 60.0,
                                    T_file * float(trace.round_minutes) * 60.0)
    return None
