"""Rules that read model parameters (SPEC §3.2): model memory, relative variance, PWG.

They run only inside the training simulator. Each is an object with
``aggregate(X, rg, state, caps, live=, seed=) -> (X_agg, RoundResult)``: the aggregated
``[N, D]`` models and the shared round's result (:func:`sfg.round.kernel.play_round`: its weights,
candidates and next staleness state) for the scores the rule computed from the models.

* ``model-memory`` (MIFA analogue): every receiver keeps the last model it received over each
  edge and averages it in, undiscounted, while that neighbour is offline (or its link is down).
  ``model-memory+sfg`` / ``model-memory+sfg-l``: remembered models join the candidate set with
  staleness = their age (lag) at reception plus the rounds since, and get SFG weights.
  Memory is one model per directed edge: ``[E, D]`` floats (fine for small models; for the
  paper CNN at N = 100 it is about 2.8 GB).
* ``relative-variance`` (diffusion-adaptation combiner): h_ij = 1/v_ij with
  v_ij ← (1−ν) v_ij + ν ‖x_j − x_i^prev‖² over candidates incl. the receiver; x_i^prev is the
  receiver's previous aggregate (its last combined estimate); v starts at the first observation.
* ``pwg`` / ``pwg-l`` (precision-weighted gossip): h_j = 1/(1 + ρ Δ_j), Δ_j the relative age
  (lag) among the candidates. ρ̂ is estimated online from the squared distances d² between live
  neighbouring models (pairs whose endpoints are both available, link live) against their
  staleness difference x: running means m(x) of d² for integer x in 1..20 (lags rounded) are
  normalised by the running mean m(0) over pairs with (near-)zero difference, and
  m(x)/m(0) = 1 + (ρ/2)·x is fitted by least squares through the origin, weighted by counts;
  ρ̂ = max(0, 2·slope) and 0 until both kinds of pairs have been seen. ``H`` calibrates
  (ρ = H·ρ̂); a fixed ``rho`` ≥ 0 replaces the estimate.
"""

from __future__ import annotations

import numpy as np
import torch

from sfg.errors import SfgError
from sfg.round.kernel import candidate_mask, play_round
from sfg.round.rules import Rule, parse_rule
from sfg.sim.gossip import gossip

PWG_MAX_X = 20


# ----------------------------------------------------------------------------- the estimators
# written once, for the rounds (below) and the virtual clock (sfg.clock.scored)
def rv_update(old: np.ndarray, d2: np.ndarray, nu: float) -> np.ndarray:
    """relative-variance's v after observing d² (v starts at the first observation)."""
    return np.where(np.isnan(old), d2, (1 - nu) * old + nu * d2)


def rv_scores(v: np.ndarray) -> np.ndarray:
    """h = 1/v (1 where nothing was observed yet)."""
    return 1.0 / np.maximum(np.nan_to_num(v, nan=1.0), 1e-12)


