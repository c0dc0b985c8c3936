"""One node's staleness state (SPEC §2) and its checkpoint (SPEC §11.3).

The update is the simulator's own compiled round (:func:`sfg.round.play_round`), applied to the node's
*star*: the node (index 0) and its graph neighbours in increasing id order, the slots laid out
exactly as the node's segment of the simulator's round graph. So the scalar arithmetic (and its
summation order) is the simulator's; only the node's own row of the result is kept.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..rounds import RoundGraph
from ..staleness import StalenessState


@dataclass
class NodeState:
    """A node's staleness scalars at the start of its round ``t`` (SPEC §2).

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


class Star:
    """The node's star graph and the per-round staleness update on it."""

    def __init__(self, deg: int):
        self.deg = deg
        edges = np.stack([np.zeros(deg, np.int64), np.arange(1, deg + 1)], axis=1)
        self.rg = RoundGraph.from_edges(deg + 1, edges)
        self.seg = slice(int(self.rg.indptr[0]), int(self.rg.indptr[1]))  # self + deg slots

    def advance(self, s: NodeState, *, trained: bool, adopted: bool, cand: np.ndarray,
                weights: np.ndarray, ages: np.ndarray, lags: np.ndarray,
                counts: np.ndarray) -> NodeState:
        """The state after a round (SPEC §2), by the simulator's own compiled round.

        cand, weights, ages, lags, counts: [deg + 1] over (self, neighbours...) — the candidate
        mask, the weights used (0 off the candidates) and the scalars each slot's model carried
        as the rule saw them. The weights enter the round as given scores (the round's
        normalisation leaves a row that already sums to 1 as it is), so the staleness update
        is :func:`sfg.round.play_round`'s, not a copy of it.
        """
        from ..outages.anatomy import Capabilities
        from ..round import play_round
        from ..rules import parse_rule

        n, E = self.deg + 1, self.rg.n_slots
        scores = np.where(self.rg.is_self, 1.0, 0.0)
        scores[self.seg] = weights
        slot_ages = np.zeros(E, np.int64)
        slot_lags = np.zeros(E)
        slot_counts = np.ones(E, np.int64)
        slot_ages[self.seg], slot_lags[self.seg], slot_counts[self.seg] = ages, lags, counts
        q = np.ones(E)
        q[self.seg.start + 1:self.seg.stop] = s.q_hat
        st = StalenessState(t=s.t, ages=np.full(n, s.age, np.int64),
                            lags=np.full(n, s.lag), counts=np.full(n, s.count, np.int64),
                            local_counts=np.full(n, s.local_count, np.int64), q_hat=q)
        own = np.zeros(n, bool)
        own[0] = True
        sends = np.ones(n, bool)
        sends[1:] = np.asarray(cand, bool)[1:]
        caps = Capabilities(train=own & trained, send=sends, aggregate=own & adopted,
                            adopt=own & adopted)
        new = play_round(parse_rule("dfedavg"), self.rg, st, caps, seed=0, scores=scores,
                         slot_staleness=(slot_ages, slot_lags, slot_counts)).state
        return NodeState(t=int(new.t), age=int(new.ages[0]), lag=float(new.lags[0]),
                         count=int(new.counts[0]), local_count=int(new.local_counts[0]),
                         q_hat=[float(v) for v in new.q_hat[self.seg.start + 1:self.seg.stop]])


# ----------------------------------------------------------------------------------- checkpoints
def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, rename over ``path``, fsync the folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def save_checkpoint(path: Path, params: np.ndarray, layout, state: NodeState,
                    extra: dict | None = None) -> None:
    """Model (safetensors, one tensor per named parameter) + state in its metadata, atomically."""
    from .wire import encode_params

    meta = {"state": json.dumps(state.as_dict()), "extra": json.dumps(extra or {})}
    write_atomic(path, encode_params(params, layout, metadata=meta))


def load_checkpoint(path: Path, layout) -> tuple[np.ndarray, NodeState, dict]:
    """``(params [D], state, extra)`` from a checkpoint written by :func:`save_checkpoint`."""
    from safetensors import safe_open

    from .wire import decode_params

    raw = Path(path).read_bytes()
    params = decode_params(raw, layout)
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
    state = NodeState(**json.loads(meta["state"]))
    return params, state, json.loads(meta.get("extra", "{}"))
