"""Comparing two code paths: what may be compared exactly, and why (docs/reference/reproducibility.md).

Tests that compare two code paths (node vs engine, clock vs rounds, 1 vs 2 threads, resumed vs
uninterrupted, with and without diagnostics) carry the ``crosspath`` marker; ``make test``
runs them a second time under the *other arithmetic* (``make test-arith``: torch's kernels,
MKL and oneDNN at another instruction set, numba for a generic x86-64), where a comparison
that held only because two different computations happened to round alike on this CPU fails.

:func:`assert_same_bits` is for paths that perform the same floating-point operations in the
same order, whatever the CPU, by construction:

* local training: both paths train each client with the same backend on the same blocks of
  clients (``loop``: one client at a time; the stacked backends: blocks that depend on N only,
  ``sfg.sim.backends._run_chunks``), every kernel on one intra-op thread;
* aggregation: both call ``sfg.sim.gossip.weighted_sum`` with the candidates in slot order
  (products rounded, then added one after another: no BLAS, no fused multiply-add);
* staleness: the compiled round (numba, no fastmath: no contraction, no reassociation) on
  the same weights (a node's star takes its weights as given, ``kernel.WEIGHTS_GIVEN``).

Paths that compute the same mathematics with other kernels (``batched`` vs ``loop`` vs
``vmap``; fused vs unfused) are compared with a tolerance derived in the test itself.
"""

from __future__ import annotations

import numpy as np


def _array(x) -> np.ndarray:
    return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)


def assert_same_bits(a, b, what: str = "parameters") -> None:
    """``a`` and ``b`` (arrays or tensors) hold the same bits; on failure, the largest |Δ| and
    how many entries differ."""
    x, y = _array(a), _array(b)
    assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, x.dtype, y.shape, y.dtype)
    same = x.view(np.uint8).reshape(-1, x.itemsize) == y.view(np.uint8).reshape(-1, y.itemsize)
    bad = ~same.all(axis=1)
    assert not bad.any(), (f"{what} differ in {int(bad.sum())} of {bad.size} entries "
                           f"(largest |Δ| {float(np.abs(x.astype(np.float64) - y).max()):.3g}): "
                           "the two paths do not compute the same thing")


#: how many times the growth of a one-ulp perturbation two kernels may differ by (see
#: :func:`derived_tolerance`)
MARGIN = 64.0


def derived_tolerance(train, P, margin: float = MARGIN) -> float:
    """A tolerance for comparing two kernels that compute the same training with other
    rounding (``batched`` vs ``loop``, NCHW vs channels_last), derived from the computation:
    ``train(P)`` is run again from the parameters moved by one ulp each, and the largest
    |Δ| that this perturbation has grown to after the run's steps is multiplied by ``margin``.

    Why that bounds a rounding difference: two kernels that add the same products in
    another order differ by a few ulps per operation, the same order of size as a one-ulp
    change of their inputs; what the later steps do to such a difference is what they do to
    the perturbation. The margin (64) covers sums of up to a few thousand terms rounded
    in another order (an error that grows like √n ulps). The floor is ``margin`` ulps of the
    largest result (zero steps still round once). Callers also check that the tolerance is
    far below what one planted semantic change does (a flipped label, a dropped step)."""
    import torch

    ref = train(P)
    up = torch.nextafter(P, torch.full_like(P, float("inf")))
    growth = float((train(up) - ref).abs().max())
    top = float(ref.abs().max())
    ulp = float(np.spacing(np.float32(top))) if top > 0 else 0.0
    return margin * max(growth, ulp)
