"""The common result of every trace pipeline (docs/concepts/traces.md#real-availability-traces): a :class:`Trace`.

A trace is a boolean availability matrix ``available: bool[T, D]`` (rounds x devices, ``True`` =
the device may take part in that round) plus per-device metadata. Every pipeline (FLASH,
STUNner sessions, tabular user files) returns one, holding only its *eligible* devices; the
counts of skipped and ineligible devices are kept in ``meta``.

Shared conventions:

* Rounds are consecutive, ``round_minutes`` long, starting at ``start[d]`` (local time); the
  FLASH and STUNner pipelines start every device's window at a local midnight
  (``day_offset_minutes == 0``).
* A round is available when the per-minute rule holds for **at least half** of its minutes
  (``2 * count >= round_minutes``), see :func:`minutes_to_rounds`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError


@dataclass(frozen=True, eq=False)
class Trace:
    """Availability of D devices over T rounds (docs/concepts/traces.md#real-availability-traces).

    available: bool[T, D]           True = device d available in round t
    devices: list[str]              device ids, len D
    round_minutes: float            length of one round in minutes
    start: list[str]                per-device local start of round 0 (ISO ``YYYY-MM-DDTHH:MM``,
                                    or ``"minute <x>"`` for traces on a plain minute clock)
    day_offset_minutes: float64[D]  minutes after local midnight at which round 0 starts
    meta: dict                      source, file, rule, device counts, ...
    """

    available: np.ndarray
    devices: list[str]
    round_minutes: float
    start: list[str]
    # None (the default) means zeros: __post_init__ always sets an [D] array, so readers see one
    day_offset_minutes: np.ndarray = field(default=None)  # type: ignore[arg-type]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        a = np.asarray(self.available)
        if a.ndim != 2:
            raise SfgError(f"trace availability must be a [rounds, devices] matrix, got shape {a.shape}")
        if a.dtype != np.bool_:
            a = a.astype(bool)
        a = np.ascontiguousarray(a)
        a.setflags(write=False)
        object.__setattr__(self, "available", a)
        T, D = a.shape
        devices = [str(x) for x in self.devices]
        if len(devices) != D:
            raise SfgError(f"trace has {D} device columns but {len(devices)} device ids")
        object.__setattr__(self, "devices", devices)
        if len(self.start) != D:
            raise SfgError(f"trace has {D} device columns but {len(self.start)} start times")
        if not (float(self.round_minutes) > 0):
            raise SfgError(f"round_minutes must be positive, got {self.round_minutes}")
        object.__setattr__(self, "round_minutes", float(self.round_minutes))
        off = (np.zeros(D) if self.day_offset_minutes is None
               else np.asarray(self.day_offset_minutes, dtype=np.float64).reshape(-1))
        if off.shape != (D,):
            raise SfgError(f"day_offset_minutes must have one entry per device ({D}), got {off.shape}")
        off = off.copy()
        off.setflags(write=False)
        object.__setattr__(self, "day_offset_minutes", off)

    @property
    def rounds(self) -> int:
        """T, the number of rounds."""
        return int(self.available.shape[0])

    @property
    def n_devices(self) -> int:
        """D, the number of (eligible) devices."""
        return int(self.available.shape[1])

    def device_availability(self) -> np.ndarray:
        """float64[D]: the fraction of rounds each device is available."""
        if self.rounds == 0:
            return np.zeros(self.n_devices)
        return self.available.mean(axis=0)

    def hour_of_day(self) -> np.ndarray:
        """int64[T, D]: local hour of day (0..23) at which each round starts."""
        t = np.arange(self.rounds, dtype=np.float64)[:, None] * self.round_minutes
        return (np.floor((self.day_offset_minutes[None, :] + t) / 60.0).astype(np.int64)) % 24


def minutes_to_rounds(per_minute: np.ndarray, round_minutes: int) -> np.ndarray:
    """bool[D, M] per-minute states -> bool[D, M // round_minutes] rounds (half-the-minutes rule).

    A round is available when the state holds for at least half of its minutes:
    ``2 * count >= round_minutes`` (5 of 10 minutes suffice). ``M`` must be a multiple of
    ``round_minutes``.
    """
    D, M = per_minute.shape
    if M % round_minutes:
        raise SfgError(f"{M} minutes is not a whole number of {round_minutes}-minute rounds")
    counts = per_minute.reshape(D, M // round_minutes, round_minutes).sum(axis=2, dtype=np.int64)
    return 2 * counts >= round_minutes


def whole_minutes(round_minutes: float, what: str) -> int:
    """Validate that a round length is a positive whole number of minutes."""
    try:
        value = float(round_minutes)
    except (TypeError, ValueError):
        raise SfgError(f"{what} must be a number of minutes, got {round_minutes!r}") from None
    if not 0 < value < float("inf") or value != int(value):
        raise SfgError(f"{what} must be a positive whole number of minutes, got {round_minutes!r}")
    return int(value)


def positive_int(value: Any, what: str) -> int:
    """Validate a positive integer parameter (rounds, clients...)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SfgError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def fraction(value: Any, what: str) -> float:
    """Validate a number in [0, 1]."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise SfgError(f"{what} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= v <= 1.0:
        raise SfgError(f"{what} must be in [0, 1], got {value!r}")
    return v


def existing_file(path: str | Path, what: str, hint: str = "") -> Path:
    """The path as a :class:`Path`, or an SfgError when it is missing, a folder or empty."""
    if path is None or str(path).strip() == "":
        raise SfgError(f"no {what} path given; pass path=FILE{hint}")
    p = Path(path).expanduser()
    if not p.exists():
        raise SfgError(f"{what} file {p} not found (relative paths start at the current "
                       f"folder {Path.cwd()}){hint}")
    if not p.is_file():
        raise SfgError(f"{what} path {p} is not a file{hint}")
    if p.stat().st_size == 0:
        raise SfgError(f"{what} file {p} is empty")
    return p


def eligible_mask(available: np.ndarray, min_availability: float) -> np.ndarray:
    """bool[D]: devices of ``available: bool[D, T]`` with availability >= ``min_availability``."""
    T = available.shape[1]
    if T == 0:
        return np.zeros(available.shape[0], dtype=bool)
    need = np.ceil(min_availability * T - 1e-9)  # whole rounds; exact at e.g. 15/300 = 5 %
    return available.sum(axis=1) >= need
