"""Gossip on the flat parameter store: x̃_i = Σ_j w_ij x_j, written once (:func:`weighted_sum`).

Every engine aggregates through :func:`weighted_sum` — the rounds (:func:`gossip`), the
virtual clock's levels (:mod:`sfg.clock.train`) and the node (:mod:`sfg.net.node`) — so that
two engines given the same candidates and weights give the same bits, and so does one engine
on any CPU and any thread count. That holds by construction, not by how a library's kernels
happen to round on one machine: each product ``w_j · x_j`` is rounded to the store's dtype,
then the products are added one after another in the candidates' order (the receiver's own
model first, then its neighbours by slot), skipping zero weights; no fused multiply-add, no
split of the sum. IEEE multiplication and addition are correctly rounded whatever the vector
width, so the result is the same on AVX2, AVX-512 and the baseline x86-64 path, in one thread
or many (each receiver's row is written by one loop). A BLAS or sparse product would not
give that: MKL splits and fuses its dot products by CPU.
"""

from __future__ import annotations

import numpy as np
import torch

from sfg.round.jit import njit
from sfg.round.slots import RoundGraph

# Measured single-threaded on the 2-core development CPU (AMD EPYC), kNN k = 6, ms per round,
# the compiled loop / the sparse CSR product it replaced: N=100, D=8970, 19 rows: 0.14 / 1.1;
# all rows: 1.6 / 1.8; N=1000, all rows: 22 / 55; N=100, D=102,078, 19 rows: 4.8 / 5.0
# (memory-bound like the product; no [slots, D] temporary). Time grows with the edges, not N².


@njit(cache=True, nogil=True)
def _weighted_rows(M, col, w, starts, ends, out):  # pragma: no cover - compiled
    """out[i] = Σ_{s ∈ [starts[i], ends[i]), w[s] ≠ 0} w[s]·M[col[s]], in slot order: each
    product rounded, then added (plain multiply and add: numba emits no fused multiply-add
    without fastmath)."""
    D = M.shape[1]
    for i in range(starts.shape[0]):
        o = out[i]
        for d in range(D):
            o[d] = 0.0
        for s in range(starts[i], ends[i]):
            ws = w[s]
            if ws != 0.0:
                x = M[col[s]]
                for d in range(D):
                    o[d] = o[d] + ws * x[d]


def weighted_sum(M: torch.Tensor, col: np.ndarray, w: np.ndarray | torch.Tensor,
                 starts: np.ndarray, ends: np.ndarray) -> torch.Tensor:
    """``[len(starts), D]``: row i is Σ_s w[s]·M[col[s]] over the slots ``starts[i]..ends[i]``,
    in that order (see the module docstring for the arithmetic). ``w`` is cast to ``M``'s
    dtype first. The one definition of aggregation in sfg."""
    starts = np.ascontiguousarray(starts, np.int64)
    ends = np.ascontiguousarray(ends, np.int64)
    col = np.ascontiguousarray(col, np.int64)
    wt = (w if isinstance(w, torch.Tensor) else torch.from_numpy(np.asarray(w))).to(M.dtype)
    if M.device.type != "cpu":  # the same sum on an accelerator (not claimed bit-equal there)
        row = np.repeat(np.arange(starts.size), ends - starts)
        slot = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends, strict=True)]) \
            if starts.size else np.zeros(0, np.int64)
        keep = (wt.cpu().numpy()[slot] != 0)
        row, slot = row[keep], slot[keep]
        out = torch.zeros((starts.size, M.shape[1]), dtype=M.dtype, device=M.device)
        dev_slot = torch.from_numpy(slot).to(M.device)
        out.index_add_(0, torch.from_numpy(row).to(M.device),
                       M[torch.from_numpy(col[slot]).to(M.device)] * wt.to(M.device)[dev_slot, None])
        return out
    out = torch.empty((starts.size, M.shape[1]), dtype=M.dtype)
    if starts.size:
        _weighted_rows(M.detach().contiguous().numpy(), col,
                       wt.detach().contiguous().cpu().numpy(), starts, ends, out.numpy())
    return out


def slot_matmul(rg: RoundGraph, w: np.ndarray, rows: np.ndarray, M: torch.Tensor,
                cols: np.ndarray | None = None) -> torch.Tensor:
    """For the receivers ``rows`` (bool[N]): Σ_slots w_slot · M[col(slot)] -> [rows.sum(), D].

    ``col`` is the slot's sender (``M`` = the [N, D] models) unless ``cols`` maps slots to
    rows of ``M`` (e.g. a per-slot memory). :func:`weighted_sum` in slot order (self first).
    """
    idx = np.flatnonzero(rows)
    starts, ends = rg.indptr[idx], rg.indptr[idx + 1]
    return weighted_sum(M, rg.send if cols is None else cols, w, starts, ends)


def mix_rows(X: torch.Tensor, rg: RoundGraph, weights: np.ndarray, rows: np.ndarray,
             memory: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The receivers ``rows`` (bool[N]) as a long index ``[n]`` and their mixed models
    ``[n, D]`` (x̃_i = Σ_j w_ij x_j), computed from ``X`` (or the per-slot ``memory``)."""
    idx = torch.from_numpy(np.flatnonzero(rows)).to(X.device)
    cols = None if memory is None else np.arange(rg.n_slots)
    M = X if memory is None else memory
    return idx, slot_matmul(rg, weights, rows, M, cols)


def gossip_(X: torch.Tensor, rg: RoundGraph, weights: np.ndarray, rows: np.ndarray, *,
            keep: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`gossip` in place: the rows of the receivers are overwritten with their mixes
    (all read from ``X`` as it was on entry); ``keep`` (bool[D]) coordinates keep their value.
    Same numbers as :func:`gossip`, without a copy of the whole store. Returns ``X``."""
    if rows.any():
        idx, Y = mix_rows(X, rg, weights, rows)
        if keep is not None:
            Y[:, keep] = X.index_select(0, idx)[:, keep]
        X.index_copy_(0, idx, Y)
    return X


def gossip(X: torch.Tensor, rg: RoundGraph, weights: np.ndarray, rows: np.ndarray,
           memory: torch.Tensor | None = None) -> torch.Tensor:
    """x̃_i = Σ_j w_ij x_j for the receivers ``rows``; every other row is returned untouched.

    With ``memory`` ([E, D], one model per slot) the slots' remembered models are mixed instead
    of the senders' current ones (model memory). Returns a new tensor; see :func:`gossip_`."""
    out = X.clone()
    if rows.any():
        idx, Y = mix_rows(X, rg, weights, rows, memory)
        out.index_copy_(0, idx, Y)
    return out
