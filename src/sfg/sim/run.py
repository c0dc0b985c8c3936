"""The training simulator: N personalised models trained in parallel under outages (docs/concepts/round.md#one-round, docs/concepts/training.md#the-training-protocol, docs/concepts/statistics.md#paired-statistics).

One loop, one round at a time (:class:`RoundLoop`, on the run :func:`sfg.sim.context.build_run`
makes):

1. availability and capabilities of round t (the outage process, anatomy mode docs/concepts/outages.md#anatomy-modes, link failures);
2. candidate sets, the rule's weights and the next staleness state (:func:`sfg.round.kernel.play_round`,
   the round the replay runs too);
3. gossip: the weights applied as one sparse row-stochastic product to the flat ``[N, D]``
   parameter store (rows of clients that do not adopt are untouched);
4. K local SGD steps for the clients that train (catch-up, update amplification, backbones);
5. the staleness state of step 2 is taken over (docs/concepts/staleness.md#the-staleness-state); evaluation every ``eval_every`` rounds.

Pairing (docs/concepts/training.md#pairing): graph, partition, initial model, outage trace, link failures and the
minibatch of every (client, round, step) come from streams keyed by the seed only
(:class:`sfg.sim.context.Minibatches`). Minibatches are drawn for *all* clients every round
(whether or not they train), so changing the rule never changes them; catch-up's extra steps
have their own stream ``catchup``.

Minibatches: ``batch_size`` distinct examples of the client's training split when it has at
least that many; a client with fewer examples samples its batch with replacement (reported in
``meta['with_replacement_clients']``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sfg.errors import SfgError, check
from sfg.result import RunResult
from sfg.round.attacks import Heard, availability, claims, true_claims
from sfg.round.certified import evidence_for
from sfg.round.kernel import RoundResult, candidate_mask, caps_at, play_round
from sfg.round.slots import RoundGraph
from sfg.round.staleness import init_state
from sfg.sim.context import (
    BACKBONES,
    ClientData,
    Run,
    accuracy_metrics,
    backbone_momentum,
    build_run,
    check_finite,
    clock_hours,
    curve_point,
    numerics,
    single_threaded,
    time_to_target,
    timed,
)
from sfg.sim.gossip import gossip_
from sfg.sim.minibatches import minibatch_indices
from sfg.world.outages.anatomy import capabilities
from sfg.world.outages.links import live_links_round

# the names other modules and users read from here (one definition each, in sfg.sim.context)
SimResult = RunResult
__all__ = ["BACKBONES", "ClientData", "RoundLoop", "RunResult", "SimResult", "backbone_momentum",
           "minibatch_indices", "numerics", "resolve_config", "simulate", "simulate_config",
           "train"]


def resolve_config(cfg: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """The run's settings, validated by the one schema of a run (:class:`sfg.experiments.config.RunConfig`):
    ``cfg`` then ``overrides``; ``kind`` is taken as ``"train"``. Bad or unknown settings
    raise a one-line :class:`SfgError` naming the key."""
    from sfg.experiments.config import make_config

    values = {k: v for k, v in {**(cfg or {}), **overrides}.items() if k != "kind"}
    return make_config(values, kind="train").model_dump()


class RoundLoop:
    """The rounds engine's state between rounds: the run's models ``X`` (updated in place:
    gossip overwrites the adopters' rows, training the trainers' rows), the staleness state,
    the rule's helpers and the counts. :meth:`play` runs round t."""

    def __init__(self, run: Run, *, record_weights: bool = False,
                 observer: Callable[[dict[str, Any]], None] | None = None):
        from sfg.sim.model_rules import make_model_rule

        c = self.c = run.c
        self.run, self.observer = run, observer
        self.rule = rule = run.rule
        N, T = run.n, run.rounds
        self.attack, self.attackers = run.attack, run.attackers
        self.times = times = run.timings  # seconds per part, meta['timings']
        with timed(times, "setup"):  # the models, the backend, the clients' data, the streams
            self.X = run.initial()
            self.backend = run.backend
            self.clients = run.clients
            self.batches = run.minibatches()
        with timed(times, "trace"):  # availability (the clock's lockstep, the peers' sends)
            self.available = run.available
            self.graph = run.graph  # the union of the exchanges under peers (below)
            self.clock_meta, self.clock_live = self._clock()
            self.caps_all = capabilities(self.available, c["anatomy"])
        self.head = run.head
        self.personal = self.X.clone() if run.backbone == "ditto" else None
        D = run.spec.D
        self.model_rule = (make_model_rule(rule, N=N, D=D, device=run.device)
                           if rule.reads_models else None)
        with timed(times, "graph"):
            rg = RoundGraph.from_graph(self.graph)
        self.undirected_id = rg.edge_id
        self.evidence = evidence_for(rule, self.attack, rg, anatomy=str(c["anatomy"]))
        if self.clock_live is not None or rule.certified:  # deliveries per direction
            from sfg.clock.schedule import directed

            rg = directed(rg)
        self.rg = rg
        self.state = init_state(rg, rounds=T, track_missed=rule.oracle)  # A only for oracles
        attack = self.attack
        if attack is not None and self.model_rule is not None and attack.forges:
            raise SfgError(f"rule {rule.name!r} reads model parameters; forged claims apply to "
                           "model-free rules (use claim=honest to poison models only)")
        constant = attack is not None and attack.model == "constant"
        self.X0 = self.X.clone() if constant else self.X
        self.frozen = self.attackers if constant else None
        self.heard = Heard(rg) if attack is not None else None  # what attackers observed
        self.mixes = (attack is not None and attack.model != "none") or rule.clip \
            or bool(rule.robust)
        self.messages = self.scalars = self.steps_taken = self.steps_dfedavg = 0
        self.curve_round: list[float] = []
        self.curve_mean: list[float] = []
        self.curve_p10: list[float] = []
        self.weights_log: list[np.ndarray] | None = [] if record_weights else None
        self.last_acc: np.ndarray | None = None  # the evaluation of the models as they are
        self.digest = hashlib.blake2b(digest_size=16)  # of every minibatch drawn (pairing)
        self.diag = self._diagnostics()
        self.watch = observer is not None or self.diag is not None  # keep the round's tensors

    def _clock(self):
        """The run's deliveries per slot: the virtual clock's lockstep
        (docs/concepts/clock.md#the-three-protocols: its participants), peers chosen per
        exchange (docs/concepts/peers.md: the union of the exchanges becomes the run's graph,
        :attr:`graph`), both, or neither (None: the graph's links)."""
        c, run = self.c, self.run
        peers = sampler(c)
        if c.get("clock", "rounds") != "virtual":
            if peers.fixed:
                return {}, None
            from sfg.modelfree.peers import sampled_deliveries, schedule_digest

            delta = float(c.get("round_seconds", 600.0))  # Δ: the replay's, dating the tables
            self.graph, live, counts = sampled_deliveries(peers, run.seed, self.available,
                                                          run.graph, delta)
            digest = schedule_digest(f"rounds peers {peers}", self.graph.edges, live)
            return {"schedule_digest": digest, "_counts": counts}, live
        from sfg.clock.replay import per_device_hour
        from sfg.clock.schedule import lockstep_rounds

        cs = run.clock_settings()
        world = run.world_in_time(cs)
        if peers.fixed:
            lk = lockstep_rounds(world, cs, local_steps=run.K, rounds=run.rounds, seed=run.seed)
            part, live, stats, digest = lk.available, lk.live, lk.stats, lk.digest
        else:  # the replay's lockstep under peers (sfg.modelfree.peers), the same sends
            from sfg.modelfree.peers import lockstep_sampled

            part, self.graph, live, stats, digest = lockstep_sampled(
                world, cs, peers, local_steps=run.K, rounds=run.rounds, seed=run.seed)
        self.available = availability(part, self.attack, self.attackers)
        meta = {"clock": "virtual", "protocol": "lockstep", "schedule_digest": digest,
                "message_bytes": cs.message_bytes,
                "_stats": per_device_hour(stats, run.n, world.horizon),
                "_counts": {k: v for k, v in stats.items() if k.endswith("_per_device_hour")}}
        return meta, live

    def _diagnostics(self):
        """The run's :class:`~sfg.sim.diagnostics.Diagnostics` (None when none are asked for)."""
        from sfg.sim.diagnostics import Diagnostics

        tools = self.run.diagnostic_tools()
        if tools is None:
            return None
        return Diagnostics(tools.pop("kinds"), rg=self.rg, available=self.available,
                           seed=self.run.seed, **tools)

    def _live(self, t: int) -> np.ndarray | None:
        """Round t's live links (link failures), per slot on the clock or certified."""
        c, seed = self.c, self.run.seed
        p = float(c["link_failure"])
        live = live_links_round(self.graph.edges.shape[0], t, p=p, seed=seed) if p > 0 else None
        if self.clock_live is not None or self.rule.certified:
            delivered = self.clock_live[t].copy() if self.clock_live is not None \
                else np.ones(self.rg.n_slots, bool)
            if live is not None:
                nbs = self.undirected_id >= 0
                delivered[nbs] &= live[self.undirected_id[nbs]]
            live = delivered
        return live

    def _aggregate(self, t: int, caps, live) -> RoundResult:
        """Step 2 and 3: the round's weights and the aggregated models (reads the models as
        they were at the start of round t)."""
        from sfg.sim.attack_train import mix

        rule, rg, attack, X = self.rule, self.rg, self.attack, self.X
        seed, keep = self.run.seed, self.head if self.run.backbone == "personal-head" else None
        if self.model_rule is not None:
            X_agg, rw = self.model_rule.aggregate(X, rg, self.state, caps, live=live, seed=seed)
            if keep is not None:
                X_agg[:, keep] = X[:, keep]
            self.X = X_agg
            return rw
        evidence = self.evidence
        cand = None if evidence is None else candidate_mask(rg, caps, live)
        forged = None if attack is None else claims(attack, rg, self.state, self.attackers,
                                                    seed=seed, heard=self.heard,
                                                    evidence=evidence, cand_now=cand)
        if evidence is not None:
            told = forged if forged is not None else true_claims(rg, self.state)
            if rule.certified:  # refused claims: excluded, as lost messages
                live = evidence.screen(told, cand, live)
        rw = play_round(rule, rg, self.state, caps, seed=seed, live=live, slot_staleness=forged,
                        attackers=None if attack is None else self.attackers, frozen=self.frozen)
        if self.heard is not None and forged is not None:
            self.heard.note(rg, rw.candidate, forged)
        if evidence is not None:  # the heard-sets: what was received
            evidence.note(cand, told)
        if self.mixes:  # a poisoned model, +clip or a robust aggregator (sfg.sim.attack_train)
            X_mix = mix(X, self.X0, rg, rw.weights, rw.candidate, caps.adopt, self.attackers,
                        attack, clip=rule.clip, seed=seed, t=t, rule=rule, rounds=self.run.rounds)
            if keep is not None:
                X_mix[:, keep] = X[:, keep]
            self.X = X_mix
        else:
            gossip_(X, rg, rw.weights, caps.adopt, keep=keep)
        return rw

    def _train(self, t: int, caps) -> None:
        """Step 4: local training of the clients that train (minibatches drawn for all
        clients: rule-independent)."""
        run, rule, K = self.run, self.rule, self.run.K
        base_idx, _ = self.batches.round(t)
        self.digest.update(base_idx.tobytes())
        trains = caps.train
        steps = rule.local_steps(K, trains, self.state.ages)
        n_train = int(np.count_nonzero(trains))
        self.steps_taken += int(steps.sum())
        self.steps_dfedavg += n_train * K
        finite = True
        X, personal, device = self.X, self.personal, run.device
        groups = [K] if not rule.catchup else np.unique(steps[steps > 0])
        for n_steps in groups if n_train else ():
            group = np.flatnonzero(steps == n_steps)
            xs, ys = self.clients.gather(group, *self.batches.select(group, t, int(n_steps)))
            gi = torch.from_numpy(group).to(device)
            start = X.index_select(0, gi)
            trained = rule.amplified(start, run.train(self.backend, start, xs, ys),
                                     self.state.ages[group])
            X.index_copy_(0, gi, trained)
            finite = finite and bool(torch.isfinite(trained.sum(dim=1)).all())
            if personal is not None:
                pers = run.train(self.backend, start, xs, ys,
                                 personal=personal.index_select(0, gi), center=start)
                personal.index_copy_(0, gi, pers)
                finite = finite and bool(torch.isfinite(pers.sum(dim=1)).all())
        if not finite:  # divergence is reported, never averaged into neighbours
            bad_rows = ~torch.isfinite(X.sum(dim=1))
            if personal is not None:
                bad_rows |= ~torch.isfinite(personal.sum(dim=1))
            i = int(torch.nonzero(bad_rows)[0])
            raise SfgError(f"training diverged (non-finite parameters) at round {t} on client {i}; "
                           f"lower --lr (now {run.lr}) or check the data")

    def play(self, t: int) -> None:
        """Round t: aggregation, local training, the staleness update, evaluation."""
        times = self.times
        with timed(times, "rounds"):  # the round's bookkeeping: who, the weights, gossip
            caps = caps_at(self.caps_all, t)
            live = self._live(t)
            X_start = self.X.clone() if self.watch else self.X
            rw = self._aggregate(t, caps, live)
            X_agg = self.X.clone() if self.watch else self.X
            if self.weights_log is not None:
                self.weights_log.append(rw.weights.copy())
            nb = int(np.count_nonzero(rw.candidate & ~self.rg.is_self))
            self.messages += nb
            self.scalars += nb * self.rule.scalars_per_message
        self.last_acc = None
        with timed(times, "train"):
            self._train(t, caps)
        if self.watch:
            seen = {"t": t, "X": X_start, "X_agg": X_agg, "X_next": self.X,
                    "weights": rw.weights, "candidate": rw.candidate, "caps": caps,
                    "state": self.state, "rg": self.rg, "personal": self.personal,
                    "head": self.head}
            if self.observer is not None:
                self.observer(seen)
            if self.diag is not None:  # docs/concepts/diagnostics.md#training-diagnostics: reads the models, draws from its own streams
                self.diag.observe(seen)
        self.state = rw.state
        if (t + 1) % int(self.c["eval_every"]) == 0 or t == self.run.rounds - 1:
            mean, p10 = curve_point(self.evaluate(fresh=True))
            self.curve_round.append(float(t + 1))
            self.curve_mean.append(mean)
            self.curve_p10.append(p10)

    def evaluate(self, fresh: bool = False) -> np.ndarray:
        """float64 [N] every client's test accuracy of its model as it is now (evaluated once
        for the models of one round: the last round's evaluation is the final one)."""
        if self.last_acc is None or fresh:
            with timed(self.times, "evaluate"):
                self.last_acc = self.run.evaluate(self.personal if self.personal is not None
                                                  else self.X)
        return self.last_acc

    def result(self, acc: np.ndarray, seconds: float) -> RunResult:
        """The run's :class:`RunResult` with the final accuracies ``acc``."""
        from sfg.metrics import unavailability

        c, run = self.c, self.run
        metrics = {
            **accuracy_metrics(acc, self.curve_mean, self.available.mean(axis=0),
                               self.attackers if c.get("attack") is not None else None),
            "messages": float(self.messages), "scalars": float(self.scalars),
            "local_steps_rel": float(self.steps_taken / self.steps_dfedavg)
            if self.steps_dfedavg else float("nan"),
            "unavailability": unavailability(self.available.sum(axis=0),
                                             self.available.shape[0]),
        }
        if self.rule.certified and self.evidence is not None:  # neighbour claims refused
            metrics["claims_refused"] = self.evidence.refused_share
        check_finite(metrics)
        curves = {"round": self.curve_round, "acc_mean": self.curve_mean,
                  "acc_p10": self.curve_p10}
        meta = {"seconds": seconds,
                "with_replacement_clients": int((self.clients.sizes < run.B).sum()),
                "backend": getattr(self.backend, "name", ""), "D": run.spec.D,
                "minibatch_digest": self.digest.hexdigest(), "client_steps": self.steps_taken,
                "numerics": numerics(), "timings": dict(self.times)}
        clock_meta = dict(self.clock_meta)
        metrics.update(clock_meta.pop("_counts", {}))  # peers: their costs, as the replay's
        if "_stats" in clock_meta:  # lockstep on the clock: the same time metrics as async and event
            metrics.update(clock_meta.pop("_stats"))
            hours = clock_hours([r * float(c["round_seconds"]) for r in self.curve_round])
            target = float(c.get("target_accuracy", 0.8))
            metrics.update(time_to_target(hours, self.curve_mean, target))
            curves["hours"] = hours
            meta.update(clock_meta, target_accuracy=target)
        else:  # the rounds under peers: the digest of their sends
            meta.update(clock_meta)
        return RunResult(metrics=metrics, curves=curves, accuracy=acc, params=self.X,
                         personal=self.personal, state=self.state, meta=meta,
                         weights_log=self.weights_log,
                         diagnostics=self.diag.result() if self.diag is not None else None)


