"""Staleness state and its one-round update (SPEC §2).

One scalar per model, piggybacked on messages. The update is a single vectorised function of
the weights the round used; there is no Python loop over clients.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .rounds import RoundGraph

Q_HAT_BETA = 0.1
Q_HAT_FLOOR = 0.05


@dataclass(frozen=True)
class StalenessState:
    """Per-client staleness at the start of round ``t`` (SPEC §2).

    t:            round index
    ages:         [N] int64  τ_i, rounds since the model was last trained
    lags:         [N] float64 ℓ_i, effective lag (row sums of ``missed``)
    counts:       [N] int64  n_i, max-inherited update count (gossip learning), starts at 1
    local_counts: [N] int64  per-client update counters that are never inherited, start at 1
    q_hat:        [E] float64 link-reception estimates per slot of the RoundGraph (self slots 1)
    missed:       [N, T] float64 or None, the missed-fraction matrix A (analysis only)
    """

    t: int
    ages: np.ndarray
    lags: np.ndarray
    counts: np.ndarray
    local_counts: np.ndarray
    q_hat: np.ndarray
    missed: np.ndarray | None = None

    @property
    def mean_counts(self) -> np.ndarray:
        """Mean-inherited counts n̄_j = 1 + t − ℓ_j (SPEC §2)."""
        return 1.0 + self.t - self.lags


def init_state(rg: RoundGraph, *, rounds: int | None = None, track_missed: bool = False) -> StalenessState:
    """The round-0 state: ages 0, lags 0, counts 1, q̂ 1; ``missed`` [N, rounds] when tracked."""
    n = rg.n
    missed = None
    if track_missed:
        if rounds is None:
            raise ValueError("track_missed needs the number of rounds")
        missed = np.zeros((n, rounds))
    return StalenessState(
        t=0,
        ages=np.zeros(n, np.int64),
        lags=np.zeros(n, np.float64),
        counts=np.ones(n, np.int64),
        local_counts=np.ones(n, np.int64),
        q_hat=np.ones(rg.n_slots, np.float64),
        missed=missed,
    )


def _seg_reduce(ufunc, values: np.ndarray, rg: RoundGraph) -> np.ndarray:
    return ufunc.reduceat(values, rg.indptr[:-1])


def update_state(
    state: StalenessState,
    rg: RoundGraph,
    weights: np.ndarray,
    candidate: np.ndarray,
    *,
    trains: np.ndarray,
    adopts: np.ndarray,
    aggregates: np.ndarray | None = None,
    beta: float = Q_HAT_BETA,
    slot_ages: np.ndarray | None = None,
    slot_lags: np.ndarray | None = None,
    slot_counts: np.ndarray | None = None,
) -> StalenessState:
    """Advance the state by one round, given the weights used (SPEC §2, anatomy modes §4.1).

    weights:    [E] float64 row-stochastic slot weights used this round (identity rows where a
                client did not adopt an aggregate)
    candidate:  [E] bool    slots in the candidate sets S_i^t
    trains:     [N] bool    clients that ran local training this round
    adopts:     [N] bool    clients whose model became their aggregate
    aggregates: [N] bool    clients that formed candidate sets (q̂ is updated for them);
                defaults to ``adopts``
    slot_ages, slot_lags, slot_counts: [E] staleness of the model each slot delivered; default
                the sender's current state (differs only for remembered models, model-memory)

    * age: 0 after training; an aggregate adopted without training is one round older than
      the youngest model it merged; otherwise +1.
    * lag: Σ_j w_ij ℓ_j when adopting, else unchanged; +1 when the client did not train
      (so that lags stay the row sums of A, whose column t is 1 for clients that did not train).
    * max-inherited count: max over merged candidates when adopting, +1 when training.
    * q̂: EWMA over the rounds a client aggregates, floored at 0.05.
    """
    if aggregates is None:
        aggregates = adopts
    recv, send = rg.recv, rg.send
    not_trained = ~trains
    merged = weights > 0

    s_age = state.ages[send] if slot_ages is None else slot_ages
    s_lag = state.lags[send] if slot_lags is None else slot_lags
    s_cnt = state.counts[send] if slot_counts is None else slot_counts
    lag_mix = np.bincount(recv, weights=weights * s_lag, minlength=rg.n)
    lags = np.where(adopts, lag_mix, state.lags) + not_trained

    big = np.iinfo(np.int64).max
    youngest = _seg_reduce(np.minimum, np.where(merged, s_age, big), rg)
    ages = np.where(trains, 0, np.where(adopts, youngest + 1, state.ages + 1)).astype(np.int64)

    inherited = _seg_reduce(np.maximum, np.where(merged, s_cnt, 0), rg)
    counts = np.where(adopts, inherited, state.counts) + trains

    local_counts = state.local_counts + trains

    q_hat = state.q_hat
    upd = aggregates[recv] & ~rg.is_self
    if upd.any():
        q_hat = q_hat.copy()
        q_hat[upd] = np.maximum((1 - beta) * q_hat[upd] + beta * candidate[upd], Q_HAT_FLOOR)

    missed = state.missed
    if missed is not None:
        W = rg.to_sparse(weights)
        mixed = W @ missed
        missed = np.where(adopts[:, None], mixed, missed)
        missed[:, state.t] = not_trained

    return replace(
        state,
        t=state.t + 1,
        ages=ages,
        lags=lags,
        counts=counts.astype(np.int64),
        local_counts=local_counts.astype(np.int64),
        q_hat=q_hat,
        missed=missed,
    )
