"""What every node of a swarm derives from the run settings and the seed alone (SPEC §7).

The same settings as ``sfg run`` (:data:`sfg.sim.run.DEFAULTS`) fix the data partition, the
graph, the outage trace, the initial model and every (client, round, step) minibatch. A node
builds the :class:`World` itself (no data is shipped between nodes) and keeps only its own
client's part through :class:`Trainer`, which runs the simulator's own pieces — its model
construction, minibatch streams, local-training backend and evaluation — for one client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sfg.errors import SfgError, check
from sfg.net.wire import Layout
from sfg.round.rules import CATCHUP_CAP, Rule, check_model_defences, parse_rule
from sfg.round.slots import RoundGraph
from sfg.sim.run import minibatch_indices, resolve_config
from sfg.util.rng import stream
from sfg.world.graphs import Graph, make_graph
from sfg.world.outages import make_process

# Settings of `sfg run` a swarm does not implement (it would silently differ otherwise).
_UNSUPPORTED = {"backbone": "full", "anatomy": "full", "link_failure": 0.0, "momentum": 0.0,
                "device": "cpu"}


@dataclass
class World:
    """The shared, seed-determined part of a run: config, data, graph, trace, initial model.

    available: bool [T, N] availability trace (node i's round r uses ``available[r, i]``).
    x0:        float32 [D] the common initial model.
    attack, attackers: the run's forged-staleness attack (``--attack forge:...``,
               :mod:`sfg.round.attacks`): attackers placed as in ``sfg run``; each forges the claims
               in the headers it sends and, with ``model=constant``, sends the initial model
               every time (:meth:`sfg.net.node.Node._message`).
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


def build_world(cfg: dict[str, Any] | None = None, *, available: np.ndarray | None = None,
                edges: np.ndarray | None = None, **overrides: Any) -> World:
    """Everything a swarm's nodes share, from ``sfg run`` settings (SPEC §6–7).

    ``available`` overrides the trace the outage process would give; ``edges`` ([M, 2] node
    ids, e.g. from peers.yaml) override the generated graph's edges.
    """
    from sfg.round.attacks import availability, check_rounds_only, parse_attack, place
    from sfg.sim.params import ParamSpec, init_params
    from sfg.world.data import load_federated
    from sfg.world.models import make_model

    c = resolve_config(cfg, **overrides)
    for key, value in _UNSUPPORTED.items():
        check(c[key] == value or (key == "device" and c[key] == "auto"),
              f"sfg swarm/node support {key}={value!r} only (got {c[key]!r}); "
              f"use `sfg run` for other settings")
    rule = parse_rule(c["rule"])
    check(not rule.reads_models and not rule.oracle,
          f"rule {rule.name!r} reads other clients' models or global state; a networked node "
          "can run only rules on staleness scalars")
    if rule.robust:  # +clip runs in the nodes; the robust aggregators do not
        check_model_defences(rule, "the networked nodes (sfg swarm / sfg node)")
    N, T, seed = int(c["n_clients"]), int(c["rounds"]), int(c["seed"])
    data = load_federated(c["dataset"], n_clients=N, seed=seed, data_root=c["data_root"],
                          alpha=float(c["alpha"]), partition=c["partition"])
    if edges is not None:  # the edges of peers.yaml; no node positions
        graph = Graph(N, _edges(edges, N), None, "peers")
    else:
        graph = make_graph(c["graph"], N, seed=seed)
    if available is None:
        available = make_process(c["process"]).sample(T, N, seed=seed, positions=graph.positions)
    available = np.asarray(available, bool)
    check(available.shape == (T, N),
          f"availability trace has shape {available.shape}, need (rounds, nodes) = {(T, N)}")
    # forged staleness (sfg.round.attacks), placed and made always-on exactly as `sfg run` does
    attack = parse_attack(c.get("attack"))
    # +certified and claim=certified run in lockstep nodes (sfg.net.certify; a Node refuses
    # them in async mode)
    check_rounds_only(attack, "the networked nodes (sfg swarm / sfg node)", certified_ok=True)
    attackers = place(attack, N, np.bincount(graph.edges.ravel(), minlength=N), seed=seed)
    attack = attack if attackers.any() else None
    check(attack is None or attack.model in ("none", "constant"),
          f"sfg swarm/node support attack model=none or constant, not "
          f"model={attack.model if attack else ''}; use `sfg run` for other poisoned models")
    available = availability(available, attack, attackers)

    def factory():
        return make_model(c["model"], input_shape=tuple(data.input_shape),
                          num_classes=data.num_classes)

    x0 = init_params(factory, 1, seed=seed)[0].numpy()
    spec = ParamSpec.from_module(factory())
    return World(cfg=c, rule=rule, data=data, graph=graph, rg=RoundGraph.from_graph(graph),
                 available=available, x0=x0, layout=Layout.from_spec(spec),
                 model_factory=factory, attack=attack, attackers=attackers)


