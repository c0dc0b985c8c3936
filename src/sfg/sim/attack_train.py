"""Forged staleness in training (:mod:`sfg.round.attacks`): what attackers send, and the model-reading
``+clip`` defence (ClippedGossip-style screening; :mod:`sfg.round.defences`)."""

from __future__ import annotations

import numpy as np
import torch

from sfg.round.attacks import Attack
from sfg.round.slots import RoundGraph
from sfg.sim.gossip import gossip
from sfg.util.rng import stream


def sent_models(X: torch.Tensor, X0: torch.Tensor, attackers: np.ndarray, attack: Attack | None,
                *, seed: int, t: int) -> torch.Tensor:
    """The models as sent in round ``t``: honest rows as they are; an attacker's row poisoned by
    ``attack.model`` — ``sign-flip`` −x, ``noise`` x + σ·N(0, 1) (stream ``attack-noise`` keyed
    by the seed and the round), ``constant`` its initial model ``X0``. Returns ``X`` itself
    when nothing is poisoned."""
    if attack is None or attack.model == "none" or not attackers.any():
        return X
    idx = torch.from_numpy(np.flatnonzero(attackers)).to(X.device)
    out = X.clone()
    if attack.model == "sign-flip":
        out[idx] = -X[idx]
    elif attack.model == "noise":
        g = torch.Generator().manual_seed(int(stream(seed, "attack-noise", t).integers(2**62)))
        noise = torch.randn((idx.numel(), X.shape[1]), generator=g, dtype=X.dtype)
        out[idx] = X[idx] + attack.sigma * noise.to(X.device)
    elif attack.model == "constant":
        out[idx] = X0[idx]
    return out


def clipped_steps(diff: torch.Tensor, row: np.ndarray, w: torch.Tensor, n_rows: int
                  ) -> torch.Tensor:
    """``+clip``'s neighbour terms, written once (the rounds below, the virtual clock's
    :func:`sfg.clock.train._clipped`): for each neighbour candidate, w_j · clip(x_j − x_i, r_i)
    with ``diff`` [S, D] = x_j − x_i, ``row`` [S] its receiver (0..n_rows−1), ``w`` [S] its
    weight; clip(z, r) = z · min(1, r/‖z‖), r_i the lower median distance over receiver i's
    neighbour candidates."""
    dist = torch.linalg.vector_norm(diff, dim=1)
    d_np = dist.detach().cpu().numpy()
    radius = np.zeros(n_rows)
    order = np.lexsort((d_np, row))
    bounds = np.searchsorted(row[order], np.arange(n_rows + 1))
    for i in np.flatnonzero(bounds[1:] > bounds[:-1]):  # one median per receiver
        seg = order[bounds[i]:bounds[i + 1]]
        radius[i] = d_np[seg[(seg.size - 1) // 2]]
    r = torch.from_numpy(radius[row]).to(diff.device, diff.dtype)
    scale = torch.clamp(r / torch.clamp(dist, min=1e-12), max=1.0)
    return diff * (scale * w.to(diff.device, diff.dtype))[:, None]


def clipped_gossip(X: torch.Tensor, sent: torch.Tensor, rg: RoundGraph, w: np.ndarray,
                   candidate: np.ndarray, rows: np.ndarray) -> torch.Tensor:
    """``+clip``: x̃_i = x_i + Σ_{j≠i} w_ij · clip(x_j − x_i, r_i) for the receivers ``rows``,
    clip(z, r) = z · min(1, r/‖z‖), r_i the median distance from x_i to its neighbour candidates
    (robust while fewer than half of them are attackers). Weights as the rule gave them; memory
    grows with the neighbour slots × D."""
    out = X.clone()
    nb = rows[rg.recv] & candidate & ~rg.is_self
    if not nb.any():
        return out
    slots = np.flatnonzero(nb)
    dev = X.device
    recv = torch.from_numpy(rg.recv[slots]).to(dev)
    diff = sent[torch.from_numpy(rg.send[slots]).to(dev)] - X[recv]
    out.index_add_(0, recv, clipped_steps(diff, rg.recv[slots], torch.from_numpy(w[slots]),
                                          rg.n))
    return out


def mix(X: torch.Tensor, X0: torch.Tensor, rg: RoundGraph, w: np.ndarray, candidate: np.ndarray,
        adopt: np.ndarray, attackers: np.ndarray, attack: Attack | None, *, clip: bool,
        seed: int, t: int) -> torch.Tensor:
    """The round's aggregation under an attack and/or ``+clip``: honest receivers mix what was
    sent; attackers that poison keep their own model (they train it locally)."""
    sent = sent_models(X, X0, attackers, attack, seed=seed, t=t)
    if clip:
        out = clipped_gossip(X, sent, rg, w, candidate, adopt)
    else:
        out = gossip(sent, rg, w, adopt)  # honest rows of `sent` are their own models
    if sent is not X:
        idx = torch.from_numpy(np.flatnonzero(attackers)).to(X.device)
        out[idx] = X[idx]
    return out
