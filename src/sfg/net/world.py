"""What every node of a swarm derives from the run settings and the seed alone (docs/concepts/training.md#pairing).

A node builds the run every engine builds (:func:`sfg.sim.context.build_run`: the data
partition, the graph, the outage trace, the attackers, the initial model — a pretrained
backbone included — and every (client, round, step) minibatch) itself: no data is shipped
between nodes. :class:`World` is what the nodes share; :class:`Trainer` is one client's local
training and evaluation with the run's own pieces (its minibatch stream, its backend at the
run's precision, its evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from sfg.errors import SfgError, check
from sfg.net.wire import Layout
from sfg.round.rules import Rule, check_model_defences
from sfg.round.slots import RoundGraph
from sfg.sim.context import Run, build_run
from sfg.sim.run import resolve_config
from sfg.world.graphs import Graph

#: the backend a node trains one client with, at the run's precision
#: (:meth:`sfg.sim.context.Run.make_backend`): the simulator's ``loop``, whose ``workers=2``
#: runs the single client with one intra-op thread, as the simulator runs each client
NODE_BACKEND = "loop:workers=2"


@dataclass
class World:
    """The shared, seed-determined part of a run: config, data, graph, trace, initial model.

    available: bool [T, N] availability trace (node i's round r uses ``available[r, i]``).
    x0:        float32 [D] the common initial model.
    attack, attackers: the run's forged-staleness attack (``--attack forge:...``,
               :mod:`sfg.round.attacks`): attackers placed as in ``sfg run``; each forges the claims
               in the headers it sends and, with ``model=constant``, sends the initial model
               every time.
    run:       the run every engine builds (:class:`sfg.sim.context.Run`).
    """

    cfg: dict[str, Any]
    rule: Rule
    data: Any
    graph: Graph
    rg: RoundGraph
    available: np.ndarray
    x0: np.ndarray
    layout: Layout
    model_factory: Any
    attack: Any = None             # sfg.round.attacks.Attack forging header claims, or None
    attackers: np.ndarray | None = None  # bool [N] the nodes that forge (sfg.round.attacks.place)
    run: Run | None = None

    @property
    def n(self) -> int:
        return self.graph.n

    @property
    def rounds(self) -> int:
        return int(self.cfg["rounds"])

    @property
    def seed(self) -> int:
        return int(self.cfg["seed"])

    def neighbours(self, i: int) -> np.ndarray:
        """int64 [deg] node i's graph neighbours in increasing id order."""
        seg = slice(self.rg.indptr[i], self.rg.indptr[i + 1])
        return np.sort(self.rg.send[seg][~self.rg.is_self[seg]])

    @property
    def scalars_per_message(self) -> int:
        return self.rule.scalars_per_message

    @cached_property
    def diagnostic_tools(self) -> dict[str, Any]:
        """What the nodes' diagnostics (:mod:`sfg.net.diagnose`) read besides their models,
        made once for the nodes of this world: the run's own
        (:meth:`sfg.sim.context.Run.diagnostic_tools`: ``val``, ``train_batches``), with
        ``train(P, xs, ys)`` the run's local training on the nodes' single-client backend at
        the run's precision (:data:`NODE_BACKEND`, made on first use), as :class:`Trainer`
        trains."""
        run = self.run
        assert run is not None, "a World made by build_world"
        backend: list[Any] = []

        def train(P: torch.Tensor, xs: Any, ys: torch.Tensor) -> torch.Tensor:
            if not backend:
                backend.append(run.make_backend(NODE_BACKEND))
            return run.train(backend[0], P, xs, ys)

        given = run.diagnostic_tools() or {}
        return {"val": given.get("val"), "train_batches": given.get("train_batches"),
                "train": train}


def node_engine(c: dict[str, Any]) -> str:
    """The engine of a swarm's settings (:func:`sfg.engines.engine_of`): their ``nodes``; where
    they name none, the node on the virtual clock (``clock: virtual``) or real nodes."""
    from sfg.engines import engine_of

    nodes = c.get("nodes", "none")
    if nodes == "none":
        nodes = "virtual" if c.get("clock") == "virtual" else "real"
    return engine_of(c, nodes=nodes)


