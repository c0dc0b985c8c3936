"""The self-return H (docs/concepts/replay.md#model-free-analyses): which (round, receiver) pairs, and the compiled kernel that
follows them through the realised weights.

H_i^t = Σ_{s=t+1}^{t+h} [W^{s−1}⋯W^{t+1}]_ii, averaged over the available receivers of every
round t ≤ T − h: exactly over all pairs while there are at most ``exact_pairs`` of them, else
on a seeded uniform sample (:func:`pair_list`; ``H_se`` is then its standard error). Both forms
run the same kernel, :func:`horizon_rounds` (compiled once: :data:`KERNEL`), on disjoint sets
of pairs in parallel threads (the kernel releases the GIL).
"""

from __future__ import annotations

import os

import numpy as np

from sfg.round.compiled import Kernel
from sfg.round.slots import RoundGraph
from sfg.util.numba_start import njit
from sfg.util.rng import stream

EXACT_PAIRS = 20_000


def pair_list(adopt: np.ndarray, h: int, *, seed: int, exact_pairs: int = EXACT_PAIRS,
              sample: int = 1000) -> tuple[np.ndarray, np.ndarray, bool]:
    """(start rounds, receivers, sampled?) of the H pairs, sorted by start: all adopters of
    every round t ≤ T − h, or a seeded uniform sample of ``sample`` of them when there are
    more than ``exact_pairs``."""
    T = adopt.shape[0]
    if h <= 0 or T - h < 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), False
    ts, ii = np.nonzero(adopt[: T - h + 1])
    sampled = ts.size > exact_pairs
    if sampled:
        pick = np.sort(stream(seed, "horizon").choice(ts.size, size=sample, replace=False))
        ts, ii = ts[pick], ii[pick]
    return ts.astype(np.int64), ii.astype(np.int64), bool(sampled)


def horizon_pairs(adopt: np.ndarray, h: int, *, seed: int, exact_pairs: int = EXACT_PAIRS,
                  sample: int = 1000) -> tuple[dict[int, np.ndarray], bool]:
    """The pairs of :func:`pair_list` grouped by start round: ({t: receivers}, sampled?)."""
    ts, ii, sampled = pair_list(adopt, h, seed=seed, exact_pairs=exact_pairs, sample=sample)
    out: dict[int, np.ndarray] = {}
    if ts.size:
        bounds = np.flatnonzero(np.diff(ts)) + 1
        for group_t, group_i in zip(np.split(ts, bounds), np.split(ii, bounds), strict=True):
            out[int(group_t[0])] = group_i
    return out, sampled


