"""Rules that read models (SPEC §3.2) on the async and event protocols: their scores,
computed from the candidates' models one dependency level at a time
(:func:`sfg.clock.train.simulate_events`), enter the events' compiled weights as given scores
(:func:`sfg.round.kernel.run_events`), which apply the rule's modifiers and defences and
update the staleness state like any rule's.

* ``relative-variance``: as in rounds (:class:`sfg.sim.model_rules.RelativeVariance`): per
  slot, v_ij ← (1−ν) v_ij + ν ‖x_j − x_i^prev‖² at each of i's aggregations over its
  candidates (itself included; v starts at the first observation), h_ij = 1/v_ij, with
  x_j the model a message carried (the receiver's own: its current model) and x_i^prev the
  receiver's previous aggregate (the initial model before its first).
* ``pwg`` / ``pwg-l``: h_j = 1/(1 + ρ Δ_j), Δ_j the candidate's age (lag) relative to the
  freshest candidate, as received (waited: age τ + ⌊d⌋, lag ℓ + d). ρ̂ is estimated as in
  rounds (running means m(x) of squared model distances by staleness difference x = 1..20,
  normalised by m(0), slope through the origin, ρ̂ = max(0, 2·slope)), **per receiver**: on
  the clock no round exists in which all live pairs are seen at once, so each device
  regresses the pairs it observes itself (its own model against each candidate's, at each
  of its aggregations), a decentralised estimator that needs no global view. ``H`` and a
  fixed ``rho`` ≥ 0 as in rounds.

Each object has ``scores(M, row, first, devs, slots, age, lag) -> h`` (one score per
candidate of the level's local rounds: M their models, ``row`` the local round of each,
``first`` each round's own entry, ``devs`` the receivers, ``slots`` the candidates' slots,
``age``/``lag`` their staleness as the rule sees it) and ``adopted(devs, agg)``.
"""

from __future__ import annotations

import numpy as np
import torch

from sfg.errors import SfgError
from sfg.round.rules import Rule
from sfg.sim.model_rules import PWG_MAX_X, pwg_rate, pwg_scores, rv_scores, rv_update


def _sq(A: torch.Tensor, B: torch.Tensor) -> np.ndarray:
    return (A - B).double().pow(2).sum(1).cpu().numpy()


class RelativeVariance:
    def __init__(self, rule: Rule, n_slots: int, X0: torch.Tensor):
        self.nu = float(rule.params["nu"])
        if not 0 < self.nu <= 1:
            raise SfgError(f"relative-variance: nu={self.nu} must lie in (0, 1]")
        self.v = np.full(n_slots, np.nan)
        self.prev = X0.clone()

    def scores(self, M, row, first, devs, slots, age, lag, **_) -> np.ndarray:
        rec = torch.from_numpy(devs[row]).to(M.device)
        d2 = _sq(M, self.prev[rec])
        self.v[slots] = rv_update(self.v[slots], d2, self.nu)
        return rv_scores(self.v[slots])

    def adopted(self, devs: np.ndarray, agg: torch.Tensor, **_) -> None:
        self.prev[torch.from_numpy(devs).to(agg.device)] = agg


class PrecisionWeightedGossip:
    def __init__(self, rule: Rule, n: int, *, on_lags: bool):
        self.on_lags = on_lags
        self.H = float(rule.params["H"])
        self.rho_fixed = float(rule.params["rho"])
        if self.H < 0:
            raise SfgError(f"{rule.name}: H={self.H} must be >= 0")
        self.sums = np.zeros((n, PWG_MAX_X + 1))
        self.counts = np.zeros((n, PWG_MAX_X + 1))

    def estimate(self, devs: np.ndarray) -> np.ndarray:
        """ρ̂ of each receiver in ``devs`` from its own running means (the rounds' estimator,
        :func:`sfg.sim.model_rules.pwg_rate`, one per receiver)."""
        return pwg_rate(self.sums[devs], self.counts[devs])

    def scores(self, M, row, first, devs, slots, age, lag, **_) -> np.ndarray:
        stale = lag if self.on_lags else age.astype(np.float64)
        own = first[row]
        pair = np.flatnonzero(np.arange(row.size) != own)
        if pair.size:
            diff = np.abs(stale[pair] - stale[own[pair]])
            xbin = np.rint(diff).astype(np.int64)
            ok = xbin <= PWG_MAX_X
            p = pair[ok]
            d2 = _sq(M[torch.from_numpy(own[p]).to(M.device)], M[torch.from_numpy(p).to(M.device)])
            rec = devs[row[p]]
            np.add.at(self.sums, (rec, xbin[ok]), d2)
            np.add.at(self.counts, (rec, xbin[ok]), 1)
        rho = np.full(devs.size, self.rho_fixed) if self.rho_fixed >= 0 else \
            self.H * self.estimate(devs)
        lowest = np.full(devs.size, np.inf)
        np.minimum.at(lowest, row, stale)
        return pwg_scores(stale - lowest[row], rho[row])

    def adopted(self, devs: np.ndarray, agg: torch.Tensor, **_) -> None:
        return None


def make_scorer(rule: Rule, *, n: int, n_slots: int, X0: torch.Tensor, sched=None,
                prev=None):
    """The scores of a model-reading rule (see the module docstring) or an oracle
    (:class:`sfg.clock.missed.MissedRows`, which needs the schedule and its levels' ``prev``)
    on the clock."""
    if rule.oracle:
        from sfg.clock.missed import MissedRows

        return None if sched is None else MissedRows(rule, sched, prev, n)
    if rule.name == "relative-variance":
        return RelativeVariance(rule, n_slots, X0)
    if rule.name in ("pwg", "pwg-l"):
        return PrecisionWeightedGossip(rule, n, on_lags=rule.name == "pwg-l")
    raise SfgError(f"rule {rule.name!r} reads models; on the async and event protocols the "
                   "model-reading rules are relative-variance, pwg, pwg-l and model-memory*")
