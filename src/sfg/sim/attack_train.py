"""Forged staleness in training (:mod:`sfg.round.attacks`): what attackers send, the
model-reading ``+clip`` defence (ClippedGossip-style screening; :mod:`sfg.round.defences`) and
the robust aggregators (:mod:`sfg.sim.robust`) applied to the round."""

from __future__ import annotations

import numpy as np
import torch

from sfg.errors import SfgError
from sfg.round.attacks import Attack
from sfg.round.slots import RoundGraph
from sfg.sim.gossip import gossip, slot_matmul
from sfg.util.rng import stream

# the attack models that read the honest clients' models of the round (sfg.round.attacks)
NEIGHBOUR_MODELS = ("alie", "ipm")


def alie_z(n: int, m: int) -> float:
    """"A little is enough" (Baruch et al., NeurIPS 2019): z_max for m attackers among n
    clients — s = ⌊n/2 + 1⌋ − m supporters are needed, and z_max = Φ⁻¹((n − m − s)/(n − m)),
    Φ the standard normal CDF (the authors' decentralised adaptation, He et al. 2022, uses the
    same). A one-line error where it is undefined (m ≥ n/2 + 1, or no honest client)."""
    from scipy.stats import norm

    s = np.floor(n / 2 + 1) - m
    if n - m <= 0 or s <= 0:
        raise SfgError(f"attack model=alie: z_max is undefined for {m} attackers among {n} "
                       "clients (needs fewer than n/2 + 1); give z=..., e.g. z=1")
    return float(norm.ppf((n - m - s) / (n - m)))


def _honest_neighbour_slots(rg: RoundGraph, attackers: np.ndarray) -> np.ndarray:
    """The slots honest j → attacker i (what each attacker sees of its honest neighbours)."""
    return np.flatnonzero(attackers[rg.recv] & ~attackers[rg.send] & ~rg.is_self)


