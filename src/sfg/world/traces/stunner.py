"""STUNner-derived online/offline session traces -> availability (docs/concepts/traces.md#real-availability-traces, STUNner).

Input: the Gossip Learning Framework's ``peersim_session_*.txt`` files, one line per window::

    <user-id> <firstOnline 0/1> <window start, epoch ms UTC> <timezone offset h> <d1> <d2> ...

``d_i`` are consecutive session lengths in ms, alternating online/offline (the first is online
iff firstOnline = 1); they sum to the window length. The online rule (plugged in AND WiFi, in
the original STUNner study) was already applied when these files were made, so here a session
is simply online or offline; measurement coverage is complete by construction.

Validation (each failure is an :class:`SfgError` naming the file and line): at least one
duration; firstOnline is 0 or 1; the start is a non-negative integer; the offset is a number of
hours in [-14, 14]; durations are non-negative integers with a positive sum; and since the
format has no explicit window length, the sum is checked against the user's *next* window:
a line whose durations run past the start of that user's next line is rejected.

Pipeline:

1. A user's lines are sorted by start; contiguous lines (next start == previous start + sum)
   are joined into one timeline (the files cut each user's 2014 trace into weekly lines, so a
   50-hour or six-day window may span two lines). A gap starts a new timeline.
2. Candidate windows start at every local midnight (UTC + the line's offset) inside a
   timeline, earliest first, and must fit in it.
3. Per minute (aligned to the local midnight): online when online for at least half of it
   (>= 30 s); per round: available when online for at least half of its minutes.
4. Each user contributes its first window with availability >= ``min_availability`` (5 %).

Variants: ``10min`` = 300 rounds of 10 minutes (50 h); ``6day`` = 300 rounds of 30 minutes
(150 h, the "six-day" variant).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sfg.errors import SfgError
from sfg.util.components import did_you_mean
from sfg.util.safety import check_cells, read_text
from sfg.world.traces.base import (
    Trace,
    existing_file,
    fraction,
    minutes_to_rounds,
    positive_int,
    whole_minutes,
)

VARIANTS: dict[str, tuple[int, int]] = {"10min": (300, 10), "6day": (300, 30)}
_DAY_MS = 86_400_000
_MIN_MS = 60_000
# a window start before 2100 and durations of at most ten years (in ms): anything else is a
# wrong clock, and these bounds keep every sum far inside int64
_MAX_START_MS = 4_102_444_800_000
_MAX_SPAN_MS = 10 * 366 * _DAY_MS
_FORMAT = "'<user-id> <firstOnline 0/1> <start epoch ms> <tz offset h> <d1> <d2> ...'"


@dataclass(frozen=True, eq=False)
class SessionLine:
    """One parsed line: user, first session online?, start (UTC ms), offset (ms), durations."""

    user: str
    first_online: bool
    start_ms: int
    tz_ms: int
    durations: np.ndarray  # int64[K] ms
    lineno: int

    @property
    def end_ms(self) -> int:
        return self.start_ms + int(self.durations.sum())

    def online_ms(self) -> int:
        return int(self.durations[0 if self.first_online else 1::2].sum())


@dataclass(frozen=True, eq=False)
class Sessions:
    """All lines of a session file, grouped per user in order of first appearance."""

    users: list[str]
    lines: dict[str, list[SessionLine]]
    path: str


def _err(path: Path, lineno: int, what: str) -> SfgError:
    return SfgError(f"STUNner session file {path}, line {lineno}: {what}")


def _parse_line(path: Path, lineno: int, line: str) -> SessionLine:
    p = line.split()
    if len(p) < 5:
        raise _err(path, lineno, f"expected {_FORMAT} with at least one duration, "
                                 f"got {len(p)} field(s)")
    if p[1] not in ("0", "1"):
        raise _err(path, lineno, f"firstOnline must be 0 or 1, got {p[1]!r}")
    try:
        start = int(p[2])
    except ValueError:
        raise _err(path, lineno, f"window start must be epoch milliseconds, got {p[2]!r}") from None
    if not 0 <= start <= _MAX_START_MS:
        raise _err(path, lineno, f"window start must be epoch milliseconds between 0 and "
                                 f"{_MAX_START_MS} (the year 2100), got {p[2][:40]}")
    try:
        tz = float(p[3])
    except ValueError:
        raise _err(path, lineno, f"timezone offset must be a number of hours, got {p[3]!r}") from None
    if not -14.0 <= tz <= 14.0:
        raise _err(path, lineno, f"timezone offset must be within [-14, 14] hours, got {p[3]!r}")
    try:
        dur = np.asarray(p[4:]).astype(np.int64)
    except (ValueError, OverflowError):
        for j, tok in enumerate(p[4:], 1):
            try:
                int(tok)
            except ValueError:
                raise _err(path, lineno, f"duration {j} is not an integer number of ms: "
                                         f"{tok[:40]!r}") from None
            if not -_MAX_SPAN_MS <= int(tok) <= _MAX_SPAN_MS:
                raise _err(path, lineno, f"duration {j} ({tok[:40]} ms) is longer than ten "
                                         "years; check the line") from None
        raise  # pragma: no cover
    if (dur < 0).any():
        j = int(np.flatnonzero(dur < 0)[0]) + 1
        raise _err(path, lineno, f"duration {j} is negative ({dur[j - 1]} ms)")
    if (dur > _MAX_SPAN_MS).any():
        j = int(np.flatnonzero(dur > _MAX_SPAN_MS)[0]) + 1
        raise _err(path, lineno, f"duration {j} ({dur[j - 1]} ms) is longer than ten years; "
                                 "check the line")
    # each duration <= ten years, so the sum of up to 2**25 of them cannot wrap around int64
    total = int(dur.sum()) if len(dur) < (1 << 25) else sum(int(d) for d in dur)
    if total <= 0:
        raise _err(path, lineno, "durations sum to 0 ms; a window must have positive length")
    if total > _MAX_SPAN_MS:
        raise _err(path, lineno, f"durations sum to {total} ms, more than ten years; check "
                                 "the line")
    return SessionLine(user=p[0], first_online=p[1] == "1", start_ms=start,
                       tz_ms=int(round(tz * 3_600_000)), durations=dur, lineno=lineno)


def parse_sessions(path: str | Path) -> Sessions:
    """Parse and validate a STUNner session file (docs/concepts/traces.md#real-availability-traces)."""
    p = existing_file(path, "STUNner session",
                      " (e.g. ../shared/data/stunner/peersim_session_100.txt)")
    lines: dict[str, list[SessionLine]] = {}
    # parsed lines (Python objects and small arrays): ~16 bytes of memory per byte of file
    text = read_text(p, "STUNner session file", bytes_per_byte=16)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        s = _parse_line(p, lineno, line)
        lines.setdefault(s.user, []).append(s)
    if not lines:
        raise SfgError(f"STUNner session file {p} has no session lines; expected {_FORMAT}")
    for user_lines in lines.values():
        user_lines.sort(key=lambda s: s.start_ms)
        for a, b in zip(user_lines, user_lines[1:], strict=False):
            if a.end_ms > b.start_ms:
                raise _err(p, a.lineno, (
                    f"durations sum to {int(a.durations.sum())} ms, running "
                    f"{a.end_ms - b.start_ms} ms past the start of user {a.user!r}'s next window "
                    f"(line {b.lineno}); the durations must sum to the window length"))
    return Sessions(users=list(lines), lines=lines, path=str(p))


@dataclass(frozen=True, eq=False)
class _Timeline:
    """Contiguous lines of one user: session boundaries and cumulative online time."""

    start_ms: int
    end_ms: int
    bounds: np.ndarray  # float64[K+1] ms relative to start_ms
    online_cum: np.ndarray  # float64[K+1] online ms up to each bound
    midnights: np.ndarray  # int64 candidate local midnights (absolute UTC ms), ascending
    tz_ms: np.ndarray  # int64 offset in force at each candidate


def _timelines(lines: list[SessionLine]) -> list[_Timeline]:
    groups: list[list[SessionLine]] = []
    for s in lines:
        if groups and groups[-1][-1].end_ms == s.start_ms:
            groups[-1].append(s)
        else:
            groups.append([s])
    out = []
    for g in groups:
        span = g[-1].end_ms - g[0].start_ms
        if span > _MAX_SPAN_MS:
            raise SfgError(f"STUNner user {g[0].user!r}: contiguous lines from line "
                           f"{g[0].lineno} span {span / _DAY_MS:.0f} days, more than ten years; "
                           "check the window starts and durations")
        dur = np.concatenate([s.durations for s in g])
        online = np.concatenate([
            (np.arange(len(s.durations)) % 2 == (0 if s.first_online else 1)) for s in g])
        bounds = np.concatenate([[0], np.cumsum(dur)]).astype(np.float64)
        online_cum = np.concatenate([[0], np.cumsum(np.where(online, dur, 0))]).astype(np.float64)
        mids, tzs = [], []
        for s in g:
            first = s.start_ms + (-(s.start_ms + s.tz_ms)) % _DAY_MS
            m = np.arange(first, s.end_ms, _DAY_MS, dtype=np.int64)
            mids.append(m)
            tzs.append(np.full(len(m), s.tz_ms, np.int64))
        out.append(_Timeline(g[0].start_ms, g[-1].end_ms, bounds, online_cum,
                             np.concatenate(mids), np.concatenate(tzs)))
    return out


def _window(tl: _Timeline, t0: int, rounds: int, rm: int) -> np.ndarray:
    """bool[rounds] availability of the window starting at absolute ``t0`` (UTC ms)."""
    edges = (t0 - tl.start_ms) + np.arange(rounds * rm + 1, dtype=np.float64) * _MIN_MS
    online = np.diff(np.interp(edges, tl.bounds, tl.online_cum))  # online ms per minute
    per_minute = (2 * online >= _MIN_MS)[None, :]
    return minutes_to_rounds(per_minute, rm)[0]


def _promising(tl: _Timeline, fit: np.ndarray, W_ms: int, min_online_ms: float
               ) -> Iterator[tuple[int, int]]:
    """(start, offset) of the fitting windows online long enough to qualify, earliest first.

    A round is available only when at least half of its minutes are online, and a minute only
    when online for at least 30 s, so a window with ``need`` available rounds holds at least
    ``need * ceil(rm / 2) * 30 s`` online. Windows with less (computed for all candidates at
    once from the cumulative online time) cannot qualify and are skipped without building
    them: a user that is never online over ten years costs one vectorised pass, not 3,650
    windows.
    """
    t0 = tl.midnights[fit]
    rel = (t0 - tl.start_ms).astype(np.float64)
    online = (np.interp(rel + W_ms, tl.bounds, tl.online_cum)
              - np.interp(rel, tl.bounds, tl.online_cum))
    keep = online >= min_online_ms - 1.0  # 1 ms of slack for rounding: never skip a window
    return zip(t0[keep].tolist(), tl.tz_ms[fit][keep].tolist(), strict=True)


def _params(variant: str, rounds: int | None, round_minutes: int | None,
            min_availability: float) -> tuple[int, int, float, int, int]:
    """(rounds, round_minutes, min_availability, rounds needed, window ms), validated."""
    if variant not in VARIANTS:
        raise SfgError(f"unknown STUNner variant {variant!r}{did_you_mean(str(variant), VARIANTS)}")
    dr, drm = VARIANTS[variant]
    rounds = positive_int(dr if rounds is None else rounds, "rounds")
    rm = whole_minutes(drm if round_minutes is None else round_minutes, "round_minutes")
    min_av = fraction(min_availability, "min_availability")
    need = int(np.ceil(min_av * rounds - 1e-9))
    W_ms = rounds * rm * _MIN_MS
    # per window: float64 minute edges, interpolated online time and the per-minute rule
    check_cells(rounds * rm + 1, 1, 25, f"a STUNner window of {rounds} rounds of {rm} min",
                rows_name="minutes", cols_name="window", fix="lower rounds or round_minutes")
    return rounds, rm, min_av, need, W_ms


def _first_window(lines: list[SessionLine], rounds: int, rm: int, need: int, W_ms: int
                  ) -> tuple[tuple[np.ndarray, int, int, _Timeline] | None, bool]:
    """((availability, start ms, offset ms, timeline) of a user's first qualifying window, or
    None; whether any window fits at all)."""
    fits = False
    for tl in _timelines(lines):
        fit = tl.midnights + W_ms <= tl.end_ms  # a prefix: the midnights ascend
        fits = fits or bool(fit.any())
        for t0, tz in _promising(tl, fit, W_ms, need * ((rm + 1) // 2) * _MIN_MS / 2):
            a = _window(tl, t0, rounds, rm)
            if int(a.sum()) >= need:
                return (a, t0, tz, tl), fits
    return None, fits


def window_sessions(sessions: Sessions, devices: list[str], *, variant: str = "10min",
                    rounds: int | None = None, round_minutes: int | None = None,
                    min_availability: float = 0.05) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per device: ``(start_ms, end_ms)``, int64 arrays of its online sessions in its window.

    The window is the one :func:`stunner_trace` picks for the user with the same parameters
    (docs/concepts/traces.md#real-availability-traces); times are milliseconds after the window start (a local midnight), at the
    file's native millisecond resolution, clipped to ``[0, rounds * round_minutes minutes]``,
    in time order; sessions of zero length are left out, and sessions that touch (across two
    joined lines, or around an empty offline session) are NOT merged here. ``devices`` are
    user ids of eligible users (those of a :class:`Trace` built from ``sessions``).
    """
    rounds, rm, _, need, W_ms = _params(variant, rounds, round_minutes, min_availability)
    out = []
    for user in devices:
        if user not in sessions.lines:
            raise SfgError(f"STUNner session file {sessions.path} has no user {user!r}")
        found, _ = _first_window(sessions.lines[user], rounds, rm, need, W_ms)
        if found is None:
            raise SfgError(f"STUNner user {user!r} of {sessions.path} has no qualifying "
                           f"window of {rounds} rounds of {rm} min")
        _, t0, _, tl = found
        bounds = tl.bounds.astype(np.int64) - (t0 - tl.start_ms)  # exact: whole ms < 2**53
        online = np.diff(tl.online_cum) > 0
        s = np.clip(bounds[:-1], 0, W_ms)
        e = np.clip(bounds[1:], 0, W_ms)
        keep = online & (e > s)
        out.append((s[keep], e[keep]))
    return out


def stunner_trace(sessions: Sessions, *, variant: str = "10min", rounds: int | None = None,
                  round_minutes: int | None = None, min_availability: float = 0.05) -> Trace:
    """Availability ``bool[rounds, D_eligible]``: each user's first qualifying window (docs/concepts/traces.md#real-availability-traces)."""
    rounds, rm, min_av, need, W_ms = _params(variant, rounds, round_minutes, min_availability)

    cols, devices, start, no_window, low = [], [], [], 0, 0
    total_ms = online_ms = 0
    never = 0
    for user in sessions.users:
        lines = sessions.lines[user]
        u_total = sum(int(s.durations.sum()) for s in lines)
        u_online = sum(s.online_ms() for s in lines)
        total_ms += u_total
        online_ms += u_online
        never += u_online == 0
        found, fits = _first_window(lines, rounds, rm, need, W_ms)
        if found is None:
            no_window += not fits
            low += fits
            continue
        a, t0, tz, _ = found
        cols.append(a)
        devices.append(user)
        start.append(str(np.datetime64(t0 + tz, "ms").astype("datetime64[m]")))
    n = len(sessions.users)
    avail = np.stack(cols, axis=1) if cols else np.zeros((rounds, 0), bool)
    meta = {
        "source": "stunner",
        "path": sessions.path,
        "variant": variant,
        "rounds": rounds,
        "round_minutes": rm,
        "min_availability": min_av,
        "lines": sum(len(v) for v in sessions.lines.values()),
        "devices_total": n,
        "devices_no_window": int(no_window),
        "devices_low_availability": int(low),
        "devices_eligible": len(devices),
        "devices_never": int(never),
        "share_never": float(never / n),
        "online_fraction": float(online_ms / total_ms),
        "minute_rule": "online >= 30 s of the minute; round: >= half its minutes",
    }
    return Trace(available=avail, devices=devices, round_minutes=rm, start=start,
                 day_offset_minutes=np.zeros(len(devices)), meta=meta)


def load_stunner(path: str | Path, *, variant: str = "10min", rounds: int | None = None,
                 round_minutes: int | None = None, min_availability: float = 0.05) -> Trace:
    """Parse a STUNner session file and cut each user's first qualifying window."""
    return stunner_trace(parse_sessions(path), variant=variant, rounds=rounds,
                         round_minutes=round_minutes, min_availability=min_availability)
