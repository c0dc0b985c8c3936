"""The model-free part of one round (SPEC §1–2): candidates, weights, staleness update.

Shared by the trace replay (:mod:`sfg.replay`) and the training simulator (:mod:`sfg.sim`),
so that both compute exactly the same weights for the same trace, graph, rule and seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .outages.anatomy import Capabilities
from .rng import stream
from .rounds import RoundGraph
from .rules import BatchSlots, Rule
from .staleness import StalenessState, update_state


@dataclass(frozen=True)
class RoundWeights:
    """What one round's aggregation used.

    weights:   [E] float64 slot weights (rows sum to 1; identity rows for non-adopters)
    candidate: [E] bool    slots in S_i^t (empty rows for clients that do not aggregate)
    slots:     the BatchSlots view the rule saw
    """

    weights: np.ndarray
    candidate: np.ndarray
    slots: BatchSlots


def caps_at(caps: Capabilities, t: int) -> Capabilities:
    """Round ``t``'s capabilities ([N] each) out of whole-trace capabilities ([T, N] each)."""
    return Capabilities(caps.train[t], caps.send[t], caps.aggregate[t], caps.adopt[t])


def candidate_mask(rg: RoundGraph, caps: Capabilities, live: np.ndarray | None = None) -> np.ndarray:
    """S_i^t = {i} ∪ {j ∈ N(i): j sends and link (i, j) is live}, for receivers that aggregate.

    live: [M] bool per undirected edge, or None (all links live).
    """
    nb = caps.send[rg.send]
    if live is not None:
        nb = nb & live[np.maximum(rg.edge_id, 0)]
    return caps.aggregate[rg.recv] & (rg.is_self | nb)


def rule_draws(seed: int, t: int, n: int, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """A random rule's own draws of round ``t``: one uniform per client ([n]) and one key
    per slot ([n_slots]), from the stream keyed by the seed and the round."""
    g = stream(seed, "rule-draws", t)
    return g.random(n), g.random(n_slots)


def batch_slots(rg: RoundGraph, state: StalenessState, candidate: np.ndarray, *,
                rule: Rule | None, seed: int) -> BatchSlots:
    """The read-only view of round ``state.t`` that a rule sees (``rule`` None: no draws)."""
    send = rg.send
    if rule is not None and rule.random:
        u_client, key = rule_draws(seed, state.t, rg.n, rg.n_slots)
        u = u_client[rg.recv]
    else:
        u = key = np.zeros(rg.n_slots)
    return BatchSlots(rg=rg, t=state.t, is_self=rg.is_self, cand=candidate,
                      age=state.ages[send], lag=state.lags[send], count=state.counts[send],
                      local_count=state.local_counts[send], q=state.q_hat, u=u, key=key,
                      missed=None if state.missed is None else state.missed[send])


def round_weights(rule: Rule, rg: RoundGraph, state: StalenessState, caps: Capabilities, *,
                  seed: int, live: np.ndarray | None = None) -> RoundWeights:
    """Candidates and the rule's weights for round ``state.t``; adopters only get mixed rows."""
    cand = candidate_mask(rg, caps, live)
    slots = batch_slots(rg, state, cand, rule=rule, seed=seed)
    w = rule.weights(slots, aggregating=caps.adopt)
    return RoundWeights(weights=w, candidate=cand, slots=slots)


def advance(state: StalenessState, rg: RoundGraph, rw: RoundWeights, caps: Capabilities) -> StalenessState:
    """Staleness update after the round's aggregation and training (SPEC §2)."""
    return update_state(state, rg, rw.weights, rw.candidate, trains=caps.train,
                        adopts=caps.adopt, aggregates=caps.aggregate, slot_ages=rw.slots.age,
                        slot_lags=rw.slots.lag, slot_counts=rw.slots.count)
