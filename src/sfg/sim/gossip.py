"""Gossip on the flat parameter store: the round's weights as one sparse row-stochastic product."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ..rounds import RoundGraph


def slot_matmul(rg: RoundGraph, w: np.ndarray, rows: np.ndarray, M: torch.Tensor,
                cols: np.ndarray | None = None) -> torch.Tensor:
    """For the receivers ``rows`` (bool[N]): Σ_slots w_slot · M[col(slot)] -> [rows.sum(), D].

    ``col`` is the slot's sender (``M`` = the [N, D] models) unless ``cols`` maps slots to
    rows of ``M`` (e.g. a per-slot memory). A CSR product: time and memory grow with edges.
    """
    idx = np.flatnonzero(rows)
    starts, ends = rg.indptr[idx], rg.indptr[idx + 1]
    lens = ends - starts
    crow = np.concatenate([[0], np.cumsum(lens)])
    slot = np.repeat(starts - crow[:-1], lens) + np.arange(crow[-1])
    col = rg.send[slot] if cols is None else cols[slot]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        W = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(col),
                                    torch.from_numpy(w[slot]).to(M.dtype),
                                    size=(idx.size, M.shape[0])).to(M.device)
        return W @ M


def gossip(X: torch.Tensor, rg: RoundGraph, weights: np.ndarray, rows: np.ndarray,
           memory: torch.Tensor | None = None) -> torch.Tensor:
    """x̃_i = Σ_j w_ij x_j for the receivers ``rows``; every other row is returned untouched.

    With ``memory`` ([E, D], one model per slot) the slots' remembered models are mixed instead
    of the senders' current ones (model memory)."""
    out = X.clone()
    if rows.any():
        cols = None if memory is None else np.arange(rg.n_slots)
        M = X if memory is None else memory
        out[torch.from_numpy(np.flatnonzero(rows)).to(X.device)] = slot_matmul(rg, weights, rows, M, cols)
    return out
