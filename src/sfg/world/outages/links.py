"""Link failures (docs/concepts/outages.md#link-failures): each undirected edge fails independently each round.

Round ``t``'s draw comes from ``sfg.util.rng.stream(seed, "links", t)`` alone, so a simulator can draw
round by round (:func:`live_links_round`) and get exactly the rows of the whole-trace form
(:func:`link_failures`). Failures do not change ages or lags; link-reception estimates react to
them (docs/concepts/staleness.md#the-staleness-state).
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np

from sfg.errors import SfgError
from sfg.util.rng import stream

__all__ = ["link_failures", "live_links_round"]


def _check_p(p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, Real) or not 0 <= float(p) < 1:
        raise SfgError(f"link failure probability p={p!r} must lie in [0, 1) "
                       "(the study used 0.3-0.6)")
    return float(p)


def _check_nonneg_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise SfgError(f"{name}={value!r} must be a non-negative integer")
    return int(value)


def live_links_round(n_edges: int, t: int, *, p: float, seed: int) -> np.ndarray:
    """``bool[M]``: which of the M undirected edges are live in round ``t`` (True = live)."""
    m = _check_nonneg_int("n_edges", n_edges)
    t = _check_nonneg_int("t", t)
    p = _check_p(p)
    seed = _check_nonneg_int("seed", seed)
    return stream(seed, "links", t).random(m) >= p


def link_failures(edges: np.ndarray, T: int, *, p: float, seed: int) -> np.ndarray:
    """``bool[T, M]`` live-link trace for ``edges: [M, 2]`` over T rounds (True = live).

    Row t equals ``live_links_round(M, t, p=p, seed=seed)``.
    """
    edges = np.asarray(edges)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise SfgError(f"edges must have shape [M, 2], got {edges.shape}")
    T = _check_nonneg_int("T", T)
    if T < 1:
        raise SfgError("T must be at least 1 round")
    p = _check_p(p)
    seed = _check_nonneg_int("seed", seed)
    m = len(edges)
    out = np.empty((T, m), dtype=bool)
    for t in range(T):
        out[t] = stream(seed, "links", t).random(m) >= p
    return out
