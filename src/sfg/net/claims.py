"""What a node claims in its headers: the honest claim, and the forged ones of an attacker.

A :class:`~sfg.net.node.Node` is given a claim policy (:func:`claim_policy` picks it from the
run's ``--attack``): the protocol asks it which model to send and which (age, lag, count) to
put in each header; the deployable node itself holds no attacker code.

* :class:`HonestClaims` — the node's true state and its own model;
* :class:`ForgedClaims` — an attacker of ``--attack forge:...``: the forged claim of
  :func:`sfg.round.attacks.claims` played on its star (the largest count it hears is its own and
  the last its neighbours claimed); ``model=constant`` sends the initial model every time;
* :class:`CertifiedLiar` — ``claim=certified``: one header per receiver, the best claim it can
  back with evidence (:func:`sfg.round.certified.best_claims`, played with what it knows).

A policy reads the node through the attributes of :class:`ClaimSource`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from sfg.net.checkpoints import NodeState, Star
from sfg.net.evidence import Prev

Claim = tuple[int, float, int]  # (age, lag, count) in a header


class ClaimSource(Protocol):
    """What a claim policy reads of its node."""

    i: int
    nbrs: Any
    star: Star
    x: np.ndarray
    claimed: dict[int, int]      # the latest count each neighbour claimed
    world: Any

    @property
    def state(self) -> NodeState: ...

    @property
    def prev(self) -> Prev | None: ...


def own_claim(s: NodeState) -> Claim:
    """A state's true (age, lag, count)."""
    return int(s.age), float(s.lag), int(s.count)


class HonestClaims:
    """The honest node: its true state, its own model, one header for all."""

    per_receiver = False  # one header per neighbour (the liar of claim=certified)
    keeps_prev = False    # needs the node's previous round (sfg.net.evidence.Prev)

    def model(self, node: ClaimSource) -> np.ndarray:
        """The model the node sends."""
        return node.x

    def claim(self, node: ClaimSource) -> Claim:
        """The claim of the header for every neighbour."""
        s = node.state
        return s.age, s.lag, s.count

    def claim_for(self, node: ClaimSource, j: int) -> Claim:
        """The claim of the header for neighbour ``j`` (``per_receiver`` policies)."""
        return self.claim(node)


class ForgedClaims(HonestClaims):
    """An attacker of the run's ``--attack`` (see the module docstring)."""

    def __init__(self, attack: Any):
        self.attack = attack

    def model(self, node: ClaimSource) -> np.ndarray:
        return node.world.x0 if self.attack.model == "constant" else node.x

    def claim(self, node: ClaimSource) -> Claim:
        """The forged claim of :func:`sfg.round.attacks.claims` played on this node's star
        (the largest count it hears: its own and the last its neighbours claimed); its true
        state if the attack forges no claim."""
        s = node.state
        if not self.attack.forges:
            return s.age, s.lag, s.count
        from sfg.round.attacks import claims
        from sfg.round.staleness import StalenessState

        star, world = node.star, node.world
        k, E = star.deg + 1, star.rg.n_slots
        counts = np.array([s.count] + [node.claimed.get(int(j), 1) for j in node.nbrs], np.int64)
        st = StalenessState(t=s.t, ages=np.full(k, s.age, np.int64), lags=np.full(k, s.lag),
                            counts=counts, local_counts=np.ones(k, np.int64), q_hat=np.ones(E))
        me = np.zeros(k, bool)
        me[0] = True
        age, lag, count = claims(self.attack, star.rg, st, me, seed=world.seed,
                                 ids=np.array([node.i, *node.nbrs], np.int64), n_all=world.n)
        e = int(np.flatnonzero((star.rg.send == 0) & ~star.rg.is_self)[0])
        return int(age[e]), float(lag[e]), int(count[e])


class CertifiedLiar(ForgedClaims):
    """``claim=certified``: a header per receiver with the best claim this liar can back."""

    per_receiver = True
    keeps_prev = True

    def claim_for(self, node: ClaimSource, j: int) -> Claim:
        """The best claim toward neighbour ``j`` (:func:`sfg.round.certified.best_claims`,
        played with what it knows): trained, from its prior as j knows it (what it told j in
        the previous round, else its own state then) and, if it aggregated then, the claims it
        received — the smallest lag, the largest count + 1; round 0: the initial model's."""
        prev = node.prev
        if prev is None:
            return 0, 0.0, 1
        p = prev.told.get(int(j), prev.own)
        lags, counts = [p[1]], [p[2]]
        if prev.aggregated:
            lags += [g[1] for g in prev.got.values()]
            counts += [g[2] for g in prev.got.values()]
        return 0, float(min(lags)), int(max(counts)) + 1


def claim_policy(world: Any, i: int) -> HonestClaims:
    """Node ``i``'s claim policy in ``world``: honest unless it is one of the run's attackers
    (``world.attackers``), then forged as ``world.attack`` says."""
    att = world.attack
    if att is None or world.attackers is None or not bool(world.attackers[int(i)]):
        return HonestClaims()
    if att.claim == "certified":
        return CertifiedLiar(att)
    return ForgedClaims(att)
