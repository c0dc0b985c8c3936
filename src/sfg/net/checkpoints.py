"""One node's staleness state (docs/concepts/staleness.md#the-staleness-state) and its checkpoint (docs/concepts/nodes.md#wire-format-and-trust).

The update is the compiled round itself (:func:`sfg.round.kernel.play_round`, written once for the
replay, the simulator and the one-receiver form), played on the node's *star*: the node
(index 0) and its graph neighbours in increasing id order, the slots laid out exactly as the
node's segment of the simulator's round graph, with the weights the node aggregated with given
as the round's scores. Only the node's own row of the result is kept.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from sfg.round.kernel import play_round
from sfg.round.slots import RoundGraph
from sfg.round.staleness import StalenessState
from sfg.util.atomic import write_bytes as write_atomic
from sfg.world.outages.anatomy import Capabilities


@dataclass
class NodeState:
    """A node's staleness scalars at the start of its round ``t`` (docs/concepts/staleness.md#the-staleness-state).

    q_hat: float64 [deg] link-reception estimate per neighbour (increasing id order).
    """

    t: int = 0
    age: int = 0
    lag: float = 0.0
    count: int = 1
    local_count: int = 1
    q_hat: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


OFFLINE_BLOCK = 32  # offline rounds applied in one call of the compiled round, at most


class Star:
    """The node's star graph and the per-round staleness update on it."""

    def __init__(self, deg: int, rule):
        self.deg = deg
        edges = np.stack([np.zeros(deg, np.int64), np.arange(1, deg + 1)], axis=1)
        self.rg = RoundGraph.from_edges(deg + 1, edges)
        self.seg = slice(int(self.rg.indptr[0]), int(self.rg.indptr[1]))  # self + deg slots
        # the round normalises given scores with the rule's modifiers; the weights given here
        # are final (from Rule.weights_one), so the round gets the rule without modifiers
        self.rule = replace(rule, params={**rule.params, "c": 1.0}, modifiers=())
        # the compiled round's buffers, made once: a simulation plays thousands of nodes' rounds
        # one star at a time, and play_round's per-call set-up would dominate (see _direct)
        r = self.rule
        self._direct_ok = not (r.random or r.oracle or r.defence_flags)
        self._step = None
        self._offline_steps: dict[int, tuple] = {}
        # an offline round's inputs (nothing received, the node's own weight 1): read only
        k = deg + 1
        w = np.zeros(k)
        w[0] = 1.0
        self.offline = {"cand": np.zeros(k, bool), "weights": w, "ages": np.zeros(k, np.int64),
                        "lags": np.zeros(k), "counts": np.ones(k, np.int64),
                        "local_counts": np.ones(k, np.int64)}
        for a in self.offline.values():
            a.flags.writeable = False
        if self._direct_ok:
            from sfg.round import kernel

            n, E = deg + 1, self.rg.n_slots
            self._caps = np.zeros((4, 1, n), bool)
            self._scores = np.zeros((1, E))
            self._outside = (self._scores, kernel.NONE_I, kernel.EMPTY_F, kernel.EMPTY_B,
                             kernel.NONE_B)
            self._st = np.zeros((4, n), np.int64)
            self._lags, self._q = np.zeros(n), np.ones(E)
            self._w, self._cand = np.empty((1, E)), np.empty(E, bool)
            self._facts = np.empty((1, n, len(kernel.FACTS)))
            # the node's weights are final (its rule's, modifiers and normalisation applied):
            # the round takes them as given, so the update uses the very weights the node used
            self._args = (kernel.WEIGHTS_GIVEN, False, bool(r.rounded),
                          int(r.defence_flags), float(r.margin), float(r.kappa))

    def advance_offline(self, s: NodeState, m: int) -> NodeState:
        """The state after ``m`` rounds in which the node was offline (nothing received,
        nothing sent), from round ``s.t``: the compiled round run over the m rounds in one
        call (equal to m calls of :meth:`advance` with :attr:`offline`'s inputs, tested)."""
        if not self._direct_ok:
            for _ in range(int(m)):
                s = self.advance(s, available=False, **self.offline)
            return s
        from sfg.round import kernel

        while m > 0:
            b = min(int(m), OFFLINE_BLOCK)
            got = self._offline_steps.get(b)
            if got is None:  # buffers and a bound round for b offline rounds, made once
                n, E, seg = self.deg + 1, self.rg.n_slots, self.seg
                caps = np.zeros((4, b, n), bool)  # nobody trains, sends, aggregates, adopts
                scores = np.zeros((b, E))
                scores[:, seg.start] = 1.0  # the node's own weight 1
                st = np.zeros((4, n), np.int64)
                lags, q = np.zeros(n), np.ones(E)
                outside = (scores, kernel.NONE_I, kernel.EMPTY_F, kernel.EMPTY_B,
                           kernel.NONE_B)
                step = kernel.bound_rounds(
                    kernel.given_scores, kernel.EMPTY_F, *self._args, self.rg, caps,
                    kernel.NONE_B, kernel.NONE_F, kernel.NONE_F, st, lags, q,
                    np.empty((b, E)), np.empty(E, bool), np.empty((b, n, len(kernel.FACTS))),
                    outside=outside, ev=None)
                got = self._offline_steps[b] = (step, st, lags, q)
            step, st, lags, q = got
            seg = self.seg
            st[:] = 0
            st[1:3] = 1  # counts and local counts of the (absent) neighbours, as offline has
            st[0, 0], st[1, 0], st[2, 0] = s.age, s.count, s.local_count
            lags[:] = 0.0
            lags[0] = s.lag
            q[:] = 1.0
            q[seg.start + 1:seg.stop] = s.q_hat
            step(int(s.t))
            s = NodeState(t=int(s.t) + b, age=int(st[0, 0]), lag=float(lags[0]),
                          count=int(st[1, 0]), local_count=int(st[2, 0]),
                          q_hat=q[seg.start + 1:seg.stop].tolist())
            m -= b
        return s

    def advance(self, s: NodeState, *, available: bool, cand: np.ndarray, weights: np.ndarray,
                ages: np.ndarray, lags: np.ndarray, counts: np.ndarray,
                local_counts: np.ndarray) -> NodeState:
        """The state after round ``s.t`` (docs/concepts/staleness.md#the-staleness-state).

        available: the node trained, sent and aggregated this round (else it was offline).
        cand, weights, ages, lags, counts, local_counts: [deg + 1] over (self, neighbours...) —
        the candidate mask, the weights used (0 off the candidates) and the scalars each
        candidate's model carried as the rule saw them (index 0: the node's own).
        """
        if self._direct_ok:
            return self._direct(s, available, cand, weights, ages, lags, counts, local_counts)
        n, E = self.deg + 1, self.rg.n_slots
        q = np.ones(E)
        q[self.seg.start + 1:self.seg.stop] = s.q_hat
        st = StalenessState(t=s.t, ages=np.asarray(ages, np.int64).copy(),
                            lags=np.asarray(lags, np.float64).copy(),
                            counts=np.asarray(counts, np.int64).copy(),
                            local_counts=np.asarray(local_counts, np.int64).copy(), q_hat=q)
        st.ages[0], st.lags[0], st.counts[0], st.local_counts[0] = (s.age, s.lag, s.count,
                                                                    s.local_count)
        me = np.zeros(n, bool)
        me[0] = available
        sends = np.asarray(cand, bool).copy()
        sends[0] = available
        scores = np.zeros(E)
        scores[self.seg] = weights
        caps = Capabilities(train=me, send=sends, aggregate=me, adopt=me)
        new = play_round(self.rule, self.rg, st, caps, seed=0, scores=scores,
                         weights_given=True).state
        return NodeState(t=int(new.t), age=int(new.ages[0]), lag=float(new.lags[0]),
                         count=int(new.counts[0]), local_count=int(new.local_counts[0]),
                         q_hat=[float(v) for v in new.q_hat[self.seg.start + 1:self.seg.stop]])

    def _direct(self, s: NodeState, available: bool, cand, weights, ages, lags, counts,
                local_counts) -> NodeState:
        """:meth:`advance` through the compiled round itself (:func:`sfg.round.kernel.run_rounds`,
        what :func:`~sfg.round.kernel.play_round` calls) with this star's buffers, for rules
        without random draws, oracles or defences (the modifier-free rule the star plays
        always has none of the last): the same arguments play_round would pass, without its
        per-call set-up (tested equal to it on random states)."""
        from sfg.round import kernel

        st, lg, q, caps, seg = self._st, self._lags, self._q, self._caps, self.seg
        st[0], st[1], st[2], st[3] = ages, counts, local_counts, 0
        st[0, 0], st[1, 0], st[2, 0] = s.age, s.count, s.local_count
        lg[:] = lags
        lg[0] = s.lag
        q[:] = 1.0
        q[seg.start + 1:seg.stop] = s.q_hat
        caps[:] = False
        caps[1, 0, :] = cand
        caps[0, 0, 0] = caps[1, 0, 0] = caps[2, 0, 0] = caps[3, 0, 0] = bool(available)
        self._scores[0, :] = 0.0
        self._scores[0, seg] = weights
        if self._step is None:  # the compiled round bound to this star's buffers, once
            self._step = kernel.bound_rounds(
                kernel.given_scores, kernel.EMPTY_F, *self._args, self.rg, caps,
                kernel.NONE_B, kernel.NONE_F, kernel.NONE_F, st, lg, q, self._w, self._cand,
                self._facts, outside=self._outside, ev=None)
        self._step(int(s.t))
        return NodeState(t=int(s.t) + 1, age=int(st[0, 0]), lag=float(lg[0]),
                         count=int(st[1, 0]), local_count=int(st[2, 0]),
                         q_hat=q[seg.start + 1:seg.stop].tolist())


# ----------------------------------------------------------------------------------- checkpoints
# write_atomic: sfg.util.atomic.write_bytes (imported above; the nodes and the event log call it
# from here)


def save_checkpoint(path: Path, params: np.ndarray, layout, state: NodeState,
                    extra: dict | None = None) -> None:
    """Model (safetensors, one tensor per named parameter) + state in its metadata, atomically."""
    from sfg.net.wire import encode_params

    meta = {"state": json.dumps(state.as_dict()), "extra": json.dumps(extra or {})}
    write_atomic(path, encode_params(params, layout, metadata=meta))


def load_checkpoint(path: Path, layout) -> tuple[np.ndarray, NodeState, dict]:
    """``(params [D], state, extra)`` from a checkpoint written by :func:`save_checkpoint`."""
    from safetensors import safe_open

    from sfg.net.wire import decode_params

    raw = Path(path).read_bytes()
    params = decode_params(raw, layout)
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
    state = NodeState(**json.loads(meta["state"]))
    return params, state, json.loads(meta.get("extra", "{}"))
