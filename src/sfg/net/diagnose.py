"""The training diagnostics (docs/concepts/diagnostics.md#training-diagnostics) measured by a networked node (docs/concepts/nodes.md#networked-nodes, docs/concepts/clock.md#the-node-on-the-clock).

A node sees one receiver: itself. At each of its local rounds that aggregates and trains
(a local round discarded because the node went offline before its K steps were done records
nothing, as it changes nothing) :meth:`NodeDiagnostics.local_round` is handed what the node
holds — its own model and staleness state before the round, the candidates' models with the
claims their headers made (waited, as the node uses them: age τ + ⌊d⌋, lag ℓ + d for d
periods waited; lockstep: d = 0), its rule's weight on its own model, the aggregate and the
trained model — and records, with :class:`sfg.sim.diagnostics.Recorder`'s definitions,
bins and normalisations (the same code; a *round* is the node's own round index r, one
period P under ``async``):

* ``raw`` — at local rounds with r a multiple of :data:`~sfg.sim.diagnostics.LAW_EVERY` whose
  own age is 0: the squared distance to each candidate's model divided by the mean over the
  candidates of (waited) age 0, binned by the candidate's age — per receiver, as in rounds
  and on the clock;
* ``lag`` — at the same local rounds, the squared distance of each pair (the node, a
  candidate) binned by |τ_i − τ_j| and round(|ℓ_i − ℓ_j|). The law divides by the mean over
  the *snapshot's* pairs with difference 0 — all nodes' pairs of round r, which no node sees.
  So a node stores the snapshot's distances unnormalised (per-bin sums and counts of round
  r), the swarm adds them over nodes per round (:func:`pool`) and then normalises each
  round by its own zero-difference pairs (:func:`sfg.sim.diagnostics.lag_law`): the rounds'
  and the clock's law. Lockstep (docs/concepts/nodes.md#lockstep-mode): the two ends of a pair see each other's
  start-of-round models and scalars, so each unordered pair is measured once, by its lower
  id, as in rounds. Async: every receiver–candidate pair, as the clock's engine counts them
  (the two directions are two measurements: each receiver's view of an older model of the
  other, at its own wake);
* ``finetune`` — at local rounds with r a multiple of
  :data:`~sfg.sim.diagnostics.FINETUNE_EVERY` whose own age is 0 and that hold a candidate
  of age 0 and one of age ≥ 1: the node runs its K local steps from its own model and from
  each candidate's model on one common minibatch sequence of its own data (its stream
  ``diagnostics-finetune-<i>`` keyed by r, :func:`~sfg.sim.diagnostics.finetune_minibatches`)
  and records :meth:`~sfg.sim.diagnostics.Recorder.record_finetune`'s columns on its own
  validation split. Rounds and the clock fine-tune at most
  :data:`~sfg.sim.diagnostics.FINETUNE_RECEIVERS` receivers per round, chosen from all
  eligible ones — a choice no node can make alone; a node fine-tunes at every eligible local
  round (its own neighbourhood only: (degree + 1)·K steps every 10 rounds). With at most
  16 eligible receivers per round the two coincide;
* ``returning`` — a local round whose own age is D ≥ 1 (its previous round, or under
  ``async`` its previous wake that was not skipped or interrupted, was offline: exactly the
  rounds' "unavailable at t − 1" and the clock's "previous event offline"): the validation
  loss and accuracy of its stale model, the aggregate, the trained model, the mean over its
  candidates' models and its rule's own weight, binned by D; and its model
  :data:`~sfg.sim.diagnostics.LATER` rounds later — the output of its last local round done
  by then (lockstep: round r + LATER, if r + LATER < T; async: done by wake time + LATER·P
  on its own clock, if that is within the run's T periods, the clock engine's rule).

A node's candidates' models are what it received: under a poisoning attack (``model=constant``)
the model sent, where the clock's engine reads the model as trained. Claims are those its rule
used: the headers' (forged ones too), waited, and clamped where the rule has ``+guard`` or
``+relative`` (the clock bins by the headers' claims before any clamp: the two differ only
for clamped claims). Everything is kept in memory: a node restarted from its checkpoint
records from its restart on.

What it reads besides the models is the run's (:attr:`sfg.net.world.World.diagnostic_tools`): the validation splits
and fine-tuning minibatches every engine's diagnostics read
(:meth:`sfg.sim.context.Run.diagnostic_tools`) and the run's local training on the node's
own backend at the run's precision (``precision``, :mod:`sfg.sim.precision`), so a node's
diagnostics are computed as its training is.

Results are JSON-ready per-bin sums and counts (:meth:`NodeDiagnostics.result`); the swarm
adds its nodes' with :func:`pool` into the rounds' JSON shape (the report reads both alike).
Diagnostics read the node's models and draw from their own streams: training is
bit-identical with and without them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from sfg.sim.diagnostics import (
    FINETUNE_COLUMNS,
    FINETUNE_EVERY,
    KINDS,
    LATER,
    LAW_EVERY,
    RETURN_COLUMNS,
    Binned,
    Recorder,
    lag_bins,
    lag_law,
    parse_diagnostics,
    sq_dist,
)
from sfg.sim.diagnostics import pool as pool_binned


def _rows(models: Sequence[np.ndarray]) -> torch.Tensor:
    """[m, D] the models as the node holds them (the run's parameters; no cast)."""
    return torch.from_numpy(np.stack([np.asarray(m) for m in models]))


class NodeDiagnostics(Recorder):
    """The diagnostics ``kinds`` of node ``i`` (see the module docstring).

    ``lockstep``: the node's mode (pairs once, by the lower id; times are round indices);
    ``unit``: seconds per round on the node's clock (async: P; lockstep: 1); ``rounds``: T;
    ``origin()``: the start of round 0 on the node's clock (async; read when needed, as a
    node sets it when it starts). The last time whose model counts as LATER: async
    origin + T·unit, lockstep round T − 1. ``tools``: ``val``, ``train_batches``, ``train``
    as :class:`~sfg.sim.diagnostics.Recorder` reads them, with client ids (default:
    :attr:`sfg.net.world.World.diagnostic_tools`)."""

    def __init__(self, kinds: Iterable[str], *, world: Any, i: int, lockstep: bool,
                 unit: float, rounds: int, origin: Callable[[], float] | None = None,
                 tools: Mapping[str, Any] | None = None):
        kinds = parse_diagnostics(list(kinds))
        tools = dict(world.diagnostic_tools if tools is None else tools)
        super().__init__(kinds, seed=world.seed, **tools)
        self.i, self.lockstep = int(i), bool(lockstep)
        self.unit, self.rounds = float(unit), int(rounds)
        self.origin = origin or (lambda: 0.0)
        self.units: dict[int, dict[str, Binned]] = {}  # lag law: round -> unnormalised sums
        self._last: tuple[float, np.ndarray] | None = None  # (end, model) of the last round
        self._due: list[tuple[float, int]] = []  # returning rounds awaiting LATER: (q, D)

    @classmethod
    def for_node(cls, node: Any) -> NodeDiagnostics | None:
        """The recorder of a :class:`sfg.net.node.Node` (None when the run asks for no
        diagnostics)."""
        world = node.world
        kinds = parse_diagnostics(world.cfg.get("diagnostics") or "")
        if not kinds:
            return None
        lockstep = node.cfg.mode == "lockstep"
        return cls(kinds, world=world, i=node.i, lockstep=lockstep,
                   unit=1.0 if lockstep else float(node.cfg.period), rounds=world.rounds,
                   origin=lambda: float(node.t0 or 0.0))

    @property
    def horizon(self) -> float:
        """The last time whose model counts as LATER (lockstep: round T − 1)."""
        return self.rounds - 1.0 if self.lockstep else self.origin() + self.rounds * self.unit

    # -- the hook
    def local_round(self, r: int, *, own: np.ndarray, age: int, lag: float,
                    senders: ArrayLike, models: Sequence[np.ndarray],
                    ages: ArrayLike, lags: ArrayLike, self_weight: float,
                    agg: np.ndarray, trained: np.ndarray, start: float | None = None,
                    end: float | None = None) -> None:
        """One local round r of the node that aggregated and trained: its model ``own`` and
        staleness (``age``, ``lag``) before it; the candidates ``senders`` (neighbour ids)
        with their ``models`` and header claims as used (``ages``, ``lags``: waited); its
        rule's weight on its own model; the aggregate ``agg`` and the ``trained`` model.
        ``start``/``end``: when it aggregated and when its K steps were done, on the node's
        clock (async; lockstep: the round index)."""
        r, age = int(r), int(age)
        start = float(r if start is None or self.lockstep else start)
        end = float(r if end is None or self.lockstep else end)
        ids = np.asarray(senders, np.int64).reshape(-1)
        order = np.argsort(ids, kind="stable")  # slot order
        ids = ids[order]
        a_j = np.asarray(ages, np.int64).reshape(-1)[order]
        l_j = np.asarray(lags, np.float64).reshape(-1)[order]
        X = _rows([own, *[models[k] for k in order]])  # own model first, then candidates
        k = ids.size
        law = r % LAW_EVERY == 0 and k > 0
        if "raw" in self.kinds and law and age == 0:
            self.record_raw(sq_dist(X, np.zeros(k, np.int64), np.arange(1, k + 1)),
                            np.zeros(k, np.int64), a_j)
        if "lag" in self.kinds and law:
            pair = ids > self.i if self.lockstep else np.ones(k, bool)
            if pair.any():
                nb = np.flatnonzero(pair) + 1
                d = sq_dist(X, np.zeros(nb.size, np.int64), nb)
                unit = self.units.setdefault(r, {"age": Binned(["d"]), "lag": Binned(["d"])})
                diffs = lag_bins((np.full(nb.size, age), a_j[pair]),
                                 (np.full(nb.size, float(lag)), l_j[pair]))
                for by, x in diffs.items():
                    unit[by].add("d", x, d)
        if ("finetune" in self.kinds and r % FINETUNE_EVERY == 0 and age == 0
                and (a_j == 0).any() and (a_j >= 1).any()):
            self.record_finetune(X, [k + 1], [self.i], r, a_j)
        if "returning" in self.kinds:
            self._returning(r, age, start, end, X, self_weight, agg, trained)

    def commit(self, r: int, *, own: np.ndarray, age: int, lag: float, full: Mapping[str, Any],
               neighbours: ArrayLike, models: Sequence[np.ndarray], agg: np.ndarray,
               trained: np.ndarray, start: float | None = None,
               end: float | None = None) -> None:
        """:meth:`local_round` from the node's own record of the round: ``full`` per slot of
        its star (itself, then ``neighbours`` in order): ``cand``, ``weights`` and the claims
        ``ages``/``lags`` as its rule used them; ``models`` the candidates' in that order."""
        cand = np.flatnonzero(np.asarray(full["cand"], bool)[1:])
        self.local_round(r, own=own, age=age, lag=lag,
                         senders=np.asarray(neighbours, np.int64)[cand], models=models,
                         ages=np.asarray(full["ages"])[1:][cand],
                         lags=np.asarray(full["lags"])[1:][cand],
                         self_weight=float(full["weights"][0]), agg=agg, trained=trained,
                         start=start, end=end)

    # -- pieces
    def _returning(self, r: int, D: int, start: float, end: float, X: torch.Tensor,
                   self_weight: float, agg: np.ndarray, trained: np.ndarray) -> None:
        # returning rounds whose LATER time passed before this round was done: the model
        # then is the previous local round's output
        if self._last is not None:
            self._resolve([d for d in self._due if d[0] < end], self._last[1])
        self._due = [d for d in self._due if d[0] >= end]
        self._last = (end, trained)
        if D < 1:
            return
        k = X.shape[0] - 1
        self.record_returning([D], [self.i], X[:1], _rows([agg]), _rows([trained]), [self_weight],
                              X[1:], np.zeros(k, np.int64))
        q = start + LATER * self.unit
        if q <= self.horizon and end <= q:
            self._due.append((q, D))

    def _resolve(self, due: list[tuple[float, int]], model: np.ndarray) -> None:
        if due:
            self.record_later(np.array([d for _, d in due], np.int64),
                              np.full(len(due), self.i, np.int64), _rows([model] * len(due)))

    # -- the result
    def result(self) -> dict[str, Any]:
        """JSON-ready per-bin sums and counts (the lag law's per round, unnormalised);
        :func:`pool` adds nodes' results into the rounds' shape."""
        if self._last is not None:  # the run is over: the last model is the one LATER on
            self._resolve(self._due, self._last[1])
            self._due = []
        out = super().result()
        if "lag" in self.kinds:
            out["lag"] = {"units": {str(u): {by: b.to_json() for by, b in v.items()}
                                    for u, v in sorted(self.units.items())}}
        return out


def pool(results: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The swarm's diagnostics from its nodes' :meth:`NodeDiagnostics.result` (None for a
    node without): per-bin sums and counts added over nodes, the lag law's per round before
    it is normalised (:func:`sfg.sim.diagnostics.lag_law`); the JSON of
    :meth:`sfg.sim.diagnostics.Recorder.result` (None when no node recorded any)."""
    res = [r for r in results if r]
    if not res:
        return None
    have = {k for r in res for k in r["kinds"]}
    kinds = [k for k in KINDS if k in have]
    out: dict[str, Any] = {"kinds": kinds}
    if "raw" in kinds:
        out["raw"] = _binned([r["raw"] for r in res if "raw" in r], ["ratio"])
    if "lag" in kinds:
        units: dict[str, list] = {}
        for r in res:
            for u, v in r.get("lag", {}).get("units", {}).items():
                units.setdefault(u, []).append(v)
        out["lag"] = lag_law({by: _binned([v[by] for v in vs], ["d"]) for by in ("age", "lag")}
                             for _, vs in sorted(units.items(), key=lambda x: int(x[0])))
    if "finetune" in kinds:
        ft = [r["finetune"] for r in res if "finetune" in r]
        out["finetune"] = {**_binned(ft, FINETUNE_COLUMNS),
                           "receivers": int(sum(f["receivers"] for f in ft)),
                           "own_loss": _pair(f["own_loss"] for f in ft),
                           "own_acc": _pair(f["own_acc"] for f in ft)}
    if "returning" in kinds:
        ret = [r["returning"] for r in res if "returning" in r]
        out["returning"] = {**_binned(ret, RETURN_COLUMNS),
                            "returns": int(sum(x["returns"] for x in ret))}
    return out


def _binned(blocks: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, Any]:
    pooled = pool_binned([{c: b[c] for c in columns} for b in blocks])
    return {c: pooled.get(c, {"sum": [], "count": []}) for c in columns}


def _pair(pairs: Iterable[Sequence[float]]) -> list:
    s, c = 0.0, 0
    for v in pairs:
        s += float(v[0])
        c += int(v[1])
    return [s, c]
