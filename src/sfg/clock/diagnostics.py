"""Training diagnostics on the virtual clock's async and event protocols (docs/concepts/diagnostics.md#training-diagnostics on docs/concepts/clock.md#the-virtual-clock).

docs/concepts/diagnostics.md#training-diagnostics counts in rounds; here a *round* is one staleness unit (the period P under
``async``, Δ under ``event``): a local round's unit index is its ``t`` in the schedule
(:class:`sfg.clock.schedule.Schedule`; its wake index under async, ⌊time/Δ⌋ under event). A
*live neighbour* of a receiver is a candidate message held at its aggregation, with the
claims its header made, waited (docs/concepts/clock.md#the-virtual-clock: age τ + ⌊d⌋, lag ℓ + d for d units waited,
:func:`sfg.round.staleness.waited`); the receiver's own age and lag are its state before the
local round. The receiver's model is its pre-aggregation model (its previous local round's
output, or its initial model); a candidate's model is its sending local round's output (as
trained, before any attack poisons what is sent). Recorded:

* ``raw`` — at every local round whose unit index is a multiple of :data:`LAW_EVERY` and
  whose receiver has age 0: the squared distance from the receiver's model to each
  candidate's model, divided by the mean over its candidates of waited age 0 (local rounds
  with none, or whose mean is 0, skipped), binned by the candidate's waited age;
* ``lag`` — at the same local rounds, every receiver–candidate pair (whatever the
  receiver's age): the squared distance binned by |τ_i − τ_j| and by round(|ℓ_i − ℓ_j|), each
  normalised by the mean over the pairs with difference 0 of the same unit index (a unit is
  the clock's snapshot: ``snapshots`` counts the units that normalised anything), fitted by
  :func:`sfg.sim.diagnostics.law_rates`;
* ``finetune`` — per unit index that is a multiple of :data:`FINETUNE_EVERY`: among its
  local rounds whose receiver has age 0, at least one candidate of waited age 0 and at least
  one of waited age ≥ 1, up to :data:`FINETUNE_RECEIVERS` chosen uniformly without
  replacement from the diagnostics stream ``("diagnostics", "finetune", t)`` (one uniform key
  per local round of the unit, in schedule order; the smallest keys among the eligible are
  chosen, so the choice is made as the levels run, keeping at most that many receivers'
  models); each runs the receiver's K local steps from its own model and from each
  candidate's model on one common minibatch sequence (stream ``diagnostics-finetune-<i>``
  keyed by t), recorded by the candidate's waited age as in rounds
  (:meth:`sfg.sim.diagnostics.Recorder.record_finetune`);
* ``returning`` — a device's first full local round after an offline span (or, under an
  anatomy mode, after an offline wake's reduced local round), with D = its age at that local
  round (after the span): the validation loss and accuracy on its split of its stale model
  (pre-aggregation), of the aggregate, of the local round's output, of its model
  :data:`LATER` units later — the output of its last local round finished (its K steps done)
  at or before time + LATER·unit, when that is within the run and not before this local
  round's own — and the mean over its candidates' models; and its rule's weight on its own
  model.

The binning, normalisation, fits and JSON shape are :class:`sfg.sim.diagnostics.Recorder`'s,
the rounds' own, so ``sfg report`` and ``sfg run``'s table read both alike. The training loop
(:func:`sfg.clock.train.simulate_events`) hands every dependency level's batch of local
rounds to :meth:`EventDiagnostics.batch` and says when a level is done
(:meth:`EventDiagnostics.level_done`); everything is computed on the batch's tensors,
vectorised over its local rounds.

A header's age is 0 after a local round that trained, so a candidate's waited age is ⌊d⌋ for
d units waited: under the default window W = 1 it is 0 but for a message that waited exactly
one unit, and the age bins beyond 0 (the raw law's, the fine-tuning's eligibility) need a
longer window (``--window``); lags and the receivers' own ages vary under any window.

Memory stays bounded: a LATER model is evaluated when its local round is computed (the
returning local rounds awaiting theirs are kept as indices), the fine-tuning keeps copies of
at most :data:`FINETUNE_RECEIVERS` receivers' models per unit until the unit's last level,
and the lag law keeps one float per pair until its unit is done; the training's own pool of
models is not touched (its peak is the same with and without diagnostics). Diagnostics
read models and draw from their own streams: training is bit-identical with and without
them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from sfg.clock.schedule import LOCAL, OFFLINE, Schedule
from sfg.round.kernel import EV_ALL, FACTS
from sfg.sim.diagnostics import (
    FINETUNE_EVERY,
    FINETUNE_RECEIVERS,
    LATER,
    LAW_EVERY,
    Recorder,
    ValidationLoss,
    sq_dist,
)
from sfg.util.rng import stream

F_AGE, F_LAG = FACTS.index("age"), FACTS.index("lag")


def _take(X: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    return X.index_select(0, torch.as_tensor(np.asarray(idx, np.int64), device=X.device))


class EventDiagnostics(Recorder):
    """The diagnostics ``kinds`` of one async or event run (see the module docstring).

    ``sched``: the schedule; ``level`` [R]: the local rounds' dependency levels
    (:func:`sfg.clock.schedule._levels`); ``facts`` [R, F], ``hdr`` [5, R], ``hdr_lag`` [R],
    ``weights`` [C]: the staleness run's facts (the receiver's state before each event),
    headers and weights — complete, or filled level by level as the training runs them
    (rules that read models); ``finished_by(devs, q)``: each device's last local round whose
    K steps are done by time q, or −1 (the evaluations' own rule, from the training loop);
    ``seed``, ``val``, ``train_batches``, ``train``: as :class:`~sfg.sim.diagnostics.Recorder`.
    """

    def __init__(self, kinds: Iterable[str], *, sched: Schedule, level: np.ndarray,
                 facts: np.ndarray, hdr: np.ndarray, hdr_lag: np.ndarray, weights: np.ndarray,
                 finished_by: Callable[[np.ndarray, np.ndarray], np.ndarray], seed: int,
                 val: ValidationLoss | None = None,
                 train_batches: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
                 | None = None,
                 train: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
                 | None = None):
        super().__init__(kinds, seed=seed, val=val, train_batches=train_batches, train=train)
        s = sched
        self.sched = s
        self.facts, self.hdr, self.hdr_lag, self.weights = facts, hdr, hdr_lag, weights
        R = s.n_events
        local = s.kind == LOCAL
        loc = np.flatnonzero(local)
        # the last level holding a local round of each unit index (a unit's snapshot is done)
        self.unit_last = np.zeros(int(s.t[loc].max()) + 1 if loc.size else 0, np.int64)
        np.maximum.at(self.unit_last, s.t[loc], level[loc])
        self.law = local & (s.t % LAW_EVERY == 0)
        self.ft_unit = local & (s.t % FINETUNE_EVERY == 0) & (np.diff(s.cptr) >= 2)
        # returning: a full local round whose device's previous event was offline (an offline
        # span, or under an anatomy mode a reduced local round while offline)
        by = np.lexsort((np.arange(R), s.dev))
        before = np.full(R, -1, np.int64)
        same = s.dev[by][1:] == s.dev[by][:-1]
        before[by[1:][same]] = by[:-1][same]
        full = np.ones(R, bool) if s.caps is None else s.caps == EV_ALL
        offline = (s.kind == OFFLINE) | (local & ~full)
        self.returning = local & full & (before >= 0) & offline[np.maximum(before, 0)]
        # each returning local round's model LATER units on: its device's last local round
        # finished by then (the same rule as the evaluations'), if the run lasts
        self.later = np.full(R, -1, np.int64)
        ret = np.flatnonzero(self.returning)
        if ret.size:
            q = s.time[ret] + LATER * s.unit
            tgt = finished_by(s.dev[ret], q)
            ok = (tgt >= 0) & (q <= s.horizon) & (tgt >= ret)
            self.later[ret[ok]] = tgt[ok]
        self._lag_parts: list[tuple[np.ndarray, ...]] = []
        # fine-tuning: per unit, the chosen-so-far (key, local round, models, candidates' ages)
        self._ft: dict[int, list[tuple[float, int, torch.Tensor, np.ndarray]]] = {}
        self._keys: dict[int, np.ndarray] = {}
        ut = s.t[loc]
        self.unit_rounds = np.bincount(ut) if loc.size else np.zeros(0, np.int64)
        self.unit_rank = np.zeros(R, np.int64)  # a local round's rank among its unit's
        o = loc[np.lexsort((loc, ut))]
        starts = np.cumsum(self.unit_rounds) - self.unit_rounds
        self.unit_rank[o] = np.arange(o.size) - starts[s.t[o]]
        self._due_at = np.zeros(0, np.int64)  # LATER: the local rounds awaited, with D
        self._due_D = np.zeros(0, np.int64)

    def _claims(self, cidx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The waited age and lag of the candidate messages ``cidx`` (their headers' claims)."""
        from sfg.round.staleness import waited

        m = self.sched.cmsg[cidx]
        age, lag = waited.py_func(self.hdr[0, m], self.hdr_lag[m], self.sched.cwait[cidx])
        return np.asarray(age, np.int64), np.asarray(lag, np.float64)

    # -- the training loop's hooks
    def batch(self, ev: np.ndarray, cidx: np.ndarray, row: np.ndarray, first: np.ndarray,
              sent: torch.Tensor, agg: torch.Tensor, out: torch.Tensor) -> None:
        """One batch of local rounds ``ev``, with their candidates as the
        training gathered them (``cidx``, ``row``, ``first``: :func:`level_candidates`), the
        candidates' models ``sent`` [C', D] (the receiver's own first), the aggregates ``agg``
        and outputs ``out`` [len(ev), D]."""
        s, f = self.sched, self.facts
        nb = np.ones(cidx.size, bool)
        nb[first] = False
        nbpos = np.flatnonzero(nb)
        if {"raw", "lag"} & set(self.kinds):
            p = nbpos[self.law[ev[row[nbpos]]]]
            if p.size:
                d = sq_dist(sent, first[row[p]], p)
                age_j, lag_j = self._claims(cidx[p])
                e = ev[row[p]]
                age_i = f[e, F_AGE].astype(np.int64)
                if "raw" in self.kinds:
                    fresh = age_i == 0
                    self.record_raw(d[fresh], row[p][fresh], age_j[fresh])
                if "lag" in self.kinds:
                    self._lag_parts.append((s.t[e], d, age_i, age_j, f[e, F_LAG].copy(), lag_j))
        if "finetune" in self.kinds:
            self._stash_finetune(ev, cidx, row, first, nbpos, sent)
        if "returning" in self.kinds:
            self._returning(ev, cidx, row, first, nbpos, sent, agg, out)

    def level_done(self, L: int) -> None:
        """Level ``L`` is computed: record the units whose last local rounds it held (the lag
        law's per-unit normalisation, the fine-tuning of the chosen local rounds)."""
        if self._lag_parts:
            t = np.concatenate([p[0] for p in self._lag_parts])
            done = self.unit_last[t] <= L
            if done.any():
                cols = [np.concatenate([p[k] for p in self._lag_parts]) for k in range(6)]
                self.record_lag(cols[1][done], (cols[2][done], cols[3][done]),
                                (cols[4][done], cols[5][done]), t[done])
                self._lag_parts = [tuple(c[~done] for c in cols)] if not done.all() else []
        for u in [u for u in self._ft if self.unit_last[u] <= L]:
            self._finetune(u, self._ft.pop(u))
            self._keys.pop(u, None)

    # -- pieces
    def _stash_finetune(self, ev: np.ndarray, cidx: np.ndarray, row: np.ndarray,
                        first: np.ndarray, nbpos: np.ndarray, sent: torch.Tensor) -> None:
        """Keep, per unit, the eligible local rounds with the smallest keys so far (up to
        :data:`FINETUNE_RECEIVERS`) and a copy of their models (own first, then the
        candidates'): a uniform choice without replacement among the unit's eligible local
        rounds, decided as the levels run, in bounded memory."""
        s = self.sched
        rows = np.flatnonzero(self.ft_unit[ev] & (self.facts[ev, F_AGE] == 0))
        if rows.size == 0:
            return
        p = nbpos[np.isin(row[nbpos], rows)]
        age, _ = self._claims(cidx[p])
        fresh = np.bincount(row[p], weights=age == 0, minlength=ev.size) > 0
        stale = np.bincount(row[p], weights=age >= 1, minlength=ev.size) > 0
        rows = rows[fresh[rows] & stale[rows]]
        for u in np.unique(s.t[ev[rows]]):  # the units of one batch: few
            u = int(u)
            mine = rows[s.t[ev[rows]] == u]
            if u not in self._keys:  # one key per local round of the unit, by schedule order
                self._keys[u] = stream(self.seed, "diagnostics", "finetune", u).random(
                    int(self.unit_rounds[u]))
            key = self._keys[u][self.unit_rank[ev[mine]]]
            kept = self._ft.setdefault(u, [])
            both = np.concatenate([[k[0] for k in kept], key])
            top = np.sort(both)[:FINETUNE_RECEIVERS]
            sel = key <= top[-1]
            for r, k in zip(mine[sel], key[sel], strict=True):  # at most 16
                mp = p[row[p] == r]
                P = _take(sent, np.concatenate([[first[r]], mp]))
                kept.append((float(k), int(ev[r]), P, age[row[p] == r]))
            kept.sort(key=lambda x: x[0])
            del kept[FINETUNE_RECEIVERS:]

    def _finetune(self, u: int, kept: list[tuple[float, int, torch.Tensor, np.ndarray]]) -> None:
        kept = sorted(kept, key=lambda x: x[1])  # the chosen local rounds in schedule order
        e = np.array([k[1] for k in kept], np.int64)
        self.record_finetune(torch.cat([k[2] for k in kept]), [k[2].shape[0] for k in kept],
                             self.sched.dev[e], u, np.concatenate([k[3] for k in kept]))

    def _returning(self, ev: np.ndarray, cidx: np.ndarray, row: np.ndarray, first: np.ndarray,
                   nbpos: np.ndarray, sent: torch.Tensor, agg: torch.Tensor,
                   out: torch.Tensor) -> None:
        s = self.sched
        rr = np.flatnonzero(self.returning[ev])
        if rr.size:
            D = self.facts[ev[rr], F_AGE].astype(np.int64)
            pos = np.full(ev.size, -1, np.int64)
            pos[rr] = np.arange(rr.size)
            p = nbpos[pos[row[nbpos]] >= 0]
            self.record_returning(D, s.dev[ev[rr]], _take(sent, first[rr]), _take(agg, rr),
                                  _take(out, rr), self.weights[cidx[first[rr]]],
                                  _take(sent, p), pos[row[p]])
            tg = self.later[ev[rr]]
            ok = tg >= 0
            self._due_at = np.concatenate([self._due_at, tg[ok]])
            self._due_D = np.concatenate([self._due_D, D[ok]])
        if self._due_at.size:
            hit = np.isin(self._due_at, ev)
            if hit.any():
                at = self._due_at[hit]
                o = np.argsort(ev)
                self.record_later(self._due_D[hit], s.dev[at],
                                  _take(out, o[np.searchsorted(ev[o], at)]))
                self._due_at, self._due_D = self._due_at[~hit], self._due_D[~hit]

    def result(self) -> dict[str, Any]:
        assert not self._lag_parts and not self._ft, "a unit's diagnostics were left pending"
        return super().result()