def pwg_rate(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """ρ̂ from the running sums and counts of d² by staleness difference x = 0..PWG_MAX_X
    (last axis; any leading axes, e.g. one estimator per receiver): m(x)/m(0) = 1 + (ρ/2)·x
    fitted through the origin, weighted by counts; max(0, 2·slope), 0 until both x = 0 and
    x ≥ 1 pairs have been seen."""
    s, c = np.asarray(sums, np.float64), np.asarray(counts, np.float64)
    m0 = np.divide(s[..., 0], np.maximum(c[..., 0], 1))
    x = np.arange(1, PWG_MAX_X + 1, dtype=np.float64)
    n = c[..., 1:]
    ok = (c[..., 0] > 0) & (s[..., 0] > 0) & (n.sum(axis=-1) > 0)
    r = np.divide(s[..., 1:], np.maximum(n, 1)) / np.where(ok, m0, 1.0)[..., None]
    slope = (n * x * (r - 1)).sum(axis=-1) / np.maximum((n * x * x).sum(axis=-1), 1e-300)
    return np.where(ok, np.maximum(0.0, 2.0 * slope), 0.0)


def pwg_scores(rel: np.ndarray, rho) -> np.ndarray:
    """h = 1/(1 + ρ·Δ), Δ the staleness relative to the freshest candidate (≥ 0)."""
    return 1.0 / (1.0 + rho * np.maximum(rel, 0))


def _sq_dist(A: torch.Tensor, ia: np.ndarray, B: torch.Tensor, ib: np.ndarray,
             chunk: int = 256) -> np.ndarray:
    """‖A[ia] − B[ib]‖² row by row, in chunks (memory O(chunk·D)); computed on the models'
    device, copied to the host once (the rules' scores are numpy)."""
    out = torch.empty(ia.shape[0], dtype=torch.float64, device=A.device)
    for s in range(0, ia.shape[0], chunk):
        a = torch.from_numpy(ia[s:s + chunk]).to(A.device)
        b = torch.from_numpy(ib[s:s + chunk]).to(B.device)
        out[s:s + chunk] = (A[a] - B[b]).double().pow(2).sum(1)
    return out.cpu().numpy()


class ModelMemory:
    def __init__(self, rule: Rule, kernel: str):
        self.kernel = parse_rule(kernel)
        self.M: torch.Tensor | None = None

    def aggregate(self, X, rg, state, caps, *, live, seed):
        if self.M is None:
            self.M = torch.zeros(rg.n_slots, X.shape[1], dtype=X.dtype, device=X.device)
            self.rec_t = np.full(rg.n_slots, -1, np.int64)
            self.rec_age = np.zeros(rg.n_slots, np.int64)
            self.rec_lag = np.zeros(rg.n_slots)
            self.rec_count = np.ones(rg.n_slots, np.int64)
        t = state.t
        cand = candidate_mask(rg, caps, live)
        fresh = cand  # live candidates (self included) deliver their current model
        idx = torch.from_numpy(np.flatnonzero(fresh)).to(X.device)
        self.M[idx] = X[torch.from_numpy(rg.send[fresh]).to(X.device)]
        self.rec_t[fresh] = t
        self.rec_age[fresh] = state.ages[rg.send[fresh]]
        self.rec_lag[fresh] = state.lags[rg.send[fresh]]
        self.rec_count[fresh] = state.counts[rg.send[fresh]]
        remembered = caps.aggregate[rg.recv] & ~rg.is_self & ~cand & (self.rec_t >= 0)
        since = np.where(remembered, t - self.rec_t, 0)
        staleness = (np.where(remembered, self.rec_age + since, state.ages[rg.send]),
                     np.where(remembered, self.rec_lag + since, state.lags[rg.send]),
                     np.where(remembered, self.rec_count, state.counts[rg.send]))
        rr = play_round(self.kernel, rg, state, caps, seed=seed, live=live,
                        slot_staleness=staleness, extra=remembered)
        return gossip(X, rg, rr.weights, caps.adopt, memory=self.M), rr


class RelativeVariance:
    def __init__(self, rule: Rule):
        self.rule = rule
        self.nu = float(rule.params["nu"])
        if not 0 < self.nu <= 1:
            raise SfgError(f"relative-variance: nu={self.nu} must lie in (0, 1]")
        self.v: np.ndarray | None = None
        self.prev: torch.Tensor | None = None

    def aggregate(self, X, rg, state, caps, *, live, seed):
        if self.v is None:
            self.v = np.full(rg.n_slots, np.nan)
            self.prev = X.clone()
        cand = candidate_mask(rg, caps, live)
        sl = np.flatnonzero(cand)
        d2 = _sq_dist(X, rg.send[sl], self.prev, rg.recv[sl])
        self.v[sl] = rv_update(self.v[sl], d2, self.nu)
        h = rv_scores(self.v)
        rr = play_round(self.rule, rg, state, caps, seed=seed, live=live, scores=h)
        X_agg = gossip(X, rg, rr.weights, caps.adopt)
        rows = torch.from_numpy(np.flatnonzero(caps.adopt)).to(X.device)
        self.prev[rows] = X_agg[rows]
        return X_agg, rr


class PrecisionWeightedGossip:
    def __init__(self, rule: Rule, *, on_lags: bool):
        self.rule = rule
        self.on_lags = on_lags
        self.H = float(rule.params["H"])
        self.rho_fixed = float(rule.params["rho"])
        if self.H < 0:
            raise SfgError(f"{rule.name}: H={self.H} must be >= 0")
        self.sums = np.zeros(PWG_MAX_X + 1)
        self.counts = np.zeros(PWG_MAX_X + 1)
        self.rho_hat = 0.0

    def estimate(self) -> float:
        """ρ̂ from the running means (see the module docstring)."""
        return float(pwg_rate(self.sums, self.counts))

    def aggregate(self, X, rg, state, caps, *, live, seed):
        cand = candidate_mask(rg, caps, live)
        stale = state.lags if self.on_lags else state.ages.astype(np.float64)
        # pairs of live neighbouring models (each undirected pair once)
        pair = cand & ~rg.is_self & (rg.recv < rg.send) & caps.aggregate[rg.send]
        sl = np.flatnonzero(pair)
        if sl.size:
            diff = np.abs(stale[rg.recv[sl]] - stale[rg.send[sl]])
            xbin = np.rint(diff).astype(np.int64)
            ok = xbin <= PWG_MAX_X
            d2 = _sq_dist(X, rg.recv[sl[ok]], X, rg.send[sl[ok]])
            np.add.at(self.sums, xbin[ok], d2)
            np.add.at(self.counts, xbin[ok], 1)
        self.rho_hat = self.estimate()
        rho = self.rho_fixed if self.rho_fixed >= 0 else self.H * self.rho_hat
        # staleness relative to the freshest candidate of each receiver
        s = stale[rg.send]
        lowest = np.minimum.reduceat(np.where(cand, s, np.inf), rg.indptr[:-1])
        h = pwg_scores(s - lowest[rg.recv], rho)
        rr = play_round(self.rule, rg, state, caps, seed=seed, live=live, scores=h)
        return gossip(X, rg, rr.weights, caps.adopt), rr


def make_model_rule(rule: Rule, *, N: int, D: int, device) -> object:
    """The stateful aggregator of a model-reading rule."""
    if rule.name == "model-memory":
        return ModelMemory(rule, "dfedavg")
    if rule.name == "model-memory+sfg":
        return ModelMemory(rule, f"sfg:gamma={rule.params['gamma']}")
    if rule.name == "model-memory+sfg-l":
        return ModelMemory(rule, f"sfg-l:gamma={rule.params['gamma']}")
    if rule.name == "relative-variance":
        return RelativeVariance(rule)
    if rule.name in ("pwg", "pwg-l"):
        return PrecisionWeightedGossip(rule, on_lags=rule.name == "pwg-l")
    raise SfgError(f"rule {rule.name!r} does not read models")
