"""Aggregation is written once (sfg.sim.gossip.weighted_sum) and its arithmetic is pinned:
each product rounded to the store's dtype, then added in the candidates' order, zero weights
skipped — the same bits on every CPU, thread count and engine (tests/crosspath.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from crosspath import assert_same_bits

from sfg.round.slots import RoundGraph
from sfg.sim.gossip import gossip, slot_matmul, weighted_sum

pytestmark = pytest.mark.crosspath


def _oracle(M, col, w, starts, ends):
    """The obvious loop in numpy: float32 products rounded, then float32 adds in order."""
    out = np.zeros((len(starts), M.shape[1]), M.dtype)
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        for s in range(a, b):
            if w[s] != 0:
                out[i] = out[i] + (M.dtype.type(w[s]) * M[col[s]])
    return out


def test_a_hand_computed_sum_in_order():
    # 1 + 2^-24 + 2^-24 in float32: added in order it stays 1 (each half-ulp rounds to even);
    # any other order, or one fused product-sum, gives 1 + 2^-23 — the order is pinned
    eps = np.float32(2.0 ** -24)
    M = torch.tensor([[1.0], [float(eps)], [float(eps)]])
    got = weighted_sum(M, np.array([0, 1, 2]), np.ones(3, np.float32), np.array([0]),
                       np.array([3]))
    assert got.item() == 1.0
    rev = weighted_sum(M, np.array([1, 2, 0]), np.ones(3, np.float32), np.array([0]),
                       np.array([3]))
    assert rev.item() == 1.0 + 2.0 ** -23
    # weights: 0.5·4 + 0.25·8 = 4, a zero weight skipped even on a NaN model
    M = torch.tensor([[4.0, 1.0], [8.0, 3.0], [float("nan"), float("nan")]])
    got = weighted_sum(M, np.array([0, 1, 2]), np.array([0.5, 0.25, 0.0]), np.array([0]),
                       np.array([3]))
    assert got.tolist() == [[4.0, 1.25]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equals_the_in_order_oracle_bit_for_bit(dtype):
    """docs/reference/reproducibility.md: "each product `w_j · x_j` rounded to float32, then
    added one after another in slot order [...], zero weights skipped (a candidate of weight 0
    contributes nothing, even a non-finite model)" (0 · NaN would be NaN): the zero-weight
    slots here point at models that are NaN, +inf and −inf, and no other slot does."""
    g = np.random.default_rng(1)
    M = g.standard_normal((33, 1001)).astype(dtype)
    M[30:] = np.array([np.nan, np.inf, -np.inf], dtype)[:, None]  # rows 30..32: non-finite
    col = g.integers(0, 30, 50)
    w = g.random(50).astype(dtype)
    w[::7] = 0
    col[::7] = 30 + np.arange(col[::7].size) % 3  # every zero weight on a non-finite model
    starts, ends = np.array([0, 10, 10, 33]), np.array([10, 10, 33, 50])
    got = weighted_sum(torch.from_numpy(M), col, w, starts, ends).numpy()
    assert_same_bits(got, _oracle(M, col, w, starts, ends))
    assert np.isfinite(got).all()
    assert (got[1] == 0).all()  # an empty segment is zero


def test_no_fused_multiply_add():
    """A fused w·x + acc (one rounding) differs from the pinned product-then-sum on these
    inputs, so the test can tell which the compiled loop does."""
    g = np.random.default_rng(3)
    M = g.standard_normal((8, 4096)).astype(np.float32)
    w = g.random(8).astype(np.float32)
    got = weighted_sum(torch.from_numpy(M), np.arange(8), w, np.array([0]), np.array([8]))
    fused = np.zeros(4096, np.float32)
    for s in range(8):  # fma emulated in float64: the product is exact there
        fused = (fused.astype(np.float64) + np.float64(w[s]) * M[s]).astype(np.float32)
    assert not np.array_equal(got.numpy()[0], fused)
    assert_same_bits(got.numpy(), _oracle(M, np.arange(8), w, [0], [8]))


def test_gossip_is_weighted_sum_in_slot_order_and_ignores_threads():
    g = np.random.default_rng(0)
    edges = np.array([[i, j] for i in range(12) for j in range(i + 1, 12) if g.random() < 0.4])
    rg = RoundGraph.from_edges(12, edges)
    X = torch.from_numpy(g.standard_normal((12, 777)).astype(np.float32))
    w = g.random(rg.n_slots)
    rows = g.random(12) < 0.7
    idx = np.flatnonzero(rows)
    want = _oracle(X.numpy(), rg.send, w.astype(np.float32), rg.indptr[idx], rg.indptr[idx + 1])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            assert_same_bits(slot_matmul(rg, w, rows, X), want)
            out = gossip(X, rg, w, rows)
            assert_same_bits(out[torch.from_numpy(idx)], want)
            assert torch.equal(out[torch.from_numpy(np.flatnonzero(~rows))],
                               X[torch.from_numpy(np.flatnonzero(~rows))])
    finally:
        torch.set_num_threads(threads)
