"""Rules that read model parameters (docs/concepts/rules.md#baselines): model memory, relative variance, PWG.

One registered object per rule (:data:`MODEL_RULES`, keyed by rule name; :func:`model_rule`
is the one dispatch): it checks the rule's parameters once, holds the rule's state and
carries both forms the rule runs in.

* In rounds (the training simulator, :mod:`sfg.sim.run`):
  ``aggregate(X, rg, state, caps, live=, seed=) -> (X_agg, RoundResult)``: the aggregated
  ``[N, D]`` models and the shared round's result (:func:`sfg.round.kernel.play_round`: its
  weights, candidates and next staleness state) for the scores the rule computed from the
  models.
* On the virtual clock's async and event protocols (:mod:`sfg.clock.train`, one dependency
  level at a time): after ``start(n, n_slots, X0)``,
  ``scores(M, row, first, devs, slots, age, lag) -> h`` (one score per candidate of the
  level's local rounds: M their models, ``row`` the local round of each, ``first`` each
  round's own entry, ``devs`` the receivers, ``slots`` the candidates' slots, ``age``/``lag``
  their staleness as the rule sees it, waited: age τ + ⌊d⌋, lag ℓ + d), which enter the
  events' compiled weights as given scores (:func:`sfg.round.kernel.run_events`), and
  ``adopted(devs, agg)`` after the level's aggregation. Model memory runs there as its kernel
  on an unbounded window instead (:func:`memory_kernel`).

The rules:

* ``model-memory`` (MIFA analogue): every receiver keeps the last model it received over each
  edge and averages it in, undiscounted, while that neighbour is offline (or its link is down).
  ``model-memory+sfg`` / ``model-memory+sfg-l``: remembered models join the candidate set with
  staleness = their age (lag) at reception plus the rounds since, and get SFG weights.
  Memory is one model per directed edge: ``[E, D]`` floats (fine for small models; for the
  paper CNN at N = 100 it is about 2.8 GB).
* ``relative-variance`` (diffusion-adaptation combiner): h_ij = 1/v_ij with
  v_ij ← (1−ν) v_ij + ν ‖x_j − x_i^prev‖² over candidates incl. the receiver; x_i^prev is the
  receiver's previous aggregate (its last combined estimate; the initial model before its
  first); v starts at the first observation. On the clock x_j is the model a message carried
  (the receiver's own: its current model).
* ``pwg`` / ``pwg-l`` (precision-weighted gossip): h_j = 1/(1 + ρ Δ_j), Δ_j the relative age
  (lag) among the candidates (relative to the freshest). ρ̂ is estimated online from the
  squared distances d² between neighbouring models against their staleness difference x:
  running means m(x) of d² for integer x in 1..20 (differences rounded) are normalised by the
  running mean m(0) over pairs with (near-)zero difference, and m(x)/m(0) = 1 + (ρ/2)·x is
  fitted by least squares through the origin, weighted by counts; ρ̂ = max(0, 2·slope) and 0
  until both kinds of pairs have been seen. ``H`` calibrates (ρ = H·ρ̂); a fixed ``rho`` ≥ 0
  replaces the estimate. In rounds one estimator sees every live pair of the round (both
  endpoints available, link live); on the clock no round exists in which all live pairs are
  seen at once, so each receiver regresses the pairs it observes itself (its own model
  against each candidate's, at each of its aggregations), a decentralised estimator that
  needs no global view.
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


def relative(stale: np.ndarray, group: np.ndarray, n_groups: int,
             among: np.ndarray | None = None) -> np.ndarray:
    """Each entry's staleness minus the smallest of its group's (receiver's) entries
    ``among`` (a mask; all when None): Δ of :func:`pwg_scores`."""
    lowest = np.full(n_groups, np.inf)
    np.minimum.at(lowest, group if among is None else group[among],
                  stale if among is None else stale[among])
    return stale - lowest[group]


def _sq_dist(A: torch.Tensor, ia: np.ndarray, B: torch.Tensor, ib: np.ndarray,
             chunk: int = 256) -> np.ndarray:
    """‖A[ia] − B[ib]‖² row by row, in chunks (memory O(chunk·D)); computed on the models'
    device, copied to the host once (the rules' scores are numpy)."""
    ia, ib = np.asarray(ia, np.int64), np.asarray(ib, np.int64)
    out = torch.empty(ia.shape[0], dtype=torch.float64, device=A.device)
    for s in range(0, ia.shape[0], chunk):
        a = torch.from_numpy(ia[s:s + chunk]).to(A.device)
        b = torch.from_numpy(ib[s:s + chunk]).to(B.device)
        out[s:s + chunk] = (A[a] - B[b]).double().pow(2).sum(1)
    return out.cpu().numpy()


# ----------------------------------------------------------------------------- the rules
MODEL_RULES: dict[str, type[ModelRule]] = {}


def register(cls):
    """Register a model-reading rule's class under each of its ``names``."""
    for name in cls.names:
        if name in MODEL_RULES:
            raise ValueError(f"model-reading rule {name!r} registered twice")
        MODEL_RULES[name] = cls
    return cls


class ModelRule:
    """A model-reading rule (see the module docstring): ``names`` the rule names it runs,
    ``on_clock`` whether the async and event protocols score it (:meth:`scores`)."""

    names: tuple[str, ...] = ()
    on_clock = True

    def __init__(self, rule: Rule):
        self.rule = rule

    def aggregate(self, X, rg, state, caps, *, live, seed):
        raise NotImplementedError

    def start(self, n: int, n_slots: int, X0: torch.Tensor) -> ModelRule:
        """The state for the virtual clock's ``n`` devices and ``n_slots`` slots, initial
        models ``X0``; returns the rule."""
        raise NotImplementedError

    def scores(self, M, row, first, devs, slots, age, lag, **_) -> np.ndarray:
        raise NotImplementedError

    def adopted(self, devs: np.ndarray, agg: torch.Tensor, **_) -> None:
        return None

    def _combine(self, X, rg, state, caps, live, seed, h: np.ndarray):
        """The round with the scores ``h`` [E] and its gossip: ``(X_agg, RoundResult)``."""
        rr = play_round(self.rule, rg, state, caps, seed=seed, live=live, scores=h)
        return gossip(X, rg, rr.weights, caps.adopt), rr


def model_rule(rule: Rule) -> ModelRule:
    """The registered object of a model-reading rule (the one dispatch)."""
    cls = MODEL_RULES.get(rule.name)
    if cls is None:
        raise SfgError(f"rule {rule.name!r} does not read models")
    return cls(rule)


def memory_kernel(rule: Rule) -> Rule | None:
    """Model memory's kernel — ``dfedavg`` (every model undiscounted), ``sfg`` or ``sfg-l``
    with the rule's γ for ``model-memory+sfg``/``+sfg-l`` — or None for other rules."""
    cls = MODEL_RULES.get(rule.name)
    return cls.kernel_of(rule) if cls is ModelMemory else None


@register
class ModelMemory(ModelRule):
    names = ("model-memory", "model-memory+sfg", "model-memory+sfg-l")
    on_clock = False  # there: its kernel on an unbounded window (memory_kernel)
    KERNELS = {"model-memory": "dfedavg", "model-memory+sfg": "sfg",
               "model-memory+sfg-l": "sfg-l"}

    @classmethod
    def kernel_of(cls, rule: Rule) -> Rule:
        k = cls.KERNELS[rule.name]
        return parse_rule(k if k == "dfedavg" else f"{k}:gamma={rule.params['gamma']}")

    def __init__(self, rule: Rule):
        super().__init__(rule)
        self.kernel = self.kernel_of(rule)
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


@register
class RelativeVariance(ModelRule):
    names = ("relative-variance",)

    def __init__(self, rule: Rule):
        super().__init__(rule)
        self.nu = float(rule.params["nu"])
        if not 0 < self.nu <= 1:
            raise SfgError(f"relative-variance: nu={self.nu} must lie in (0, 1]")
        self.v: np.ndarray | None = None  # [E] per slot
        self.prev: torch.Tensor | None = None  # [N, D] each receiver's previous aggregate

    def start(self, n: int, n_slots: int, X0: torch.Tensor) -> RelativeVariance:
        self.v = np.full(n_slots, np.nan)
        self.prev = X0.clone()
        return self

    def _observe(self, slots: np.ndarray, d2: np.ndarray) -> None:
        """v of ``slots`` after observing d² there."""
        self.v[slots] = rv_update(self.v[slots], d2, self.nu)

    def aggregate(self, X, rg, state, caps, *, live, seed):
        if self.v is None:
            self.start(rg.n, rg.n_slots, X)
        sl = np.flatnonzero(candidate_mask(rg, caps, live))
        self._observe(sl, _sq_dist(X, rg.send[sl], self.prev, rg.recv[sl]))
        X_agg, rr = self._combine(X, rg, state, caps, live, seed, rv_scores(self.v))
        rows = np.flatnonzero(caps.adopt)
        self.adopted(rows, X_agg[torch.from_numpy(rows).to(X.device)])
        return X_agg, rr

    def scores(self, M, row, first, devs, slots, age, lag, **_) -> np.ndarray:
        self._observe(slots, _sq_dist(M, np.arange(row.size), self.prev, devs[row]))
        return rv_scores(self.v[slots])

    def adopted(self, devs: np.ndarray, agg: torch.Tensor, **_) -> None:
        self.prev[torch.from_numpy(np.asarray(devs, np.int64)).to(agg.device)] = agg


@register
class PrecisionWeightedGossip(ModelRule):
    names = ("pwg", "pwg-l")

    def __init__(self, rule: Rule):
        super().__init__(rule)
        self.on_lags = rule.name == "pwg-l"
        self.H = float(rule.params["H"])
        self.rho_fixed = float(rule.params["rho"])
        if self.H < 0:
            raise SfgError(f"{rule.name}: H={self.H} must be >= 0")
        # the running sums and counts of d² by staleness difference: one estimator in rounds,
        # one per receiver [n, ·] on the clock (start)
        self.sums = np.zeros(PWG_MAX_X + 1)
        self.counts = np.zeros(PWG_MAX_X + 1)
        self.rho_hat = 0.0

    def start(self, n: int, n_slots: int, X0: torch.Tensor) -> PrecisionWeightedGossip:
        self.sums = np.zeros((n, PWG_MAX_X + 1))
        self.counts = np.zeros((n, PWG_MAX_X + 1))
        return self

    def estimate(self, devs: np.ndarray | None = None):
        """ρ̂ (:func:`pwg_rate`): the rounds' one estimate, or each receiver's in ``devs``."""
        if devs is None:
            return float(pwg_rate(self.sums, self.counts))
        return pwg_rate(self.sums[devs], self.counts[devs])

    def _observe(self, diff: np.ndarray, A, ia: np.ndarray, B, ib: np.ndarray,
                 key: np.ndarray | None = None) -> None:
        """Pairs of models A[ia], B[ib] whose staleness differs by ``diff``: d² into the
        running sums of their rounded difference (≤ PWG_MAX_X), of estimator ``key``."""
        xbin = np.rint(diff).astype(np.int64)
        ok = xbin <= PWG_MAX_X
        d2 = _sq_dist(A, ia[ok], B, ib[ok])
        at = xbin[ok] if key is None else (key[ok], xbin[ok])
        np.add.at(self.sums, at, d2)
        np.add.at(self.counts, at, 1)

    def _rho(self, rate):
        """ρ: the fixed one, else H·ρ̂."""
        return np.full_like(rate, self.rho_fixed) if self.rho_fixed >= 0 else self.H * rate

    def aggregate(self, X, rg, state, caps, *, live, seed):
        cand = candidate_mask(rg, caps, live)
        stale = state.lags if self.on_lags else state.ages.astype(np.float64)
        # pairs of live neighbouring models (each undirected pair once)
        sl = np.flatnonzero(cand & ~rg.is_self & (rg.recv < rg.send) & caps.aggregate[rg.send])
        if sl.size:
            i, j = rg.recv[sl], rg.send[sl]
            self._observe(np.abs(stale[i] - stale[j]), X, i, X, j)
        self.rho_hat = self.estimate()
        h = pwg_scores(relative(stale[rg.send], rg.recv, rg.n, cand),
                       self._rho(np.float64(self.rho_hat)))
        return self._combine(X, rg, state, caps, live, seed, h)

    def scores(self, M, row, first, devs, slots, age, lag, **_) -> np.ndarray:
        stale = lag if self.on_lags else age.astype(np.float64)
        own = first[row]
        p = np.flatnonzero(np.arange(row.size) != own)
        if p.size:
            self._observe(np.abs(stale[p] - stale[own[p]]), M, own[p], M, p, key=devs[row[p]])
        rho = self._rho(self.estimate(devs))
        return pwg_scores(relative(stale, row, devs.size), rho[row])


def make_model_rule(rule: Rule, *, N: int, D: int, device) -> ModelRule:
    """The stateful aggregator of a model-reading rule in rounds (:func:`model_rule`)."""
    return model_rule(rule)
