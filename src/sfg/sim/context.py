"""One run, every engine: what a run is made of, built once from its settings.

Every engine — the rounds (``sfg run``), the virtual clock's lockstep, async and event
protocols, the node on the virtual clock and the real nodes — builds its run with
:func:`build_run`: the resolved settings, the data and its partition, the graph, the
availability trace, the attackers, the model factory (a pretrained backbone included), the
initial models, the training backend at the run's precision, every client's training data, the
test sets, the minibatch stream and the evaluation. No engine builds any of these itself, so a
setting means the same in all of them; a setting an engine does not implement is refused here,
with one line naming the engine and the setting (:func:`sfg.engines.refuse`), never ignored.

Heavy parts (the initial models, the backend, the clients' data on the device, the test sets,
the availability trace) are built on first use, so a node that trains one client builds only
what it reads.

Every engine's result is one :class:`sfg.result.RunResult` with one accuracy summary
(:func:`accuracy_metrics`, :func:`time_to_target`); :func:`sfg.sim.run.train` trains a run on
the engine its settings name.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from sfg.errors import SfgError, check
from sfg.sim.minibatches import Minibatches

BACKBONES = ("full", "personal-head", "dfedavgm", "ditto")


# ----------------------------------------------------------------------------- settings
def backbone_momentum(c: dict) -> float:
    """The local SGD momentum of a run: ``momentum``, or 0.9 for the ``dfedavgm`` backbone
    when none is given."""
    return float(c["momentum"]) or (0.9 if c["backbone"] == "dfedavgm" else 0.0)


def numerics() -> dict:
    """How this process computes floats: the instruction set torch uses, its threads and
    whether ``SFG_REPRODUCIBLE`` pins them (:mod:`sfg.reproducible`)."""
    from sfg.reproducible import describe

    return {**describe(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads()}


def device_of(name: str) -> torch.device:
    """The torch device of ``--device`` (``auto``: CUDA when there is one)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SfgError(f"device {name!r} requested but CUDA is not available here; use --device cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise SfgError(f"unknown device {name!r}; use cpu, cuda, cuda:0 or auto") from None


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run a loop's own tensor ops (gossip, gathers, copies, checks) on one intra-op thread,
    restoring torch's setting afterwards.

    They are small (about a megabyte at the default size); split over threads they wait on
    each other whenever another process holds a core (measured on the shared 2-core development
    machine: index copies and the gossip product 5-10× slower with two threads under load).
    The backends parallelise over clients with their own worker threads. Results do not
    depend on it (the baseline fixture is identical either way)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def timed(times: dict[str, float], part: str) -> Iterator[None]:
    """Add the wall seconds of the block to ``times[part]``: the per-part costs a run reports
    in ``meta['timings']`` (two clock reads a block, whatever N)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        times[part] = times.get(part, 0.0) + time.perf_counter() - t


def train_sizes(data) -> np.ndarray:
    """int64 [N] every client's number of training examples; none may have zero."""
    sizes = np.array([len(y) for y in data.train_y], dtype=np.int64)
    check(bool((sizes > 0).all()), "every client needs at least one training example")
    return sizes


class ClientData:
    """Every client's training split: rows of the dataset's one shared image pool (as stored,
    e.g. uint8), on the device, with each client's offset into the rows.

    A batch of n clients' minibatches is one ``index_select`` of ``n·K·B`` rows of the pool,
    normalised and flipped per batch (:meth:`sfg.world.data.ClientImages.take`,
    :func:`sfg.world.data.base.hflip`): the floats of normalising every image first, with
    memory the pool once, not a float copy of every client's images."""

    def __init__(self, data, device: torch.device):
        from sfg.world.data.base import ClientImages

        self.sizes = train_sizes(data)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.images = ClientImages.of(data.train_x)
        self.images.on(device)  # the pool on the device once
        self.y = torch.cat(list(data.train_y)).to(device).contiguous()
        self.hflip = bool(getattr(data, "augment_hflip", False))
        self.device = device

    def gather(self, clients: np.ndarray, local_idx: np.ndarray, flips: np.ndarray | None):
        """xs [n, K, B, *shape] (a :class:`~sfg.world.data.base.PoolBatch`: made block by
        block as the backend reads it), ys [n, K, B] for the given clients' local indices
        [n, K, B]."""
        from sfg.world.data.base import PoolBatch

        lead = local_idx.shape
        gidx = (self.offsets[clients].reshape((-1,) + (1,) * (local_idx.ndim - 1))
                + local_idx).reshape(-1)
        xs = PoolBatch(self.images, self.images.rows[gidx].reshape(lead),
                       flips if self.hflip else None, self.device)
        ys = self.y.index_select(0, torch.from_numpy(gidx).to(self.device)).view(lead)
        return xs, ys


# ----------------------------------------------------------------------------- the run
@dataclass(eq=False)
class Run:
    """One run's parts (see the module docstring); made by :func:`build_run`."""

    c: dict[str, Any]
    engine: str
    rule: Any
    data: Any
    graph: Any
    attack: Any
    attackers: np.ndarray
    device: torch.device
    attack_given: Any = None  # the attack as configured (``attack`` is None without attackers)
    trace: np.ndarray | None = None  # an availability trace given by the caller (nodes)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per part (:func:`timed`)

    @property
    def seed(self) -> int:
        return int(self.c["seed"])

    @property
    def n(self) -> int:
        return int(self.c["n_clients"])

    @property
    def rounds(self) -> int:
        return int(self.c["rounds"])

    @property
    def K(self) -> int:
        return int(self.c["local_steps"])

    @property
    def B(self) -> int:
        return int(self.c["batch_size"])

    # -- the model
    def factory(self) -> torch.nn.Module:
        """A fresh model of the run: its architecture, with the pretrained body of
        ``backbone_from`` when given (the head freshly initialised)."""
        from sfg.world.models import make_model

        body = {"backbone": str(self.c["backbone_from"])} if self.c.get("backbone_from") else {}
        return make_model(self.c["model"], input_shape=tuple(self.data.input_shape),
                          num_classes=self.data.num_classes, **body)

    @cached_property
    def model(self) -> torch.nn.Module:
        return self.factory()

    @cached_property
    def spec(self):
        from sfg.sim.params import ParamSpec

        return ParamSpec.from_module(self.model)

    def initial(self, n: int | None = None) -> torch.Tensor:
        """[n, D] float32 (default N rows) the common initial model, on the run's device."""
        from sfg.sim.params import init_params

        return init_params(self.factory, self.n if n is None else int(n),
                           seed=self.seed).to(self.device)

    def make_backend(self, name: str | None = None):
        """The run's training backend (``name`` overrides ``--backend``, e.g. a node's
        single-client ``loop:workers=2``), at the run's precision."""
        from sfg.sim.backends import make_backend

        return make_backend(str(self.c["backend"]) if name is None else name, self.model,
                            device=str(self.device), precision=str(self.c["precision"]))

    @cached_property
    def backend(self):
        return self.make_backend()

    # -- local training
    @property
    def lr(self) -> float:
        return float(self.c["lr"])

    @property
    def weight_decay(self) -> float:
        return float(self.c["weight_decay"])

    @property
    def momentum(self) -> float:
        return backbone_momentum(self.c)

    @property
    def backbone(self) -> str:
        return str(self.c["backbone"])

    @cached_property
    def head(self) -> torch.Tensor:
        return self.spec.head_mask.to(self.device)

    @cached_property
    def clients(self) -> ClientData:
        return ClientData(self.data, self.device)

    @cached_property
    def sizes(self) -> np.ndarray:
        return train_sizes(self.data)

    def minibatches(self, keep: int = 1) -> Minibatches:
        return Minibatches(self.sizes, self.K, self.B, seed=self.seed,
                           hflip=bool(getattr(self.data, "augment_hflip", False)), keep=keep)

    def train(self, backend, start: torch.Tensor, xs, ys, *, personal: torch.Tensor | None = None,
              center: torch.Tensor | None = None) -> torch.Tensor:
        """The run's local SGD from ``start`` [n, D] on xs/ys (momentum from a zero buffer);
        with ``personal``: ditto's personal step towards ``center``."""
        momentum = self.momentum
        if personal is None:
            buf = torch.zeros_like(start) if momentum > 0 else None
            return backend.train(start, xs, ys, lr=self.lr, weight_decay=self.weight_decay,
                                 momentum=momentum, momentum_buf=buf)
        buf = torch.zeros_like(personal) if momentum > 0 else None
        return backend.train(personal, xs, ys, lr=self.lr, weight_decay=self.weight_decay,
                             momentum=momentum, momentum_buf=buf, prox_center=center,
                             prox_lam=float(self.c["ditto_lambda"]))

    def diagnostic_tools(self) -> dict[str, Any] | None:
        """What a run's diagnostics read besides its models, for every engine: ``kinds``;
        ``val``, the clients' validation splits (:class:`~sfg.sim.diagnostics.ValidationLoss`,
        for ``finetune`` and ``returning``); ``train_batches(i, t)``, client i's K minibatches
        of the fine-tuning at t (streams ``diagnostics-finetune-<i>`` and
        ``diagnostics-finetune-augment-<i>`` keyed by t, never the training's); ``train(P, xs,
        ys)``, the run's local training (lr, weight decay, momentum from a zero buffer). None
        when no diagnostic is asked for."""
        from sfg.sim.diagnostics import ValidationLoss, finetune_minibatches, parse_diagnostics

        kinds = parse_diagnostics(self.c.get("diagnostics") or "")
        if not kinds:
            return None
        val = ValidationLoss(self.model, self.spec, self.data.val_x, self.data.val_y,
                             self.device) if {"finetune", "returning"} & set(kinds) else None
        sizes, K, B, seed, clients = self.sizes, self.K, self.B, self.seed, self.clients

        def train_batches(i: int, t: int):
            idx, flips = finetune_minibatches(int(sizes[i]), i, t, K=K, B=B, seed=seed,
                                              hflip=clients.hflip)
            xs, ys = clients.gather(np.array([i]), idx, flips)
            return xs[0], ys[0]

        def train(P, xs, ys):
            return self.train(self.backend, P, xs, ys)

        return {"kinds": kinds, "val": val, "train_batches": train_batches, "train": train}

    # -- availability
    def clock_settings(self, settings=None):
        """The virtual clock's settings of the run (:func:`sfg.clock.settings.make_settings`
        of its settings, or ``settings`` as given), with the messages' size: the model's
        float32 parameters and a header, unless ``message_bytes`` is set."""
        from sfg.clock.settings import HEADER_BYTES, make_settings

        cs = make_settings(self.c) if settings is None else settings
        return cs.with_bytes(4.0 * self.spec.D + HEADER_BYTES)

    def world_in_time(self, settings):
        """The world in time (:func:`sfg.clock.schedule.make_world`: graph, trace, per-device
        compute and uplink, per-link latency and loss) of the run under clock ``settings``."""
        from sfg.clock.schedule import make_world

        return make_world(settings, process=self.c["process"], graph=self.c["graph"], n=self.n,
                          rounds=self.rounds, seed=self.seed)

    @cached_property
    def available(self) -> np.ndarray:
        """bool [T, N] the round trace: the caller's, or the outage process's from the seed;
        attackers made always-on (:func:`sfg.round.attacks.availability`)."""
        from sfg.round.attacks import availability
        from sfg.world.outages import make_process

        if self.trace is not None:
            avail = np.asarray(self.trace, bool)
            check(avail.shape == (self.rounds, self.n),
                  f"availability trace has shape {avail.shape}, need (rounds, nodes) = "
                  f"{(self.rounds, self.n)}")
        else:
            avail = make_process(self.c["process"]).sample(self.rounds, self.n, seed=self.seed,
                                                           positions=self.graph.positions)
        return availability(avail, self.attack, self.attackers)

    # -- evaluation
    @cached_property
    def _tests(self):
        return self.data.test_x, [y.to(self.device) for y in self.data.test_y]

    def evaluate(self, X: torch.Tensor, clients: np.ndarray | list[int] | None = None,
                 backend=None) -> np.ndarray:
        """float64 [n] personalised test accuracy of row k of ``X`` on client
        ``clients[k]``'s test set (default: row i on client i, all N). The test images are
        rows of the dataset's pool, normalised per evaluation batch."""
        backend = self.backend if backend is None else backend
        test_x, test_y = self._tests
        if clients is not None:
            clients = [int(i) for i in clients]
            test_x, test_y = test_x.subset(clients), [test_y[i] for i in clients]
        return backend.evaluate(X, test_x, test_y).detach().cpu().numpy().astype(np.float64)


def build_run(c: dict[str, Any], *, engine: str, edges: np.ndarray | None = None,
              available: np.ndarray | None = None, device: str | None = None) -> Run:
    """Build the run of ``c`` (resolved settings, :func:`resolve_config`) for ``engine``
    (:data:`sfg.engines.ENGINES`). A setting the engine does not implement is refused here.

    ``edges`` ([M, 2], e.g. a peers.yaml) replace the generated graph's edges; ``available``
    ([T, N] bool) the outage process's trace; ``device`` the run's ``device`` (the nodes
    train on the CPU)."""
    from sfg.engines import refuse
    from sfg.round.attacks import parse_attack, place
    from sfg.round.rules import parse_rule
    from sfg.world.data import load_federated
    from sfg.world.graphs import Graph, make_graph

    refuse(engine, c)
    seed, N = int(c["seed"]), int(c["n_clients"])
    rule = parse_rule(c["rule"])
    device_ = device_of(str(c["device"]) if device is None else device)
    times: dict[str, float] = {}
    # -- everything keyed by the seed only (pairing)
    with timed(times, "data"):  # the pool and its partition into the clients' shares
        data = load_federated(c["dataset"], n_clients=N, seed=seed, data_root=c["data_root"],
                              alpha=float(c["alpha"]), partition=c["partition"])
    with timed(times, "graph"):
        if edges is not None:  # the edges of peers.yaml; no node positions
            graph = Graph(N, _edges(edges, N), None, "peers")
        else:
            graph = make_graph(c["graph"], N, seed=seed)
    # forged staleness (sfg.round.attacks): attackers from the attack's own stream; frac=0 is
    # no attack
    given = parse_attack(c.get("attack"))
    attackers = place(given, N, np.bincount(graph.edges.ravel(), minlength=N), seed=seed)
    attack = given if attackers.any() else None
    return Run(c=c, engine=engine, rule=rule, data=data, graph=graph, attack=attack,
               attackers=attackers, device=device_, attack_given=given, trace=available,
               timings=times)


def _edges(edges, n: int) -> np.ndarray:
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    check(bool(((e >= 0) & (e < n)).all()), f"edges name nodes outside 0..{n - 1}")
    check(bool((e[:, 0] != e[:, 1]).all()), "edges must not be self-loops")
    return np.unique(np.sort(e, axis=1), axis=0)


# ----------------------------------------------------------------------------- the result
def quartile_means(acc: np.ndarray, availability: np.ndarray) -> dict[str, float]:
    """Mean accuracy per availability quartile (q1 = least available clients); a quartile
    with no client (N < 4) is NaN."""
    order = np.argsort(availability, kind="stable")
    q = np.empty(acc.shape[0], np.int64)
    q[order] = (np.arange(acc.shape[0]) * 4) // acc.shape[0]
    return {f"acc_q{k + 1}": float(acc[q == k].mean()) if (q == k).any() else float("nan")
            for k in range(4)}


def accuracy_metrics(acc: np.ndarray, curve_mean: list[float], availability: np.ndarray,
                     attackers: np.ndarray | None = None) -> dict[str, float]:
    """The accuracy summary every engine reports: final mean and 10th percentile, the mean
    over the evaluations, per-availability-quartile means (``availability``: [N] each
    client's share of time available), and with attackers the honest clients' mean and p10."""
    out = {"acc_mean": float(acc.mean()), "acc_p10": float(np.percentile(acc, 10)),
           "acc_time_avg": float(np.mean(curve_mean)) if len(curve_mean) else float("nan"),
           **quartile_means(acc, availability)}
    if attackers is not None:
        honest = ~np.asarray(attackers, bool)
        out["acc_honest_mean"] = float(acc[honest].mean())
        out["acc_honest_p10"] = float(np.percentile(acc[honest], 10))
    return out


def check_finite(metrics: dict[str, float]) -> None:
    """Refuse non-finite accuracies (an empty availability quartile may be NaN)."""
    if not all(math.isfinite(v) for k, v in metrics.items()
               if k.startswith("acc") and not k.startswith("acc_q")):
        raise SfgError("evaluation produced non-finite accuracies; check the data and model")


def curve_point(acc: np.ndarray) -> tuple[float, float]:
    """One evaluation's point of the accuracy curves every engine reports (``acc_mean``,
    ``acc_p10``): the mean and the 10th percentile of the clients' accuracies ``acc``."""
    return float(acc.mean()), float(np.percentile(acc, 10))


def clock_hours(seconds: list[float]) -> list[float]:
    """The evaluation instants (virtual seconds) in hours, the time axis of the curves on
    the clock (``hours``)."""
    return [float(t / 3600.0) for t in seconds]


def time_to_target(hours: list[float], curve_mean: list[float], target: float) -> dict[str, float]:
    """``time_to_accuracy_h``: the first evaluation time (hours) whose mean accuracy reaches
    ``target`` — NaN with ``reached_target`` 0 when none does."""
    hit = [h for h, a in zip(hours, curve_mean, strict=True) if a >= target]
    return {"time_to_accuracy_h": hit[0] if hit else float("nan"),
            "reached_target": 1.0 if hit else 0.0}
