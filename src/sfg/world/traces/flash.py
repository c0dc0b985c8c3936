"""FLASH smartphone state traces -> availability (docs/concepts/traces.md#real-availability-traces, FLASH).

Input: FLASH's ``state_traces.json`` (Yang et al., WWW 2021): one JSON object
``{key: {"guid": ..., "model": ..., "messages": "..."}}`` where ``messages`` holds
newline-separated ``YYYY-MM-DD HH:MM:SS \\t<event>`` lines in the phone's local time, mostly but
not strictly sorted. Events:

* screen: ``screen_on`` / ``screen_off`` (display) and ``screen_lock`` / ``screen_unlock`` (lock)
* charging: ``battery_charged_on`` / ``battery_charged_off``
* network: ``wifi`` (WiFi) or ``2G`` / ``3G`` / ``4G`` / ``5G`` / ``Unknown`` (not WiFi)
* battery level such as ``87.0%`` (parsed and validated, not used by the rules)

Pipeline (all vectorised over events and minutes, no per-minute Python loop):

1. Parse every line, sort each device's events by time (stable: equal times keep file order).
2. Forward-fill three states per minute over each device's span (first to last event):
   *idle* inputs (display, lock), *charging*, *network*. An event at ``HH:MM:SS`` takes effect
   in minute ``HH:MM``; within a minute the last event wins, so the state of a minute is the
   state at its end. Implementation: each event's rank is scattered onto its minute with
   ``np.maximum.at`` and ``np.maximum.accumulate`` carries the latest rank forward.
3. **Unknown state counts as "rule false"**: before the first event of a kind (e.g. no
   ``battery_charged_*`` event yet) the device is treated as not charging / not on WiFi /
   not idle. Events before the window start do set the state at the window start.
4. Rules per minute: ``strict = idle AND charging AND wifi``; ``relaxed = idle AND wifi``,
   where the *screen reading* (``screen=``, :data:`SCREENS`) says what "idle" means:
   ``either`` (default) display off OR locked; ``last-event`` whichever screen event came
   last (``screen_off``/``screen_lock`` idle, ``screen_on``/``screen_unlock`` not);
   ``display`` display off only; ``lock`` locked only. Display and lock are tracked as
   separate states, so every reading comes from one parse.
5. Align to the device's first local midnight at or after its first event and cut
   ``rounds`` rounds of ``round_minutes`` (default 300 x 10 min = 50 h). A round is available
   when the rule holds for at least half its minutes.
6. Eligible: the trace reaches at least the full window past that midnight (last event at or
   after midnight + rounds x round_minutes; 50 h by default) and availability over the window
   is >= ``min_availability`` (5 %).

``meta`` reports ``devices_total``, ``devices_too_short``, ``devices_low_availability``,
``devices_eligible`` and ``share_never`` = the share of *all* devices whose rule never holds in
any minute of their whole trace (docs/concepts/traces.md#flash gives 29.5 % for ``strict`` on the full trace).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.util.components import did_you_mean
from sfg.util.safety import check_cells, check_memory, loads_json, read_text
from sfg.world.traces.base import (
    Trace,
    eligible_mask,
    existing_file,
    fraction,
    minutes_to_rounds,
    positive_int,
    whole_minutes,
)

RULES = ("strict", "relaxed")
SCREENS = ("either", "last-event", "display", "lock")

# kinds of state an event sets
_DISPLAY, _LOCK, _CHARGE, _NET, _LEVEL = 0, 1, 2, 3, 4
_KINDS = (_DISPLAY, _LOCK, _CHARGE, _NET)
_SCREEN = 5  # display and lock events read as one state (screen=last-event)
_EVENTS: dict[str, tuple[int, int]] = {
    "screen_on": (_DISPLAY, 0),
    "screen_off": (_DISPLAY, 1),  # 1 = idle
    "screen_unlock": (_LOCK, 0),
    "screen_lock": (_LOCK, 1),  # 1 = idle
    "battery_charged_off": (_CHARGE, 0),
    "battery_charged_on": (_CHARGE, 1),
    "wifi": (_NET, 1),
    "2g": (_NET, 0),
    "3g": (_NET, 0),
    "4g": (_NET, 0),
    "5g": (_NET, 0),
    "unknown": (_NET, 0),
}
_MAX_SPAN_DAYS = 400
_LEVEL_RE = re.compile(r"^\d+(\.\d+)?%$")
_HINT = " (FLASH's state_traces.json, e.g. ../shared/data/flash/flash_state_traces_subset.json)"


@dataclass(frozen=True, eq=False)
class FlashStates:
    """Per-minute forward-filled states of every device over its whole span.

    devices: list[str]          JSON keys, len D
    models: list[str]           phone model per device
    first_s, last_s: int64[D]   first / last event time (local seconds since 1970-01-01)
    span_start: int64[D]        offset of each device's first minute in the flat arrays
    m0: int64[D]                minute index (local minutes since 1970) of that first minute
    idle, charging, wifi: bool[M]  flat per-minute states, devices concatenated (unknown=False);
                                ``idle`` is the default reading (display off OR locked)
    display_off, locked, screen_last: bool[M]  the separate screen states (``screen_last``: the
                                last display-or-lock event says idle)
    n_events: int
    path: str
    devices_without_events: int   entries with no event line (counted as too short, never)
    """

    devices: list[str]
    models: list[str]
    first_s: np.ndarray
    last_s: np.ndarray
    span_start: np.ndarray
    m0: np.ndarray
    idle: np.ndarray
    charging: np.ndarray
    wifi: np.ndarray
    n_events: int
    path: str
    devices_without_events: int = 0
    display_off: np.ndarray | None = None
    locked: np.ndarray | None = None
    screen_last: np.ndarray | None = None

    def screen_idle(self, screen: str = "either") -> np.ndarray:
        """bool[M]: "idle" under the screen reading ``screen`` (:data:`SCREENS`)."""
        if screen == "either":
            return self.idle
        if screen not in SCREENS:
            raise SfgError(f"unknown FLASH screen reading {screen!r}"
                           f"{did_you_mean(str(screen), SCREENS)}")
        got = {"last-event": self.screen_last, "display": self.display_off,
               "lock": self.locked}[screen]
        if got is None:
            raise SfgError(f"FLASH trace {self.path} has no {screen!r} screen reading")
        return got

    def rule(self, rule: str, screen: str = "either") -> np.ndarray:
        """bool[M]: the flat per-minute rule ``strict`` or ``relaxed`` under ``screen``."""
        if rule == "strict":
            return self.screen_idle(screen) & self.charging & self.wifi
        if rule == "relaxed":
            return self.screen_idle(screen) & self.wifi
        raise SfgError(f"unknown FLASH rule {rule!r}{did_you_mean(str(rule), RULES)}")


def _load_json(path: Path) -> dict:
    # parsed JSON and the per-event arrays: ~12 bytes of memory per byte of file
    text = read_text(path, "FLASH trace", bytes_per_byte=12)
    if not text.strip():
        raise SfgError(f"FLASH trace {path} is empty")
    data = loads_json(text, str(path), what="FLASH trace")
    if not isinstance(data, dict) or not data:
        raise SfgError(
            f"FLASH trace {path}: expected a non-empty JSON object "
            "{{device: {{guid, model, messages}}}}, got " + type(data).__name__
        )
    return data


def _split_messages(path: Path, data: dict[str, Any]
                    ) -> tuple[list[str], list[str], int, np.ndarray, np.ndarray, list[str], list[str]]:
    """Flatten all devices' message lines: (keys, models, dev[E], line[E], stamps[E], events[E])."""
    keys: list[str] = []
    models: list[str] = []
    dev: list[int] = []
    lineno: list[int] = []
    stamps: list[str] = []
    events: list[str] = []
    for key, rec in data.items():
        if not isinstance(rec, dict) or not isinstance(rec.get("messages"), str):
            raise SfgError(
                f"FLASH trace {path}: device {key!r} has no 'messages' string; each entry must be "
                "{guid, model, messages}"
            )
        d = len(keys)
        n_before = len(dev)
        for i, line in enumerate(rec["messages"].split("\n"), 1):
            if not line.strip():
                continue
            stamp, tab, event = line.partition("\t")
            if not tab:
                raise SfgError(
                    f"FLASH trace {path}: device {key!r}, message line {i}: expected "
                    f"'YYYY-MM-DD HH:MM:SS \\t<event>', got {line[:60]!r}"
                )
            dev.append(d)
            lineno.append(i)
            stamps.append(stamp.strip())
            events.append(event.strip())
        if len(dev) == n_before:
            continue  # a device without any event: counted as too short below
        keys.append(str(key))
        models.append(str(rec.get("model", "")))
    n_total = len(data)
    return keys, models, n_total, np.asarray(dev, np.int64), np.asarray(lineno, np.int64), stamps, events