def neighbour_stats(X: torch.Tensor, rg: RoundGraph, attackers: np.ndarray
                    ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Per attacker (rows ``flatnonzero(attackers)``): the count c of its honest neighbours,
    their coordinate-wise mean μ and standard deviation σ (the unbiased one, divisor c − 1, as
    the ALIE authors' code takes it; σ = 0 for c = 1), computed in float64: ([m], [m, D],
    [m, D]); μ = σ = 0 where c = 0."""
    att = np.flatnonzero(attackers)
    pos = np.full(rg.n, -1, np.int64)
    pos[att] = np.arange(att.size)
    sl = _honest_neighbour_slots(rg, attackers)
    dev = X.device
    r = torch.from_numpy(pos[rg.recv[sl]]).to(dev)
    Xn = X[torch.from_numpy(rg.send[sl]).to(dev)].to(torch.float64)
    c = np.bincount(pos[rg.recv[sl]], minlength=att.size).astype(np.float64)
    ct = torch.from_numpy(np.maximum(c, 1.0)).to(dev)[:, None]
    mu = torch.zeros((att.size, X.shape[1]), dtype=torch.float64, device=dev)
    mu.index_add_(0, r, Xn)
    mu /= ct
    sq = torch.zeros_like(mu)
    sq.index_add_(0, r, (Xn - mu[r]) ** 2)
    sd = torch.sqrt(sq / torch.from_numpy(np.maximum(c - 1.0, 1.0)).to(dev)[:, None])
    return c, mu, sd


def poisoned(x: torch.Tensor, x0: torch.Tensor, attack: Attack, *, seed: int,
             key: int) -> torch.Tensor:
    """THE models ``x`` [m, D] that attackers send, poisoned by ``attack.model`` without
    reading anyone else's: ``sign-flip`` −x, ``noise`` x + σ·N(0, 1) (one draw [m, D] from
    stream ``attack-noise`` keyed by the seed and ``key``: the round, or on the clock the
    sending local round), ``constant`` ``x0`` (their initial models); ``x`` as it is under any
    other model. The rounds (:func:`sent_models`) and the clock's training
    (:mod:`sfg.clock.train`) both send these."""
    if attack.model == "sign-flip":
        return -x
    if attack.model == "noise":
        g = torch.Generator().manual_seed(int(stream(seed, "attack-noise", key).integers(2**62)))
        noise = torch.randn(tuple(x.shape), generator=g, dtype=x.dtype)
        return x + attack.sigma * noise.to(x.device)
    if attack.model == "constant":
        return x0
    return x


def sent_models(X: torch.Tensor, X0: torch.Tensor, attackers: np.ndarray, attack: Attack | None,
                *, seed: int, t: int, rg: RoundGraph | None = None) -> torch.Tensor:
    """The models as sent in round ``t``: honest rows as they are; an attacker's row poisoned by
    ``attack.model`` — :func:`poisoned` (keyed by the round ``t``); from its honest
    neighbours' models of the round (``rg``; :func:`neighbour_stats`): ``alie`` μ − z·σ
    (z = ``attack.z`` or :func:`alie_z` of N and the number of attackers), ``ipm`` −ε·μ (Xie
    et al. 2020's inner-product manipulation on models, as He et al. 2022 apply it in gossip;
    ε = ``attack.epsilon``, default 0.1); an attacker without an honest neighbour sends its own
    model. ``dissensus`` is per receiver (:func:`dissensus`): here its own model. Returns
    ``X`` itself when nothing is poisoned."""
    if attack is None or attack.model in ("none", "dissensus") or not attackers.any():
        return X
    idx = torch.from_numpy(np.flatnonzero(attackers)).to(X.device)
    out = X.clone()
    if attack.model in NEIGHBOUR_MODELS:
        if rg is None:
            raise SfgError(f"attack model={attack.model} needs the round's graph")
        c, mu, sd = neighbour_stats(X, rg, attackers)
        if attack.model == "alie":
            z = attack.z if attack.z is not None else alie_z(rg.n, int(attackers.sum()))
            bad = mu - z * sd
        else:
            bad = -attack.eps * mu
        seen = torch.from_numpy(c > 0).to(X.device)
        out[idx] = torch.where(seen[:, None], bad.to(X.dtype), X[idx])
    else:
        out[idx] = poisoned(X[idx], X0[idx], attack, seed=seed, key=t)
    return out


def dissensus(X: torch.Tensor, sent: torch.Tensor, rg: RoundGraph, w: np.ndarray,
              candidate: np.ndarray, rows: np.ndarray, attackers: np.ndarray, epsilon: float
              ) -> tuple[torch.Tensor, np.ndarray]:
    """He et al. 2022's dissensus attack, per honest receiver i of ``rows`` with attacker
    weight A_i = Σ_{b attacker} w_ib > 0 (candidates): every attacker sends it
    z_i = x_i − ε·Σ_{k honest, k≠i} w_ik (x_k − x_i) / A_i, so that plain gossip gives
    x_i + (1 − ε)·Σ_k w_ik (x_k − x_i). Returns the source models [N + R, D] (``sent`` and the
    R receivers' z_i) and ``cols`` [E], the source row each slot delivers."""
    dev = X.device
    honest_rx = rows & ~attackers
    nb = honest_rx[rg.recv] & candidate & ~rg.is_self & (w > 0)
    att_slot = nb & attackers[rg.send]
    A = np.bincount(rg.recv[att_slot], weights=w[att_slot], minlength=rg.n)
    recv = np.flatnonzero(A > 0)
    cols = rg.send.copy()
    if recv.size == 0:
        return sent, cols
    hon = np.flatnonzero(nb & ~attackers[rg.send] & (A[rg.recv] > 0))
    r_t = torch.from_numpy(rg.recv[hon]).to(dev)
    diff = (X[torch.from_numpy(rg.send[hon]).to(dev)] - X[r_t]).to(torch.float64)
    h = torch.zeros((rg.n, X.shape[1]), dtype=torch.float64, device=dev)
    h.index_add_(0, r_t, diff * torch.from_numpy(w[hon]).to(dev)[:, None])
    rt = torch.from_numpy(recv).to(dev)
    z = X[rt].to(torch.float64) - epsilon * h[rt] / torch.from_numpy(A[recv]).to(dev)[:, None]
    pos = np.full(rg.n, -1, np.int64)
    pos[recv] = rg.n + np.arange(recv.size)
    hit = np.flatnonzero(att_slot & (A[rg.recv] > 0))
    cols[hit] = pos[rg.recv[hit]]
    return torch.cat([sent, z.to(X.dtype)]), cols


def clip_scale(dist: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """clip(z, r) = z · min(1, r/‖z‖) as the factor min(1, r/‖z‖) (``dist`` = ‖z‖): the one
    definition of the clipping of ``+clip`` and ``+scclip``."""
    return torch.clamp(radius / torch.clamp(dist, min=1e-12), max=1.0)


def median_radius(dist: np.ndarray, row: np.ndarray, n_rows: int) -> np.ndarray:
    """``+clip``'s radius [n_rows]: per receiver, the lower median of its entries' distances
    (0 for a receiver without entries); vectorised over receivers."""
    order = np.lexsort((dist, row))
    count = np.bincount(row, minlength=n_rows)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    radius = np.zeros(n_rows)
    has = np.flatnonzero(count > 0)
    radius[has] = dist[order[start[has] + (count[has] - 1) // 2]]
    return radius


def clipped_steps(diff: torch.Tensor, row: np.ndarray, w: torch.Tensor, n_rows: int,
                  radius: np.ndarray | None = None) -> torch.Tensor:
    """``+clip``'s neighbour terms, written once (the rounds below, the virtual clock's
    :func:`sfg.clock.train._clipped`, the networked node): for each neighbour candidate,
    w_j · clip(x_j − x_i, r_i) with ``diff`` [S, D] = x_j − x_i, ``row`` [S] its receiver
    (0..n_rows−1), ``w`` [S] its weight; clip(z, r) = z · min(1, r/‖z‖) (:func:`clip_scale`),
    r_i the lower median distance over receiver i's neighbour candidates
    (:func:`median_radius`) unless ``radius`` [n_rows] is given (``+scclip``)."""
    dist = torch.linalg.vector_norm(diff, dim=1)
    if radius is None:
        radius = median_radius(dist.detach().cpu().numpy(), row, n_rows)
    r = torch.from_numpy(np.asarray(radius, np.float64)[row]).to(diff.device, diff.dtype)
    scale = clip_scale(dist, r)
    return diff * (scale * w.to(diff.device, diff.dtype))[:, None]


def _neighbour_diffs(X: torch.Tensor, sent: torch.Tensor, rg: RoundGraph, slots: np.ndarray,
                     cols: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """For the neighbour ``slots``: their receivers (long) and x_j − x_i [S, D] (x_j as sent;
    ``cols`` [E] maps slots to rows of ``sent``, default the sender)."""
    dev = X.device
    recv = torch.from_numpy(rg.recv[slots]).to(dev)
    src = rg.send[slots] if cols is None else cols[slots]
    return recv, sent[torch.from_numpy(src).to(dev)] - X[recv]


def clipped_gossip(X: torch.Tensor, sent: torch.Tensor, rg: RoundGraph, w: np.ndarray,
                   candidate: np.ndarray, rows: np.ndarray, *, cols: np.ndarray | None = None
                   ) -> torch.Tensor:
    """``+clip``: x̃_i = x_i + Σ_{j≠i} w_ij · clip(x_j − x_i, r_i) for the receivers ``rows``,
    clip(z, r) = z · min(1, r/‖z‖), r_i the median distance from x_i to its neighbour candidates
    (robust while fewer than half of them are attackers). Weights as the rule gave them; memory
    grows with the neighbour slots × D. ``cols``: see :func:`_neighbour_diffs`."""
    out = X.clone()
    nb = rows[rg.recv] & candidate & ~rg.is_self
    if not nb.any():
        return out
    slots = np.flatnonzero(nb)
    recv, diff = _neighbour_diffs(X, sent, rg, slots, cols)
    out.index_add_(0, recv, clipped_steps(diff, rg.recv[slots], torch.from_numpy(w[slots]),
                                          rg.n))
    return out


def scclip_gossip(X: torch.Tensor, sent: torch.Tensor, rg: RoundGraph, w: np.ndarray,
                  candidate: np.ndarray, rows: np.ndarray, delta: float, *,
                  cols: np.ndarray | None = None, fixed: float = 0.0,
                  rank: int = 0) -> torch.Tensor:
    """``+scclip``: x̃_i = x_i + Σ_{j≠i} w_ij · clip(x_j − x_i, τ_i) over the neighbour
    candidates with positive weight, τ_i the adaptive radius
    (:func:`sfg.sim.robust.scclip_radius`); memory: neighbour slots × D."""
    from sfg.sim.robust import scclip_radius

    out = X.clone()
    slots = np.flatnonzero(rows[rg.recv] & candidate & ~rg.is_self & (w > 0))
    if slots.size == 0:
        return out
    recv, diff = _neighbour_diffs(X, sent, rg, slots, cols)
    row = rg.recv[slots]
    dist = torch.linalg.vector_norm(diff.to(torch.float64), dim=1).cpu().numpy()
    tau = scclip_radius(dist, w[slots], row, rg.n, delta, fixed=fixed, rank=rank)
    out.index_add_(0, recv, clipped_steps(diff, row, torch.from_numpy(w[slots]), rg.n,
                                          radius=tau))
    return out


def robust_gossip(X: torch.Tensor, sent: torch.Tensor, rg: RoundGraph, w: np.ndarray,
                  candidate: np.ndarray, rows: np.ndarray, rule, *, t: int, rounds: int,
                  cols: np.ndarray | None = None) -> torch.Tensor:
    """The rule's robust aggregator (``rule.robust``; :mod:`sfg.sim.robust`) for the receivers
    ``rows``; every other row is returned untouched. ``sent``/``cols``: the models each slot
    delivers (the receiver's own slot delivers x_i)."""
    from sfg.sim import robust as rb

    kind = rule.robust
    if kind == "scclip":
        return scclip_gossip(X, sent, rg, w, candidate, rows, rule.defence_param("delta"),
                             cols=cols, fixed=rule.defence_param("scclip_tau"),
                             rank=int(rule.defence_param("scclip_rank")))
    out = X.clone()
    if not rows.any():
        return out
    if kind == "balance":
        slots = np.flatnonzero(rows[rg.recv] & candidate & ~rg.is_self & (w > 0))
        if slots.size:
            _, diff = _neighbour_diffs(X, sent, rg, slots, cols)
            hit, new = rb.balance_update(
                X, diff, rg.recv[slots], w[slots], gamma=rule.defence_param("balance_gamma"),
                kappa=rule.defence_param("balance_kappa"),
                alpha=rule.defence_param("balance_alpha"), t=t, rounds=rounds)
            out[torch.from_numpy(hit).to(X.device)] = new
        return out
    # the receiver's own slot delivers its own model: source row i of X stacked after `sent`
    own = np.where(rg.is_self, sent.shape[0] + rg.recv, rg.send if cols is None else cols)
    p = rb.pad(rg, w, candidate, rows, own)
    S = torch.cat([sent, X])
    if kind == "median":
        agg = rb.weighted_median(p, S)
    elif kind == "trim":
        agg = rb.weighted_trimmed_mean(p, S, rule.defence_param("beta"))
    else:  # pragma: no cover - parse_rule admits only the robust aggregators above
        raise SfgError(f"unknown robust aggregator +{kind}")
    out[torch.from_numpy(p.rows).to(X.device)] = agg
    return out


def mix(X: torch.Tensor, X0: torch.Tensor, rg: RoundGraph, w: np.ndarray, candidate: np.ndarray,
        adopt: np.ndarray, attackers: np.ndarray, attack: Attack | None, *, clip: bool,
        seed: int, t: int, rule=None, rounds: int = 1) -> torch.Tensor:
    """The round's aggregation under an attack, ``+clip`` and/or a robust aggregator
    (``rule.robust``; ``rounds`` T for ``+balance``): honest receivers mix what was sent
    (under ``dissensus``, what each was sent); attackers that poison keep their own model (they
    train it locally)."""
    sent = sent_models(X, X0, attackers, attack, seed=seed, t=t, rg=rg)
    cols = None
    if attack is not None and attack.model == "dissensus" and attackers.any():
        sent, cols = dissensus(X, sent, rg, w, candidate, adopt, attackers, attack.eps)
    if rule is not None and rule.robust is not None:
        out = robust_gossip(X, sent, rg, w, candidate, adopt, rule, t=t, rounds=rounds,
                            cols=cols)
    elif clip:
        out = clipped_gossip(X, sent, rg, w, candidate, adopt, cols=cols)
    elif cols is not None:
        out = X.clone()
        if adopt.any():
            out[torch.from_numpy(np.flatnonzero(adopt)).to(X.device)] = slot_matmul(
                rg, w, adopt, sent, cols)
    else:
        out = gossip(sent, rg, w, adopt)  # honest rows of `sent` are their own models
    if sent is not X:
        idx = torch.from_numpy(np.flatnonzero(attackers)).to(X.device)
        out[idx] = X[idx]
    return out