def sampler(c: dict[str, Any]):
    """The run's ``peers`` (docs/concepts/peers.md), checked against its clients and its rule:
    a rule that keeps state per neighbour is refused with one line under ``peers`` ≠ fixed
    (:func:`sfg.modelfree.peers.check_rule`, the replay's check)."""
    from sfg.modelfree.peers import check_rule
    from sfg.round.rules import parse_rule
    from sfg.world.peers import parse_peers

    peers = parse_peers(c.get("peers", "fixed")).check(int(c["n_clients"]))
    check_rule(parse_rule(c["rule"]), peers)
    return peers


def simulate(cfg: dict[str, Any] | None = None, *, progress: Callable[[int, int], None] | None = None,
             record_weights: bool = False, observer: Callable[[dict[str, Any]], None] | None = None,
             validated: bool = False, **overrides: Any) -> RunResult:
    """Run one training simulation (docs/concepts/round.md#one-round, docs/concepts/training.md#the-training-protocol) on the rounds, or on the virtual clock's
    lockstep. ``cfg``: the fields of :class:`sfg.experiments.config.RunConfig` (missing ones
    take their defaults).

    ``validated``: ``cfg`` is already :func:`resolve_config`'s output (every field), taken as
    it is without the schema, so the run needs no pydantic (``benchmarks/bench_gpu.py`` on a
    device machine); no overrides then.

    ``record_weights`` keeps every round's slot weights in ``RunResult.weights_log``;
    ``observer`` is called once per round with the round's tensors (``t``, ``X`` at the start
    of the round, ``X_agg``, ``X_next``, ``weights``, ``caps``, ``state``) for inspection.
    """
    if validated:
        check(cfg is not None and not overrides,
              "simulate(validated=True) takes one resolved config and no overrides")
        c = dict(cfg)
    else:
        c = resolve_config(cfg, **overrides)
    t0 = time.perf_counter()
    engine = "rounds" if c.get("clock", "rounds") != "virtual" else \
        f"clock-{c.get('protocol', 'lockstep')}"
    if engine not in ("rounds", "clock-lockstep"):
        raise SfgError(f"protocol {c.get('protocol')!r} trains through sfg.clock.train")
    sampler(c)  # before the data is read
    loop = RoundLoop(build_run(c, engine=engine), record_weights=record_weights,
                     observer=observer)
    with single_threaded():
        for t in range(loop.run.rounds):
            loop.play(t)
            if progress is not None:
                progress(t + 1, loop.run.rounds)
        acc = loop.evaluate()
    return loop.result(acc, time.perf_counter() - t0)


def simulate_config(cfg: dict[str, Any], *, progress: Callable[[int, int], None] | None = None) -> dict:
    """The grid runner's ``kind: train``: metrics and curves of one run."""
    return simulate(cfg, progress=progress).summary()


def train(c: dict[str, Any], *, progress: Callable[[int, int], None] | None = None
          ) -> RunResult:
    """Train ``c`` (resolved settings) on the engine its ``clock``/``protocol`` name: the
    rounds or the clock's lockstep (:func:`simulate`), the clock's async or event protocol
    (:func:`sfg.clock.train.simulate_events`)."""
    if c.get("clock", "rounds") == "virtual" and c.get("protocol", "lockstep") != "lockstep":
        from sfg.clock.train import simulate_events

        return simulate_events(c, progress=progress)
    return simulate(c, progress=progress, validated=True)
