"""Summary statistics of an availability trace (the published figures in docs/concepts/traces.md#flash).

An *outage* is a maximal run of consecutive unavailable rounds of one device. By default runs
that touch the window's edges (censored: the device was already off at round 0, or is still
off at the last round) are counted with their observed length, as in the "longest 283" of docs/concepts/traces.md#flash
on a 300-round window; ``include_edges=False`` keeps only runs with an available round on
both sides.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sfg.world.traces.base import Trace


def outage_runs(available: np.ndarray, *, include_edges: bool = True) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """Lengths and device index of every outage in ``available: bool[T, D]``.

    Returns ``(lengths: int64[K], device: int64[K])``, runs ordered by device then time.
    Vectorised: each device column is padded with ``True`` on both sides, the padded columns
    are concatenated and run starts/ends are read off one ``np.diff``.
    """
    a = np.asarray(available, dtype=bool)
    T, D = a.shape
    if T == 0 or D == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    off = np.ones((D, T + 2), dtype=np.int8)
    off[:, 1:-1] = ~a.T
    off[:, 0] = off[:, -1] = 0
    d = np.diff(off.reshape(-1))
    starts = np.flatnonzero(d == 1) + 1  # flat index of the first off round
    ends = np.flatnonzero(d == -1) + 1  # flat index one past the last off round
    lengths = ends - starts
    device = starts // (T + 2)
    if not include_edges:
        col0 = starts % (T + 2)
        interior = (col0 > 1) & (col0 + lengths < T + 1)
        lengths, device = lengths[interior], device[interior]
    return lengths.astype(np.int64), device.astype(np.int64)


def trace_stats(trace: Trace, *, include_edges: bool = True) -> dict[str, Any]:
    """Eligible devices, mean availability and outage lengths of ``trace`` (docs/concepts/traces.md#real-availability-traces).

    Keys: ``devices`` (eligible, D), ``rounds`` (T), ``round_minutes``, ``mean_availability``
    (over all device-rounds), ``outages`` (count), ``outage_mean_rounds``,
    ``outage_median_rounds``, ``outage_longest_rounds`` and the same in hours,
    ``share_never_available`` (devices of the trace never available in the window) and, where
    the source reports them, ``devices_total`` and ``share_never`` (share of all source devices
    that never satisfy the rule anywhere in their trace).
    """
    a = trace.available
    lengths, _ = outage_runs(a, include_edges=include_edges)
    hours = trace.round_minutes / 60.0
    per_device = trace.device_availability()
    has = lengths.size > 0
    mean_len = float(lengths.mean()) if has else 0.0
    median_len = float(np.median(lengths)) if has else 0.0
    longest = int(lengths.max()) if has else 0
    out: dict[str, Any] = {
        "source": trace.meta.get("source", "?"),
        "path": trace.meta.get("path", ""),
    }
    for key in ("rule", "variant"):
        if key in trace.meta:
            out[key] = trace.meta[key]
    out.update({
        "devices": trace.n_devices,
        "rounds": trace.rounds,
        "round_minutes": trace.round_minutes,
        "mean_availability": float(a.mean()) if a.size else 0.0,
        "min_device_availability": float(per_device.min()) if per_device.size else 0.0,
        "max_device_availability": float(per_device.max()) if per_device.size else 0.0,
        "outages": int(lengths.size),
        "outages_include_edges": bool(include_edges),
        "outage_mean_rounds": mean_len,
        "outage_median_rounds": median_len,
        "outage_longest_rounds": longest,
        "outage_mean_hours": mean_len * hours,
        "outage_median_hours": median_len * hours,
        "outage_longest_hours": longest * hours,
        "share_never_available": float((~a.any(axis=0)).mean()) if trace.n_devices else 0.0,
    })
    for key in ("devices_total", "devices_too_short", "devices_low_availability",
                "devices_no_window", "devices_never", "share_never", "online_fraction"):
        if key in trace.meta:
            out[key] = trace.meta[key]
    return out
