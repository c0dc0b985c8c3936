"""The oracles (docs/concepts/rules.md#oracles) on the async and event protocols: the missed-fraction matrix A
(docs/concepts/staleness.md#the-staleness-state) in time, and the oracles' scores from it.

In rounds, row A_i[t] is the fraction of round t's update missing from model i's lineage:
each round the adopters' rows become Σ_j w_ij A_j and column t is 1 for the clients that did
not train. On the clock the columns are the staleness units (one period P under ``async``,
one Δ under ``event``) and a row belongs to each model a local round makes: a local round of
device i at unit u starts from its previous row with the units it did not train in since its
previous local round set to 1 (all units before u for its first), mixes it with the rows its
candidates' messages carried (Σ_c w_c A_c, the weights of the local round), and sets column
u to 0 (it trained). The oracle scores each local round's candidates from their rows, as in
rounds (:mod:`sfg.round.rules.oracles`: the same functions), and the scores enter the events'
compiled weights as given scores. The scores need the weights of earlier local rounds, so the
events run one dependency level at a time (:func:`sfg.clock.schedule.level_plan`; the same
results as time order). The oracles stay analysis tools: they read every candidate's row.

No torch: the model-free replay runs them too (:func:`oracle_scores`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sfg.clock.schedule import EV_TRAIN, Schedule, level_candidates, level_plan
from sfg.round.rules import Rule


class MissedRows:
    """A's rows per local round, kept while a later local round reads them."""

    def __init__(self, rule: Rule, sched: Schedule, prev: np.ndarray, n: int):
        self.fn = rule.fn
        self.params = {k: v for k, v in rule.params.items() if k != "c"}
        self.sched, self.prev, self.n = sched, prev, n
        self.T = max(1, int(np.ceil(sched.horizon / sched.unit)))
        self.unit_of = np.minimum((sched.time // sched.unit).astype(np.int64), self.T - 1)
        self.rows: dict[int, np.ndarray] = {}
        self._stacked: np.ndarray | None = None

    def _own(self, e: int) -> np.ndarray:
        p = int(self.prev[e])
        row = self.rows[p].copy() if p >= 0 else np.zeros(self.T)
        start = int(self.unit_of[p]) + 1 if p >= 0 else 0
        row[start:int(self.unit_of[e])] = 1.0  # units it did not train in
        return row

    def scores(self, M: Any, row: np.ndarray, first: np.ndarray, devs: np.ndarray,
               slots: np.ndarray, age: Any, lag: Any, *, ev: np.ndarray,
               cidx: np.ndarray) -> np.ndarray:
        """The oracle's scores of the level's candidates (``cidx``, grouped by local round
        ``ev``; ``row``/``first`` as in :mod:`sfg.clock.scored`)."""
        s = self.sched
        stacked = np.empty((cidx.size, self.T))
        msg = s.cmsg[cidx]
        for k in range(cidx.size):
            stacked[k] = self._own(int(ev[row[k]])) if msg[k] < 0 else self.rows[int(msg[k])]
        self._stacked = stacked
        lens = np.bincount(row, minlength=ev.size)
        indptr = np.zeros(ev.size + 1, np.int64)
        np.cumsum(lens, out=indptr[1:])
        return self.fn(indptr, np.arange(cidx.size), np.ones(cidx.size, bool), stacked,
                       **self.params)

    def adopted(self, devs: np.ndarray, agg: Any, *, ev: np.ndarray, cidx: np.ndarray,
                row: np.ndarray, weights: np.ndarray) -> None:
        """The level's new rows: Σ_c w_c A_c, then the local round's own unit: 0 if it
        trained, 1 if it could not (an anatomy mode's offline local round, docs/concepts/outages.md#anatomy-modes)."""
        assert self._stacked is not None
        new = np.zeros((ev.size, self.T))
        np.add.at(new, row, weights[cidx][:, None] * self._stacked)
        trained = np.ones(ev.size, bool) if self.sched.caps is None else \
            (self.sched.caps[ev] & EV_TRAIN) != 0
        new[np.arange(ev.size), self.unit_of[ev]] = np.where(trained, 0.0, 1.0)
        for k, e in enumerate(ev):
            self.rows[int(e)] = new[k]
        self._stacked = None

    def drop(self, events: np.ndarray) -> None:
        for e in events:
            self.rows.pop(int(e), None)


def oracle_scores(es, rule: Rule, sched: Schedule, n: int) -> np.ndarray:
    """Run the events of ``es`` (:class:`sfg.clock.replay.EventStaleness`) level by level
    with the oracle's scores; returns the given scores [C] (a second pass in time order with
    them reproduces every weight, and samples the curves)."""
    plan = level_plan(sched, n)
    rows = MissedRows(rule, sched, plan["prev"], n)
    given = np.zeros(int(sched.cptr[-1]))
    level, prev = plan["level"], plan["prev"]
    # the last level at which each local round's row is read (its device's next local round
    # and its messages' receivers), after which it is dropped
    last = level.copy()
    has = prev >= 0
    np.maximum.at(last, prev[has], level[has])
    owner = np.repeat(np.arange(sched.n_events), np.diff(sched.cptr))
    nb = np.flatnonzero(sched.cmsg >= 0)
    np.maximum.at(last, sched.cmsg[nb], level[owner[nb]])
    loc = np.flatnonzero(sched.kind == 0)
    order = loc[np.argsort(last[loc], kind="stable")]
    cut = np.searchsorted(last[order], np.arange(0, plan["n_levels"] + 2), side="right")
    for L in range(1, plan["n_levels"] + 1):
        es.run(order=plan["offline"](L), given=given)
        ev = plan["local"](L)
        cidx, row, first = level_candidates(sched, ev)
        given[cidx] = rows.scores(None, row, first, sched.dev[ev], sched.cslot[cidx], None,
                                  None, ev=ev, cidx=cidx)
        es.run(order=ev, given=given)
        rows.adopted(sched.dev[ev], None, ev=ev, cidx=cidx, row=row, weights=es.w)
        rows.drop(order[cut[L - 1]:cut[L]])
    es.run(order=plan["offline"](plan["n_levels"] + 1), given=given)
    return given
