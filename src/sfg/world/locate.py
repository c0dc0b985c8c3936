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
def locate_near(indptr, start, end, i, t, cursor):  # pragma: no cover - compiled
    """:func:`locate_one`, starting from device i's last answer ``cursor[i]`` (updated): a
    few steps when its queries come nearly in time order, as a simulation's do."""
    a, b = indptr[i], indptr[i + 1]
    k = cursor[i]
    if k < a - 1 or k >= b:
        k = a - 1
    while k + 1 < b and start[k + 1] <= t:
        k += 1
    while k >= a and start[k] > t:
        k -= 1
    cursor[i] = k
    return k, k >= a and t < end[k]


@njit(cache=True, nogil=True)
def locate(indptr, start, end, d, t, j, on):  # pragma: no cover - compiled
    """j [Q]: the index of device d's last interval starting at or before t (indptr[d] − 1
    when none does); on [Q]: whether t lies inside it (:func:`locate_one` per query)."""
    for q in range(d.shape[0]):
        j[q], on[q] = locate_one(indptr, start, end, d[q], t[q])