def default_threads() -> int:
    """Threads for the self-return and for parallel lanes: the cores this process may use (≤ 8)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


class HorizonPart:
    """One thread's share of the self-return pairs (see :func:`horizon_rounds`): its own pair
    list, ring of columns and pool of rows."""

    def __init__(self, T: int, n: int, h: int, ts: np.ndarray, ii: np.ndarray, max_adopt: int):
        self.ptr = np.zeros(T + 1, np.int64)
        np.cumsum(np.bincount(ts, minlength=T), out=self.ptr[1:])
        self.pairs, self.h = ii, h
        # ring of columns: wide enough for the pairs of any h consecutive starts
        width = (int((self.ptr[np.minimum(np.arange(T + 1) + h, T)] - self.ptr).max())
                 if ii.size else 0)
        self.C = np.zeros((n + max_adopt if width else 0, width))
        self.rowbuf = np.arange(n, dtype=np.int64)
        self.spare = np.arange(n, n + max_adopt, dtype=np.int64)
        self.recv = np.zeros(width, np.int64)
        self.acc = np.zeros(width)
        self.out = np.full(ii.size, np.nan)

    def run(self, t0: int, t1: int, rg: RoundGraph, w: np.ndarray, adopt: np.ndarray,
            tile: int) -> None:
        KERNEL.get()(t0, t1, rg.indptr, rg.send, np.ascontiguousarray(w, np.float64),
                     np.ascontiguousarray(adopt, np.bool_), self.C, self.rowbuf, self.spare,
                     self.recv, self.acc, self.ptr, self.pairs, self.out, self.h, tile)


@njit(cache=True, nogil=True)
def _adopter_rows(ws, ad, indptr, send, rowbuf, nz_row, nz_len, nz_j, nz_w,
                  kmax):  # pragma: no cover - compiled
    """The adopters' rows of one round's W (``ws`` [E], adopters ``ad`` [N]), nonzero entries
    only, in slot order, as pool rows: adopter k is receiver nz_row[k], its entries
    nz_j / nz_w[k·kmax : k·kmax + nz_len[k]]. Returns the number of adopters."""
    n_ad = 0
    for i in range(indptr.shape[0] - 1):
        if ad[i]:
            nz_row[n_ad] = i
            d = 0
            for e in range(indptr[i], indptr[i + 1]):
                if ws[e] != 0.0:
                    nz_j[n_ad * kmax + d] = rowbuf[send[e]]
                    nz_w[n_ad * kmax + d] = ws[e]
                    d += 1
            nz_len[n_ad] = d
            n_ad += 1
    return n_ad


@njit(cache=True, nogil=True)
def _new_rows(C, spare, nz_len, nz_j, nz_w, n_ad, kmax, c0, c1):  # pragma: no cover - compiled
    """Columns [c0, c1) of every adopter's new row, into its spare pool row: Σ_d w_d·(row
    j_d) over its nonzero weights, summed in order d = 0, 1, … (as one accumulation at a time
    would), up to four rows per pass over the tile."""
    m = c1 - c0
    for k in range(n_ad):
        tk = C[spare[k], c0:c1]
        js = nz_j[k * kmax:(k + 1) * kmax]
        wk = nz_w[k * kmax:(k + 1) * kmax]
        ln = nz_len[k]
        x0 = C[js[0], c0:c1]
        w0 = wk[0]
        if ln == 1:
            for c in range(m):
                tk[c] = w0 * x0[c]
            continue
        x1 = C[js[1], c0:c1]
        w1 = wk[1]
        if ln == 2:
            for c in range(m):
                tk[c] = w0 * x0[c] + w1 * x1[c]
            continue
        x2 = C[js[2], c0:c1]
        w2 = wk[2]
        if ln == 3:
            for c in range(m):
                tk[c] = (w0 * x0[c] + w1 * x1[c]) + w2 * x2[c]
            continue
        x3 = C[js[3], c0:c1]
        w3 = wk[3]
        for c in range(m):
            tk[c] = ((w0 * x0[c] + w1 * x1[c]) + w2 * x2[c]) + w3 * x3[c]
        d = 4
        while d + 4 <= ln:
            x0 = C[js[d], c0:c1]
            x1 = C[js[d + 1], c0:c1]
            x2 = C[js[d + 2], c0:c1]
            x3 = C[js[d + 3], c0:c1]
            w0 = wk[d]
            w1 = wk[d + 1]
            w2 = wk[d + 2]
            w3 = wk[d + 3]
            for c in range(m):
                tk[c] = (((tk[c] + w0 * x0[c]) + w1 * x1[c]) + w2 * x2[c]) + w3 * x3[c]
            d += 4
        while d < ln:
            x0 = C[js[d], c0:c1]
            w0 = wk[d]
            for c in range(m):
                tk[c] = tk[c] + w0 * x0[c]
            d += 1


@njit(cache=True, nogil=True)
def _begin_start(s, C, rowbuf, recv, acc, ptr, pairs, out, h):  # pragma: no cover - compiled
    """Start s begins: its columns are e_i (zeroed row by row, contiguous)."""
    n = rowbuf.shape[0]
    width = C.shape[1]
    b0 = ptr[s] % width
    nb = ptr[s + 1] - ptr[s]
    for part in range(2):
        c_lo = b0 if part == 0 else 0
        c_hi = min(b0 + nb, width) if part == 0 else max(b0 + nb - width, 0)
        if c_hi > c_lo:
            for i in range(n):
                row = C[rowbuf[i], c_lo:c_hi]
                for c in range(c_hi - c_lo):
                    row[c] = 0.0
    c = b0
    for p in range(ptr[s], ptr[s + 1]):
        C[rowbuf[pairs[p]], c] = 1.0
        recv[c] = pairs[p]
        acc[c] = 1.0
        if h == 1:
            out[p] = 1.0
        c += 1
        if c == width:
            c = 0


def horizon_rounds(t0, t1, indptr, send, w, adopt, C, rowbuf, spare, recv, acc, ptr, pairs,
                   out, h, tile):  # pragma: no cover - compiled
    """The self-return's rounds [t0, t1) for one set of (start, receiver) pairs, from the
    weights ``w`` [R, E] and adopters ``adopt`` [R, N] of those rounds (row t − t0).

    The pairs of start t are pairs[ptr[t]:ptr[t+1]] (ptr has T+1 entries); their H values go
    to ``out``. Disjoint sets of pairs are independent, so several threads can each run one
    (the kernel releases the GIL).

    One round s (docs/concepts/replay.md#model-free-analyses): every tracked (start t, receiver i) pair p is a column of the
    matrix X, started at e_i (:func:`_begin_start`) and multiplied by each later round's W;
    its entry i is then [W^{s−1}⋯W^{t+1}]_ii. Pairs are numbered in start order (start t owns
    pairs ptr[t]..ptr[t+1]−1) and pair p lives in column p mod width, so the live pairs always
    form one circular range of columns (at most two contiguous ranges, ``part`` 0 and 1) and
    the work is exactly (adopters' nonzero weights) × (live pairs): only adopters' rows
    change (:func:`_adopter_rows`), the others are identity rows.

    Row i of X is row ``rowbuf[i]`` of the pool ``C``; an adopter's new row is written into a
    spare pool row (:func:`_new_rows`), which then takes the old row's place (no copy).
    Columns are processed in tiles of ``tile`` so that a tile of the rows stays in cache."""
    n = indptr.shape[0] - 1
    kmax = 1
    for i in range(n):
        kmax = max(kmax, indptr[i + 1] - indptr[i])
    m_ad = spare.shape[0]
    nz_row = np.empty(m_ad, np.int64)
    nz_len = np.empty(m_ad, np.int64)
    nz_j = np.empty(m_ad * kmax, np.int64)  # row k: [k·kmax, (k + 1)·kmax)
    nz_w = np.empty(m_ad * kmax, np.float64)
    width = C.shape[1]
    if h <= 0 or width == 0:
        return
    T = ptr.shape[0] - 1
    for s in range(t0, t1):
        lo = ptr[min(max(s - h + 1, 0), T)]
        hi = ptr[min(s, T)]
        if hi > lo:
            n_ad = _adopter_rows(w[s - t0], adopt[s - t0], indptr, send, rowbuf, nz_row,
                                 nz_len, nz_j, nz_w, kmax)
            a0 = lo % width
            n_live = hi - lo
            for part in range(2):  # the live columns: at most two contiguous ranges
                c_lo = a0 if part == 0 else 0
                c_hi = min(a0 + n_live, width) if part == 0 else max(a0 + n_live - width, 0)
                for c0 in range(c_lo, c_hi, tile):
                    _new_rows(C, spare, nz_len, nz_j, nz_w, n_ad, kmax, c0,
                              min(c0 + tile, c_hi))
            for k in range(n_ad):
                i = nz_row[k]
                old = rowbuf[i]
                rowbuf[i] = spare[k]
                spare[k] = old
            # the diagonal entries (no modulo in the loop: an integer division costs ~30
            # cycles)
            for part in range(2):
                c_lo = a0 if part == 0 else 0
                c_hi = min(a0 + n_live, width) if part == 0 else max(a0 + n_live - width, 0)
                for c in range(c_lo, c_hi):
                    acc[c] += C[rowbuf[recv[c]], c]
        # start s − h + 1 has its h terms now
        f = s - h + 1
        if 0 <= f < T:
            c = ptr[f] % width
            for p in range(ptr[f], ptr[f + 1]):
                out[p] = acc[c]
                c += 1
                if c == width:
                    c = 0
        if s < T and ptr[s + 1] > ptr[s]:
            _begin_start(s, C, rowbuf, recv, acc, ptr, pairs, out, h)


def _signature():
    from numba import types as nt

    i1, f1 = nt.Array(nt.int64, 1, "C"), nt.Array(nt.float64, 1, "C")
    f2, b2 = nt.Array(nt.float64, 2, "C"), nt.Array(nt.boolean, 2, "C")
    return nt.none(nt.int64, nt.int64, i1, i1, f2, b2, f2, i1, i1, i1, f1, i1, i1, f1, nt.int64,
                   nt.int64)


#: :func:`horizon_rounds` compiled (one signature), on first use or ahead in a helper process
#: (:mod:`sfg.round.compiled`; the replay starts it while the round compiles)
KERNEL = Kernel(horizon_rounds, _signature, "KERNEL")
