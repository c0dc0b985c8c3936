"""Compiled search of many (device, time) queries in a timeline's online intervals
(:meth:`sfg.world.timeline.Timeline._locate` for large batches): per query a binary search in
its own device's intervals, which stay in cache, instead of two searches over all of them."""

from __future__ import annotations

import numpy as np

from sfg.util.numba_start import njit


@njit(cache=True, nogil=True)
def locate(indptr, start, end, d, t, j, on):  # pragma: no cover - compiled
    """j [Q]: the index of device d's last interval starting at or before t (indptr[d] − 1
    when none does); on [Q]: whether t lies inside it."""
    for q in range(d.shape[0]):
        a, b = indptr[d[q]], indptr[d[q] + 1]
        k = a + np.searchsorted(start[a:b], t[q], side="right") - 1
        j[q] = k
        on[q] = k >= a and t[q] < end[k]