def _edges(edges, n: int) -> np.ndarray:
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    check(bool(((e >= 0) & (e < n)).all()), f"edges name nodes outside 0..{n - 1}")
    check(bool((e[:, 0] != e[:, 1]).all()), "edges must not be self-loops")
    e = np.unique(np.sort(e, axis=1), axis=0)
    return e


class Trainer:
    """Local training and evaluation of one client with the simulator's pieces (SPEC §1 step 3).

    Minibatches come from :func:`sfg.sim.run.minibatch_indices` keyed by (seed, round) for all
    clients, of which this client takes its own row, so they equal the simulator's. The
    backend is the simulator's ``loop`` backend; ``workers=2`` makes it run the single client
    with one intra-op thread, as the simulator runs each client (results then do not depend
    on how many threads the process has).
    """

    def __init__(self, world: World, i: int):
        from sfg.sim.backends import make_backend

        self.world, self.i = world, int(i)
        c = world.cfg
        self.K, self.B = int(c["local_steps"]), int(c["batch_size"])
        self.lr, self.wd = float(c["lr"]), float(c["weight_decay"])
        self.sizes = world.data.sizes("train")
        check(bool((self.sizes > 0).all()), "every client needs at least one training example")
        self.x = world.data.train_x[self.i]
        self.y = world.data.train_y[self.i]
        self.hflip = bool(getattr(world.data, "augment_hflip", False))
        self.test_x = [world.data.test_x[self.i]]
        self.test_y = [world.data.test_y[self.i]]
        self.backend = make_backend("loop:workers=2", world.model_factory(), device="cpu")

    def steps(self, age: int) -> int:
        """Local steps this round: K, or K·(1 + min(τ, 3)) for a returning client with +catchup."""
        return int(self.world.rule.local_steps(self.K, np.ones(1, bool),
                                               np.array([int(age)], np.int64))[0])

    def batches(self, t: int, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """xs [1, steps, B, ...], ys [1, steps, B]: this client's minibatches of round t."""
        seed, i, N = self.world.seed, self.i, self.world.n
        idx = minibatch_indices(self.sizes, self.K, self.B, seed=seed, stream_name="minibatch",
                                t=t)[i]
        flips = (stream(seed, "augment", t).random((N, self.K, self.B)) < 0.5)[i] \
            if self.hflip else None
        if n_steps > self.K:
            extra = minibatch_indices(self.sizes, CATCHUP_CAP * self.K, self.B, seed=seed,
                                      stream_name="catchup", t=t)[i, : n_steps - self.K]
            idx = np.concatenate([idx, extra])
            if flips is not None:
                ef = stream(seed, "catchup-augment", t).random((N, CATCHUP_CAP * self.K, self.B))
                flips = np.concatenate([flips, (ef < 0.5)[i, : n_steps - self.K]])
        gidx = torch.from_numpy(idx)
        xs, ys = self.x[gidx], self.y[gidx]
        if flips is not None:
            f = torch.from_numpy(flips)
            xs = torch.where(f.reshape(*f.shape, *([1] * (xs.dim() - 2))), xs.flip(-1), xs)
        return xs[None], ys[None]

    def train(self, x: np.ndarray, t: int, age: int) -> np.ndarray:
        """K local SGD steps from ``x: [D] float32`` on round t's minibatches -> new [D]."""
        n_steps = self.steps(age)
        xs, ys = self.batches(t, n_steps)
        start = torch.from_numpy(np.ascontiguousarray(x, np.float32))[None]
        out = self.backend.train(start, xs, ys, lr=self.lr, weight_decay=self.wd)
        amplify = self.world.rule.amplify
        if amplify is not None and age >= 1:
            out = start + (1 + min(age, amplify)) * (out - start)
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
        return float(self.backend.evaluate(P, self.test_x, self.test_y)[0])