def _first_bad(path: Path, keys: list[str], dev: np.ndarray, lineno: np.ndarray, mask: np.ndarray,
               what: str, values: list[str]) -> SfgError:
    i = int(np.flatnonzero(mask)[0])
    return SfgError(
        f"FLASH trace {path}: device {keys[dev[i]]!r}, message line {lineno[i]}: {what} "
        f"{values[i]!r}"
    )


def _parse_times(path: Path, keys: list[str], dev: np.ndarray, lineno: np.ndarray,
                 stamps: list[str]) -> np.ndarray:
    arr = np.asarray(stamps, dtype=str)
    bad = np.char.str_len(arr) != 19
    if bad.any():
        raise _first_bad(path, keys, dev, lineno, bad,
                         "timestamp is not 'YYYY-MM-DD HH:MM:SS':", stamps)
    try:
        return arr.astype("datetime64[s]").astype(np.int64)
    except ValueError:
        for i, s in enumerate(stamps):
            try:
                np.datetime64(s, "s")
            except ValueError:
                raise SfgError(
                    f"FLASH trace {path}: device {keys[dev[i]]!r}, message line {lineno[i]}: "
                    f"bad timestamp {s!r}"
                ) from None
        raise  # pragma: no cover - numpy rejected the batch but no single stamp