def build_world(cfg: dict[str, Any] | None = None, *, available: np.ndarray | None = None,
                edges: np.ndarray | None = None, engine: str | None = None,
                **overrides: Any) -> World:
    """Everything a swarm's nodes share, from ``sfg run`` settings (docs/concepts/training.md#the-training-protocol).

    ``available`` overrides the trace the outage process would give; ``edges`` ([M, 2] node
    ids, e.g. from peers.yaml) override the generated graph's edges; ``engine`` (default: from
    the settings' clock and protocol, :func:`node_engine`) refuses the settings it does not
    implement.
    """
    from sfg.round.attacks import check_rounds_only

    c = resolve_config(cfg, **overrides)
    engine = engine or node_engine(c)
    if c.get("nodes", "none") == "none":  # settings that name no nodes: the nodes that run them
        from sfg.engines import SELECTORS

        c = {**c, "nodes": SELECTORS[engine]["nodes"]}
    run = build_run(c, engine=engine, edges=edges, available=available, device="cpu")
    rule = run.rule
    check(not rule.reads_models and not rule.oracle,
          f"rule {rule.name!r} reads other clients' models or global state; a networked node "
          "can run only rules on staleness scalars")
    if rule.robust:  # +clip runs in the nodes; the robust aggregators do not
        check_model_defences(rule, "the networked nodes (sfg swarm / sfg node)")
    # +certified and claim=certified run in lockstep nodes (sfg.net.certify; a Node refuses
    # them in async mode)
    check_rounds_only(run.attack_given, "the networked nodes (sfg swarm / sfg node)",
                      certified_ok=True)
    attack = run.attack
    check(attack is None or attack.model in ("none", "constant"),
          f"sfg swarm/node support attack model=none or constant, not "
          f"model={attack.model if attack else ''}; use `sfg run` for other poisoned models")
    x0 = run.initial(1)[0].cpu().numpy()
    return World(cfg=run.c, rule=rule, data=run.data, graph=run.graph,
                 rg=RoundGraph.from_graph(run.graph), available=run.available, x0=x0,
                 layout=Layout.from_spec(run.spec), model_factory=run.factory, attack=attack,
                 attackers=run.attackers, run=run)


class Trainer:
    """Local training and evaluation of one client with the run's pieces (docs/concepts/round.md#one-round step 3).

    Minibatches are the run's (:class:`sfg.sim.context.Minibatches`), drawn for all clients
    keyed by (seed, round), of which this client takes its own row, so they equal the
    simulator's. The backend is the simulator's ``loop`` backend at the run's precision;
    ``workers=2`` makes it run the single client with one intra-op thread, as the simulator
    runs each client (results then do not depend on how many threads the process has).
    """

    def __init__(self, world: World, i: int):
        run = world.run
        assert run is not None, "a World made by build_world"
        self.world, self.run, self.i = world, run, int(i)
        self.K = run.K
        self.lr = run.lr
        self.clients = run.clients  # the run's one pool, shared by the nodes of a world
        self.batches = run.minibatches()
        self.backend = run.make_backend(NODE_BACKEND)

    def steps(self, age: int) -> int:
        """Local steps this round: K, or K·(1 + min(τ, 3)) for a returning client with +catchup."""
        return int(self.world.rule.local_steps(self.K, np.ones(1, bool),
                                               np.array([int(age)], np.int64))[0])

    def batches_of(self, t: int, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """xs [1, steps, B, ...], ys [1, steps, B]: this client's minibatches of round t."""
        me = np.array([self.i])
        return self.clients.gather(me, *self.batches.select(me, t, n_steps))

    def train(self, x: np.ndarray, t: int, age: int) -> np.ndarray:
        """K local SGD steps from ``x: [D] float32`` on round t's minibatches -> new [D]."""
        xs, ys = self.batches_of(t, self.steps(age))
        start = torch.from_numpy(np.ascontiguousarray(x, np.float32))[None]
        out = self.world.rule.amplified(start, self.run.train(self.backend, start, xs, ys),
                                        np.array([age]))
        new = out[0].numpy()
        if not np.isfinite(new).all():
            raise SfgError(f"training diverged (non-finite parameters) at round {t} on node "
                           f"{self.i}; lower --lr (now {self.lr})")
        return new

    async def train_async(self, x: np.ndarray, t: int, age: int) -> np.ndarray:
        """:meth:`train`, as the node awaits it (a simulation's batched trainer,
        :class:`sfg.net.virtual.BatchTrainer`, answers later, after the compute time)."""
        return self.train(x, t, age)

    def evaluate(self, x: np.ndarray) -> float:
        """Personalised test accuracy of ``x`` on this client's own test set."""
        P = torch.from_numpy(np.ascontiguousarray(x, np.float32))[None]
        return float(self.run.evaluate(P, [self.i], backend=self.backend)[0])
