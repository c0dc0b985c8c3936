"""Compiled search of many (device, time) queries in a timeline's online intervals
(:meth:`sfg.world.timeline.Timeline._locate` for large batches): per query a binary search in
its own device's intervals, which stay in cache, instead of two searches over all of them."""

from __future__ import annotations

import numpy as np

from sfg.util.numba_start import njit


@njit(cache=True, nogil=True)
def locate_one(indptr, start, end, i, t):  # pragma: no cover - compiled
    """(interval index, online) of device i at time t: the interval [start, end) holding t,
    or the last one starting at or before t (indptr[i] − 1: none)."""
    a, b = indptr[i], indptr[i + 1]
    k = a + np.searchsorted(start[a:b], t, side="right") - 1
    if k >= a and t < end[k]:
        return k, True
    return k, False


@njit(cache=True, nogil=True)
def near_start(indptr, start):  # pragma: no cover - compiled
    """The rows of :func:`online_near` before any query: no interval started yet."""
    n = indptr.shape[0] - 1
    near = np.empty((n, 4))
    for i in range(n):
        near[i, 0], near[i, 1], near[i, 3] = -np.inf, -np.inf, indptr[i] - 1
        near[i, 2] = start[indptr[i]] if indptr[i] < indptr[i + 1] else np.inf
    return near


@njit(cache=True, nogil=True, _nrt=False)
def online_near(indptr, start, end, i, t, near):  # pragma: no cover - compiled
    """Whether device i is online at t (:func:`locate_one`'s answer) for queries that come
    nearly in time order, as a simulation's do: ``near[i]`` holds the interval found last
    (its start, its end, the next one's start, its index; −inf, −inf when none has started),
    and a query between that start and the next one's reads that row alone (one cache line,
    where a search reads the offsets and two interval arrays); else the search steps from
    that interval and the row is updated. Once per message: compiled without reference counting, as
    :mod:`sfg.world.peers`' draws."""
    if near[i, 0] <= t < near[i, 2]:
        return t < near[i, 1]
    a, b = indptr[i], indptr[i + 1]
    k = np.int64(near[i, 3])
    while k + 1 < b and start[k + 1] <= t:
        k += 1
    while k >= a and start[k] > t:
        k -= 1
    near[i, 0], near[i, 1] = (start[k], end[k]) if k >= a else (-np.inf, -np.inf)
    near[i, 2] = start[k + 1] if k + 1 < b else np.inf
    near[i, 3] = k
    return k >= a and t < end[k]


@njit(cache=True, nogil=True)
def locate(indptr, start, end, d, t, j, on):  # pragma: no cover - compiled
    """j [Q]: the index of device d's last interval starting at or before t (indptr[d] − 1
    when none does); on [Q]: whether t lies inside it (:func:`locate_one` per query)."""
    for q in range(d.shape[0]):
        j[q], on[q] = locate_one(indptr, start, end, d[q], t[q])