def _event_codes(path: Path, keys: list[str], dev: np.ndarray, lineno: np.ndarray,
                 events: list[str], ignore_unknown: bool) -> tuple[np.ndarray, np.ndarray]:
    """(kind[E], value[E]) from event strings; unknown events raise unless ignored."""
    uniq, inv = np.unique(np.asarray(events, dtype=str), return_inverse=True)
    kind_u = np.full(len(uniq), -1, np.int64)
    val_u = np.zeros(len(uniq), np.int8)
    for j, ev in enumerate(uniq.tolist()):
        code = _EVENTS.get(ev.lower())
        if code is not None:
            kind_u[j], val_u[j] = code
        elif _LEVEL_RE.match(ev):
            kind_u[j] = _LEVEL
        elif not ignore_unknown:
            raise _first_bad(
                path, keys, dev, lineno, inv == j,
                "unknown event (known: screen_on/off/lock/unlock, battery_charged_on/off, "
                "wifi/2G/3G/4G/5G/Unknown, battery level like 87.0%; pass ignore_unknown=true "
                "to skip unknown events):", events,
            )
    return kind_u[inv], val_u[inv]


def _fill(kind: np.ndarray, value: np.ndarray, pos: np.ndarray, rank: np.ndarray,
          span_start: np.ndarray, first_rank: np.ndarray, M: int, k: int) -> np.ndarray:
    """int8[M] forward-filled state of kind ``k`` (-1 unknown) over the flat minute axis.

    Each event's rank (2 * sorted index + 2) is scattered onto its flat minute (max wins: the
    latest event in a minute); each device's first minute gets a reset marker
    ``2 * first_rank + 1`` that is larger than every earlier device's event rank and smaller
    than its own, so that ``maximum.accumulate`` never leaks state across devices.
    """
    marks = np.zeros(M, np.int64)
    marks[span_start] = 2 * first_rank + 1
    sel = kind == k
    np.maximum.at(marks, pos[sel], 2 * rank[sel] + 2)
    np.maximum.accumulate(marks, out=marks)
    is_event = (marks % 2 == 0) & (marks > 0)
    state = np.full(M, -1, np.int8)
    state[is_event] = value[(marks[is_event] - 2) // 2]
    return state


def parse_flash(path: str | Path, *, ignore_unknown: bool = False) -> FlashStates:
    """Parse a FLASH state-trace JSON into per-minute states of every device (docs/concepts/traces.md#real-availability-traces)."""
    p = existing_file(path, "FLASH trace", _HINT)
    data = _load_json(p)
    keys, models, n_total, dev, lineno, stamps, events = _split_messages(p, data)
    if not keys:
        raise SfgError(f"FLASH trace {p}: no device has any event line")
    secs = _parse_times(p, keys, dev, lineno, stamps)
    kind, value = _event_codes(p, keys, dev, lineno, events, ignore_unknown)

    order = np.lexsort((np.arange(len(dev)), secs, dev))  # by device, time, then file order
    dev, secs, kind, value = dev[order], secs[order], kind[order], value[order]
    D = len(keys)
    first_idx = np.searchsorted(dev, np.arange(D), side="left")
    last_idx = np.searchsorted(dev, np.arange(D), side="right") - 1
    first_s, last_s = secs[first_idx], secs[last_idx]
    m0 = first_s // 60
    length = last_s // 60 - m0 + 1
    too_long = np.flatnonzero(length > _MAX_SPAN_DAYS * 1440)
    if too_long.size:
        d = int(too_long[0])
        raise SfgError(
            f"FLASH trace {p}: device {keys[d]!r} spans {length[d] / 1440:.0f} days "
            f"({np.datetime64(int(first_s[d]), 's')} to {np.datetime64(int(last_s[d]), 's')}); "
            f"more than {_MAX_SPAN_DAYS} days usually means a wrong clock, check its timestamps"
        )
    M = int(length.sum())
    # per flat minute: the int64 marks, four int8 states and three bool rules (~24 bytes)
    check_memory(24.0 * M, f"FLASH trace {p}: its {D} devices span {M:.3g} minutes of "
                           "per-minute states in all", fix="pass a trace of fewer devices or "
                                                           "shorter spans")
    span_start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    pos = span_start[dev] + (secs // 60 - m0[dev])
    rank = np.arange(len(dev), dtype=np.int64)
    st = {k: _fill(kind, value, pos, rank, span_start, first_idx.astype(np.int64), M, k)
          for k in _KINDS}
    screen_kind = np.where((kind == _DISPLAY) | (kind == _LOCK), _SCREEN, kind)
    last = _fill(screen_kind, value, pos, rank, span_start, first_idx.astype(np.int64), M,
                 _SCREEN)
    idle = (st[_DISPLAY] == 1) | (st[_LOCK] == 1)
    return FlashStates(
        devices=keys, models=models, first_s=first_s, last_s=last_s, span_start=span_start,
        m0=m0, idle=idle, charging=st[_CHARGE] == 1, wifi=st[_NET] == 1,
        n_events=len(dev), path=str(p), devices_without_events=n_total - D,
        display_off=st[_DISPLAY] == 1, locked=st[_LOCK] == 1, screen_last=last == 1,
    )


def flash_trace(states: FlashStates, *, rule: str = "strict", rounds: int = 300,
                round_minutes: int = 10, min_availability: float = 0.05,
                screen: str = "either") -> Trace:
    """Availability ``bool[rounds, D_eligible]`` of the FLASH devices under ``rule`` (docs/concepts/traces.md#real-availability-traces),
    reading "idle" as ``screen`` says (:data:`SCREENS`, module docstring)."""
    if rule not in RULES:
        raise SfgError(f"unknown FLASH rule {rule!r}{did_you_mean(str(rule), RULES)}")
    if screen not in SCREENS:
        raise SfgError(f"unknown FLASH screen reading {screen!r}"
                       f"{did_you_mean(str(screen), SCREENS)}")
    rounds = positive_int(rounds, "rounds")
    rm = whole_minutes(round_minutes, "round_minutes")
    min_av = fraction(min_availability, "min_availability")
    W = rounds * rm
    # the window of one device first: W is used in int64 arithmetic below
    check_cells(W, 1, 9, f"the FLASH window ({rounds} rounds of {rm} min)", rows_name="minutes",
                fix="lower rounds= or round_minutes=")
    rule_flat = states.rule(rule, screen)
    D = len(states.devices)
    n_empty = states.devices_without_events
    never = ~np.logical_or.reduceat(rule_flat, states.span_start)

    midnight_s = -(-states.first_s // 86400) * 86400  # first local midnight at/after first event
    long_enough = states.last_s >= midnight_s + W * 60
    idx = np.flatnonzero(long_enough)
    # the int64 minute index and the bool rule of every device-minute of the window
    check_cells(W, max(len(idx), 1), 9, f"the FLASH window ({rounds} rounds of {rm} min)",
                rows_name="minutes", fix="lower rounds= or round_minutes=")
    cols = _window_cols(states, idx, midnight_s[idx], W)
    per_minute = rule_flat[cols] if len(idx) else np.zeros((0, W), bool)
    avail = minutes_to_rounds(per_minute, rm)  # [D_long, rounds]
    ok = eligible_mask(avail, min_av)
    keep = idx[ok]
    start = np.asarray(midnight_s[keep], dtype="datetime64[s]").astype("datetime64[m]")
    n_all = D + n_empty
    meta = {
        "source": "flash",
        "path": states.path,
        "rule": rule,
        "screen": screen,
        "rounds": rounds,
        "round_minutes": rm,
        "min_availability": min_av,
        "events": states.n_events,
        "devices_total": n_all,
        "devices_too_short": int(n_all - len(idx)),
        "devices_low_availability": int((~ok).sum()),
        "devices_eligible": int(len(keep)),
        "devices_never": int(never.sum() + n_empty),
        "share_never": float((never.sum() + n_empty) / n_all),
        "models": [states.models[i] for i in keep],
        "unknown_state": "rule false until the first event of each kind",
    }
    return Trace(
        available=avail[ok].T, devices=[states.devices[i] for i in keep], round_minutes=rm,
        start=[str(s) for s in start], day_offset_minutes=np.zeros(len(keep)), meta=meta,
    )


def _window_cols(states: FlashStates, idx: np.ndarray, midnight_s: np.ndarray,
                 W: int) -> np.ndarray:
    """int64[len(idx), W]: flat minute index of each window minute of devices ``idx``."""
    return (states.span_start[idx] + (midnight_s // 60 - states.m0[idx]))[:, None] \
        + np.arange(W)[None, :]


def window_minutes(states: FlashStates, devices: list[str], *, rule: str = "strict",
                   rounds: int = 300, round_minutes: int = 10,
                   screen: str = "either") -> np.ndarray:
    """bool[len(devices), rounds * round_minutes]: the per-minute rule of ``devices``.

    The minutes of the window :func:`flash_trace` cuts for each device (docs/concepts/traces.md#real-availability-traces: from its first
    local midnight at or after its first event), at the trace's native resolution of one
    minute; ``minutes_to_rounds`` of it is exactly the device's column of ``flash_trace``.
    ``devices`` are device ids of ``states`` whose trace covers the whole window (every
    eligible device of a :class:`Trace` built from ``states`` with the same parameters).
    """
    rounds = positive_int(rounds, "rounds")
    rm = whole_minutes(round_minutes, "round_minutes")
    W = rounds * rm
    pos = {d: i for i, d in enumerate(states.devices)}
    missing = [d for d in devices if d not in pos]
    if missing:
        raise SfgError(f"FLASH trace {states.path} has no device {missing[0]!r}")
    idx = np.asarray([pos[d] for d in devices], dtype=np.int64)
    check_cells(W, max(len(idx), 1), 9, f"the FLASH window ({rounds} rounds of {rm} min)",
                rows_name="minutes", fix="lower rounds= or round_minutes=")
    midnight_s = -(-states.first_s[idx] // 86400) * 86400
    short = np.flatnonzero(states.last_s[idx] < midnight_s + W * 60)
    if short.size:
        raise SfgError(f"FLASH trace {states.path}: device {devices[int(short[0])]!r} does not "
                       f"cover the {rounds} x {rm}-minute window past its first midnight")
    rule_flat = states.rule(rule, screen)
    if not len(idx):
        return np.zeros((0, W), bool)
    return rule_flat[_window_cols(states, idx, midnight_s, W)]


def load_flash(path: str | Path, *, rule: str = "strict", rounds: int = 300,
               round_minutes: int = 10, min_availability: float = 0.05,
               ignore_unknown: bool = False, screen: str = "either") -> Trace:
    """Parse a FLASH state-trace file and build the availability trace under ``rule``."""
    states = parse_flash(path, ignore_unknown=ignore_unknown)
    return flash_trace(states, rule=rule, rounds=rounds, round_minutes=round_minutes,
                       min_availability=min_availability, screen=screen)
