"""The read-only view a rule sees: per-slot staleness scalars and segment reductions.

A *slot* is a (receiver, candidate) pair. The batched form of a round has one segment of slots
per receiver (:class:`BatchSlots`, built from a :class:`~sfg.rounds.RoundGraph`); the
one-receiver form has a single segment whose slot 0 is the receiver itself
(:class:`ReceiverSlots`). Every rule is written once against this interface, so the form a real
decentralised system calls (one receiver's candidates in, weights out) runs exactly the code
the simulator runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..rounds import RoundGraph


@dataclass
class Slots:
    """Common interface. Per-slot arrays (shape [S]) are the *sender's* values.

    t:            round index
    is_self:      [S] bool   the receiver's own slot
    cand:         [S] bool   slot is in the candidate set S_i^t
    age:          [S] int64  τ of the candidate model
    lag:          [S] float64 ℓ of the candidate model
    count:        [S] int64  max-inherited count n of the candidate model
    local_count:  [S] int64  never-inherited counter of the candidate
    q:            [S] float64 receiver's link-reception estimate q̂_ij (1 on the self slot)
    u:            [S] float64 the receiver's uniform draw (copy-random), broadcast per slot
    key:          [S] float64 a uniform key per slot (placebo-cut)
    missed:       [S, T] float64 rows of the missed-fraction matrix A of each candidate model
                  (oracles only; None otherwise)
    """

    t: int
    is_self: np.ndarray
    cand: np.ndarray
    age: np.ndarray
    lag: np.ndarray
    count: np.ndarray
    local_count: np.ndarray
    q: np.ndarray
    u: np.ndarray
    key: np.ndarray
    missed: np.ndarray | None = None

    # -- segment reductions over candidates (optionally further masked), broadcast per slot
    def min(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    def max(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    def sum(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    def rank(self, key: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """0-based rank of each masked slot by ``key`` (ties by slot order) within its segment."""
        raise NotImplementedError

    def own(self, x: np.ndarray) -> np.ndarray:
        """The receiver's own slot value of ``x``, broadcast per slot."""
        raise NotImplementedError

    def segments(self) -> tuple[np.ndarray, np.ndarray]:
        """Slots padded per receiver: (index [R, kmax] int64, valid [R, kmax] bool)."""
        raise NotImplementedError

    def neighbours(self) -> np.ndarray:
        """Live neighbour slots: candidates other than the receiver."""
        return self.cand & ~self.is_self

    def with_lags(self, lag: np.ndarray) -> Slots:
        return replace(self, lag=lag)


def _fill(x: np.ndarray, mask: np.ndarray, value) -> np.ndarray:
    return np.where(mask, x, value)


_INT_MAX = np.iinfo(np.int64).max
_INT_MIN = np.iinfo(np.int64).min


def _neutral(x: np.ndarray, kind: str):
    if kind == "min":
        return np.inf if x.dtype.kind == "f" else _INT_MAX
    if kind == "max":
        return -np.inf if x.dtype.kind == "f" else _INT_MIN
    return 0


@dataclass
class BatchSlots(Slots):
    """All receivers of a round at once (slots of a :class:`RoundGraph`)."""

    rg: RoundGraph = field(kw_only=True)

    def _reduce(self, ufunc, kind, x, mask):
        m = self.cand if mask is None else (self.cand & mask)
        seg = ufunc.reduceat(_fill(x, m, _neutral(x, kind)), self.rg.indptr[:-1])
        return seg[self.rg.recv]

    def min(self, x, mask=None):
        return self._reduce(np.minimum, "min", x, mask)

    def max(self, x, mask=None):
        return self._reduce(np.maximum, "max", x, mask)

    def sum(self, x, mask=None):
        return self._reduce(np.add, "sum", x, mask)

    def own(self, x):
        return x[self.rg.indptr[:-1]][self.rg.recv]

    def segments(self):
        lens = np.diff(self.rg.indptr)
        k = np.arange(int(lens.max()))
        valid = k[None, :] < lens[:, None]
        idx = np.minimum(self.rg.indptr[:-1, None] + k[None, :], self.rg.n_slots - 1)
        return idx, valid

    def rank(self, key, mask):
        rg = self.rg
        m = mask & self.cand
        k = np.where(m, key, np.inf)
        order = np.lexsort((np.arange(rg.n_slots), k, rg.recv))
        pos = np.empty(rg.n_slots, np.int64)
        pos[order] = np.arange(rg.n_slots)
        return pos - rg.indptr[rg.recv]

    def cumcount(self, mask):
        """0-based position of each masked slot among the masked slots of its segment."""
        m = (mask & self.cand).astype(np.int64)
        cs = np.cumsum(m)
        before = np.concatenate([[0], cs])[self.rg.indptr[:-1]]
        return cs - m - before[self.rg.recv]


@dataclass
class ReceiverSlots(Slots):
    """One receiver's candidates (slot 0 is the receiver itself); the one-receiver form."""

    def _reduce(self, fn, kind, x, mask):
        m = self.cand if mask is None else (self.cand & mask)
        return np.full(x.shape, fn(_fill(x, m, _neutral(x, kind))), dtype=x.dtype)

    def min(self, x, mask=None):
        return self._reduce(np.min, "min", x, mask)

    def max(self, x, mask=None):
        return self._reduce(np.max, "max", x, mask)

    def sum(self, x, mask=None):
        return self._reduce(np.sum, "sum", x, mask)

    def own(self, x):
        return np.full(x.shape, x[0], dtype=x.dtype)

    def segments(self):
        k = self.is_self.shape[0]
        return np.arange(k)[None, :], np.ones((1, k), bool)

    def rank(self, key, mask):
        m = mask & self.cand
        k = np.where(m, key, np.inf)
        order = np.lexsort((np.arange(k.shape[0]), k))
        pos = np.empty(k.shape[0], np.int64)
        pos[order] = np.arange(k.shape[0])
        return pos

    def cumcount(self, mask):
        m = (mask & self.cand).astype(np.int64)
        return np.cumsum(m) - m
