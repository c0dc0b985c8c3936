"""Model-free replay on the virtual clock (docs/concepts/replay.md#model-free-analyses on the clock of docs/concepts/clock.md#the-virtual-clock): staleness, weights
and the replay metrics for the three protocols, without training.

* ``lockstep`` runs the round-based replay (:func:`sfg.modelfree.driver.run_lane`) on the
  lockstep schedule's participants and deliveries: every metric of docs/concepts/replay.md#model-free-analyses, the self-return H
  and the attackers' reach included.
* ``async`` and ``event`` run the schedule's events through the round's compiled parts
  (:func:`sfg.round.kernel.run_events`); the metrics are the same facts summarised the same
  way (:mod:`sfg.modelfree.metrics`) over aggregations instead of rounds. H and the reach are
  defined on synchronous rounds' mixing matrices and are reported as NaN (not defined) here.
  The curves are the mean age and lag sampled every unit (P or Δ) of virtual time.

Every result carries the schedule's counts (local rounds, skipped and interrupted wakes,
stragglers, late and lost messages, compute-seconds, bytes) per device-hour of the run
(N · T · Δ device-seconds) and its digest (``meta.schedule_digest``; the same for every rule of
a seed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sfg.clock.schedule import LOCAL, Schedule, World, lockstep_rounds, make_schedule, make_world
from sfg.clock.settings import ClockSettings, make_settings
from sfg.errors import SfgError
from sfg.round.attacks import Attack, check_rounds_only, parse_attack, place, random_claims_clock
from sfg.round.certified import check_rounds_only as certified_in_rounds
from sfg.round.defences import GUARD
from sfg.round.kernel import CLAIM_CODE, FACTS, HONEST, RANDOM, run_events
from sfg.round.rules import Rule, parse_rule
from sfg.util.rng import stream

# schedule counts reported per device-hour
PER_HOUR = ("local_rounds", "messages_sent", "delivered", "bytes_sent", "compute_seconds",
            "pull_requests", "pull_replies", "pull_empty", "pull_unreachable", "pull_bytes",
            "pull_wait_seconds")


def per_device_hour(stats: dict[str, float], n: int, horizon: float) -> dict[str, float]:
    """The schedule's counts under their metric names (:func:`sfg.metrics.clock_name`), and
    the main ones per device-hour (N · horizon / 3600)."""
    from sfg.metrics import clock_name

    hours = n * horizon / 3600.0
    out = {name: float(v) for k, v in stats.items() if (name := clock_name(k)) is not None}
    for k in PER_HOUR:
        if k in stats:
            out[f"{clock_name(k)}_per_device_hour"] = float(stats[k]) / hours if hours \
                else float("nan")
    return out


class EventStaleness:
    """The staleness of the schedule's events under ``rule``, run in one go
    (:meth:`run` with no arguments: every event in time order, with the sampled curves) or
    in batches (``run(order, given)``: the events ``order`` — a dependency level's, see
    :mod:`sfg.clock.train` — with scores ``given`` [C] computed outside, for the rules that
    read models). :meth:`result` gives the state, weights, facts, curves and headers."""

    def __init__(self, rule: Rule, world: World, sched: Schedule, *, seed: int,
                 attack: Attack | None = None):
        rg, n = (world.rg if sched.rg is None else sched.rg), world.n
        R, C = sched.n_events, int(sched.cptr[-1])
        self.rule, self.rg, self.sched = rule, rg, sched
        check_rounds_only(attack, "the virtual clock's async and event protocols")
        certified_in_rounds(rule, "the virtual clock's async and event protocols")
        if rule.robust:  # model-reading aggregators: training in rounds only
            from sfg.round.rules import check_model_defences

            check_model_defences(rule, "the virtual clock's async and event protocols")
        self.attackers = place(attack, n, np.diff(rg.indptr) - 1, seed=seed)
        self.forge = HONEST
        self.marks = np.zeros((2, n), bool)
        if attack is not None and self.attackers.any():
            self.marks[0] = self.attackers
            if attack.model == "constant":
                self.marks[1] = self.attackers
            self.forge = CLAIM_CODE[attack.claim]
        self.rnd = (random_claims_clock(seed, sched.t) if self.forge == RANDOM
                    else np.zeros((0, 0)))
        self.u = self.key = np.zeros(0)
        if rule.random:
            g = stream(seed, "clock-rule-draws")
            self.u, self.key = g.random(R), g.random(C)
        self.st = np.zeros((4, n), np.int64)
        self.st[1] = 1
        self.st[2] = 1
        self.lags = np.zeros(n)
        self.q = np.ones(rg.n_slots)
        self.hdr = np.zeros((5, R), np.int64)
        self.hdr_lag = np.zeros(R)
        self.w = np.zeros(C)
        self.facts = np.zeros((R, len(FACTS)))
        self.curve = np.zeros((2, sched.samples.shape[0]))
        self.ev = np.full((2, rg.n_slots), -1, np.int64) if rule.defence_flags & GUARD else None

    def run(self, order: np.ndarray | None = None, given: np.ndarray | None = None) -> None:
        s = self.sched
        whole = order is None
        run_events(self.rule, self.rg, times=s.time, kind=s.kind, dev=s.dev, tt=s.t,
                   amount=s.amount, cptr=s.cptr, cslot=s.cslot, cmsg=s.cmsg, cwait=s.cwait,
                   u=self.u, key=self.key, st=self.st, lags=self.lags, q=self.q, hdr=self.hdr,
                   hdr_lag=self.hdr_lag, w=self.w, facts=self.facts, marks=self.marks,
                   forge=self.forge, rnd=self.rnd,
                   samples=s.samples if whole else np.zeros(0),
                   curve=self.curve if whole else np.zeros((2, 0)), ev=self.ev, order=order,
                   given=given, caps=s.caps, track_q=s.peers is None)

    def result(self) -> dict[str, Any]:
        return {"ages": self.st[0], "counts": self.st[1], "local_counts": self.st[2],
                "lags": self.lags, "q_hat": self.q, "weights": self.w, "facts": self.facts,
                "curve": self.curve, "hdr": self.hdr, "hdr_lag": self.hdr_lag,
                "attackers": self.attackers}


def staleness_events(rule: Rule, world: World, sched: Schedule, *, seed: int,
                     attack: Attack | None = None) -> dict[str, Any]:
    """Run the schedule's events with ``rule`` (model-free): the state after them, every
    local round's weights over its candidates ``w`` [C], facts [R, F], the sampled curves
    [2, S] and the headers each local round sent. ``attack``: forged claims on the
    attackers' messages (what an attacker can know: its own candidates). An oracle's scores
    come from the missed-fraction rows (:func:`sfg.clock.missed.oracle_scores`, a pass by
    dependency level), then every event runs once more in time order with them."""
    given = None
    if rule.oracle:
        from sfg.clock.missed import oracle_scores

        given = oracle_scores(EventStaleness(rule, world, sched, seed=seed, attack=attack),
                              rule, sched, world.n)
    es = EventStaleness(rule, world, sched, seed=seed, attack=attack)
    es.run(given=given)
    return es.result()


class PieceStaleness:
    """:class:`EventStaleness` over a schedule's pieces (:mod:`sfg.clock.assemble`), one at
    a time and in time order, for the rules that draw nothing and read no models, without an
    attack: the devices' state carries over, and of the headers only those that a later
    piece's candidates may still read (the piece's ``keep``). Memory O(N), whatever the
    length of the run. The facts of each piece go into ``acc`` (:class:`Accumulator`), the
    sampled curves into ``curve``."""

    def __init__(self, rule: Rule, world: World, *, n_samples: int, rg=None):
        from sfg.modelfree.metrics import Accumulator

        rg, n = world.rg if rg is None else rg, world.n
        certified_in_rounds(rule, "the virtual clock's async and event protocols")
        if rule.robust:  # model-reading aggregators: training in rounds only
            from sfg.round.rules import check_model_defences

            check_model_defences(rule, "the virtual clock's async and event protocols")
        self.rule, self.rg = rule, rg
        self.st = np.zeros((4, n), np.int64)
        self.st[1] = 1
        self.st[2] = 1
        self.lags = np.zeros(n)
        self.q = np.ones(rg.n_slots)
        self.ev = np.full((2, rg.n_slots), -1, np.int64) if rule.defence_flags & GUARD else None
        self.marks = np.zeros((2, n), bool)
        self.ids = np.zeros(0, np.int64)  # the headers kept: events' ids in the schedule
        self.hdr, self.hdr_lag = np.zeros((5, 0), np.int64), np.zeros(0)
        self.acc = Accumulator()
        self.curve = np.zeros((2, n_samples))
        self.s0 = self.aggregations = 0

    def run(self, p: Schedule) -> None:
        R, base, P = p.n_events, p.first, self.ids.size
        # candidates' sending events: this piece's (0..R-1), then the kept ones (R..R+P-1)
        cmsg = p.cmsg.copy()
        old = (cmsg >= 0) & (cmsg < base)
        cmsg[cmsg >= base] -= base
        if old.any():
            pos = np.searchsorted(self.ids, cmsg[old])
            cmsg[old] = R + pos
        hdr = np.zeros((5, R + P), np.int64)
        hdr[:, R:] = self.hdr
        hdr_lag = np.concatenate([np.zeros(R), self.hdr_lag])
        facts = np.zeros((R, len(FACTS)))
        curve = np.zeros((2, p.samples.shape[0]))
        z = np.zeros(0)
        run_events(self.rule, self.rg, times=p.time, kind=p.kind, dev=p.dev, tt=p.t,
                   amount=p.amount, cptr=p.cptr, cslot=p.cslot, cmsg=cmsg, cwait=p.cwait,
                   u=z, key=z, st=self.st, lags=self.lags, q=self.q, hdr=hdr,
                   hdr_lag=hdr_lag, w=np.zeros(int(p.cptr[-1])), facts=facts,
                   marks=self.marks, forge=HONEST, rnd=np.zeros((0, 0)), samples=p.samples,
                   curve=curve, ev=self.ev, caps=p.caps, track_q=p.peers is None)
        self.acc.add(facts[None])
        self.curve[:, self.s0:self.s0 + curve.shape[1]] = curve
        self.s0 += curve.shape[1]
        self.aggregations += int(np.count_nonzero(p.kind == LOCAL))
        keep = p.keep if p.keep is not None else np.zeros(0, np.int64)
        at = np.where(keep >= base, keep - base, R + np.searchsorted(self.ids, keep))
        self.ids, self.hdr, self.hdr_lag = keep, hdr[:, at], hdr_lag[at]


def streams(rule: Rule, attack: Attack | None) -> bool:
    """Whether the model-free replay of ``rule`` runs through its schedule piece by piece
    (:class:`PieceStaleness`): no draws of its own, no oracle, no attack."""
    return attack is None and not rule.random and not rule.oracle


# events per piece of a streamed replay (about 1 kB each while it is assembled)
SPAN_EVENTS = 1_000_000


def _event_metrics(rule: Rule, world: World, settings: ClockSettings, *, seed: int,
                   attack: Attack | None, local_steps: int, link_failure: float,
                   anatomy: str, peers=None
                   ) -> tuple[dict[str, float], dict[str, list[float]], dict, str]:
    from sfg.clock.assemble import SpilledDigest, curve_times
    from sfg.modelfree.metrics import Accumulator, RunEnd

    kw = {"local_steps": local_steps, "seed": seed, "catchup": rule.catchup,
          "link_failure": link_failure, "anatomy": anatomy, "peers": peers}
    if streams(rule, attack):
        ps = None
        dig = SpilledDigest(settings.protocol)
        every = max(1, SPAN_EVENTS // max(world.n, 1))
        for piece in make_schedule(world, settings, every=every, **kw):
            if ps is None:  # (peers chosen per exchange: the run's union graph)
                ps = PieceStaleness(rule, world, rg=piece.rg,
                                    n_samples=curve_times(world, settings.unit).size)
            dig.add(piece)
            ps.run(piece)
            stats = piece.stats
        assert ps is not None
        acc, final_lags, curve, aggs = ps.acc, ps.lags, ps.curve, ps.aggregations
        samples, digest, unit = curve_times(world, settings.unit), dig.hexdigest(), settings.unit
    else:
        sched = make_schedule(world, settings, **kw)
        got = staleness_events(rule, world, sched, seed=seed, attack=attack)
        acc = Accumulator()
        acc.add(got["facts"][None])
        final_lags, curve = got["lags"], got["curve"]
        aggs = int(np.count_nonzero(sched.kind == LOCAL))
        samples, digest, stats, unit = sched.samples, sched.digest(), sched.stats, sched.unit
    end = RunEnd(available=np.zeros((1, 1), bool), H=np.zeros(0), sampled=False,
                 final_lags=final_lags, reach=float("nan"))
    metrics, _ = acc.summary(end, attack=attack is not None, defence=bool(rule.defence_flags))
    from sfg.metrics import unavailability

    metrics["unavailability"] = unavailability(world.online.online_seconds(), world.horizon)
    units = samples / unit
    curves = {"round": units.tolist(), "hours": (samples / 3600.0).tolist(),
              "mean_age": curve[0].tolist(), "mean_lag": curve[1].tolist()}
    metrics["aggregations"] = float(aggs)
    return metrics, curves, stats, digest


def peer_costs(stats: dict[str, float], n: int, horizon: float) -> dict[str, float]:
    """The costs of peers chosen per exchange (docs/concepts/peers.md#costs) in a schedule's
    counts, per device-hour of the run: messages, those to offline targets, membership bytes
    (none under fixed)."""
    from sfg.clock.assemble import PEER_COUNTS

    hours = n * horizon / 3600.0
    return {f"{k}_per_device_hour": stats[k] / hours for k in PEER_COUNTS if k in stats}


def replay_clock(process: str, rule: str | Rule, *, seed: int, settings: ClockSettings,
                 n: int = 100, rounds: int = 300, graph: str = "knn:k=6", local_steps: int = 10,
                 anatomy: str = "full", link_failure: float = 0.0, horizon: int = 50,
                 attack: str | None = None, world: World | None = None,
                 peers: str | None = None) -> dict[str, Any]:
    """One model-free replay on the clock: ``{"metrics", "curves", "meta"}`` (see the module
    docstring). ``rounds`` T: the run lasts T·Δ of virtual time. ``world``: reuse one seed's
    world across rules (it does not depend on the rule). ``peers`` (docs/concepts/peers.md):
    whom each local round sends to (async and event, :mod:`sfg.clock.peersim`)."""
    from sfg.world.peers import parse_peers

    r = parse_rule(rule) if isinstance(rule, str) else rule
    sampler = parse_peers(peers).check(n)
    if not sampler.fixed:
        from sfg.clock.peersim import check_clock
        from sfg.modelfree.peers import check_rule

        check_rule(r, sampler)
        check_clock(sampler, settings, anatomy=anatomy, link_failure=link_failure)
    if r.reads_models or r.clip:
        # sfg run trains model-reading rules on the lockstep clock only (sfg.clock.train)
        raise SfgError(f"rule {str(r)!r} reads model parameters; the model-free replay covers "
                       "model-free rules only — run it with `sfg run --clock virtual"
                       f"{'' if settings.protocol == 'lockstep' else ' --protocol lockstep'}`")
    settings = settings.with_bytes(0.0)
    a = parse_attack(attack)
    if world is None:
        world = make_world(settings, process=process, graph=graph, n=n, rounds=rounds, seed=seed)
    if settings.protocol == "lockstep":
        from sfg.modelfree.driver import Lane, run_lane

        if sampler.fixed:
            lk = lockstep_rounds(world, settings, local_steps=local_steps, rounds=rounds,
                                 seed=seed)
            lane = Lane(lk.available, world.graph, r, seed, a, live=lk.live)
            stats, digest = lk.stats, lk.digest
        else:  # peers chosen per exchange (sfg.modelfree.peers)
            from sfg.modelfree.peers import lockstep_sampled

            part, union, live, stats, digest = lockstep_sampled(
                world, settings, sampler, local_steps=local_steps, rounds=rounds, seed=seed)
            lane = Lane(part, union, r, seed, a, live=live)
        res = run_lane(lane, anatomy=anatomy, link_failure=link_failure, horizon=horizon,
                       exact_pairs=200_000, sample_pairs=1000, threads=1)
        metrics, curves = dict(res.metrics), dict(res.curves)
        curves["hours"] = [float(x) * settings.round_seconds / 3600.0 for x in curves["round"]]
    else:
        metrics, curves, stats, digest = _event_metrics(
            r, world, settings, seed=seed, attack=a, local_steps=local_steps,
            link_failure=link_failure, anatomy=anatomy, peers=sampler)
    metrics.update(per_device_hour(stats, world.n, world.horizon))
    if not sampler.fixed and settings.protocol != "lockstep":  # (lockstep's are per hour)
        metrics.update(peer_costs(stats, world.n, world.horizon))
    elif not sampler.fixed:
        metrics.update({k: v for k, v in stats.items() if k.endswith("_per_device_hour")})
    meta = {"clock": "virtual", "protocol": settings.protocol, "schedule_digest": digest,
            "virtual_seconds": world.horizon, "unit_seconds": settings.unit}
    return {"metrics": metrics, "curves": curves, "meta": meta}


def clock_replay_config(cfg: dict[str, Any], *, progress=None) -> dict:
    """The grid runner's ``kind: replay`` with ``clock: virtual``."""
    settings = make_settings(cfg)
    out = replay_clock(cfg.get("process", "none"), cfg.get("rule", "dfedavg"),
                       seed=int(cfg.get("seed", 1)), settings=settings,
                       n=int(cfg.get("n_clients", 100)), rounds=int(cfg.get("rounds", 300)),
                       graph=cfg.get("graph", "knn:k=6"),
                       local_steps=int(cfg.get("local_steps", 10)),
                       anatomy=cfg.get("anatomy", "full"),
                       link_failure=float(cfg.get("link_failure", 0.0)),
                       horizon=int(cfg.get("horizon", 50)), attack=cfg.get("attack"),
                       peers=cfg.get("peers"))
    if progress is not None:
        progress(1, 1)
    return out


def replay_clock_rows(processes: list[str], rules: list[str], seeds: list[int], *,
                      settings: ClockSettings, n: int = 100, rounds: int = 300,
                      graph: str = "knn:k=6", local_steps: int = 10, anatomy: str = "full",
                      link_failure: float = 0.0, horizon: int = 50,
                      attacks: list[str | None] | None = None, with_curves: bool = False,
                      progress=None, peers: str | None = None) -> list[dict[str, Any]]:
    """``sfg replay --clock virtual``: processes × rules × seeds (× attacks), one row each, as
    :func:`sfg.modelfree.replay` gives them; each (process, seed) world is built once and shared
    by its rules (it does not depend on them)."""
    parsed = [parse_rule(r) for r in rules]  # validate every name before any work
    atts = list(attacks or [None])
    tag = any(a is not None for a in atts)
    rows: list[dict[str, Any]] = []
    total = len(processes) * len(seeds) * len(parsed) * len(atts)
    for p in processes:
        for seed in seeds:
            world = make_world(settings.with_bytes(0.0), process=p, graph=graph, n=n,
                               rounds=rounds, seed=seed)
            for r in parsed:
                for a in atts:
                    out = replay_clock(p, r, seed=seed, settings=settings, n=n, rounds=rounds,
                                       graph=graph, local_steps=local_steps, anatomy=anatomy,
                                       link_failure=link_failure, horizon=horizon, attack=a,
                                       world=world, peers=peers)
                    row = {"process": p, "rule": str(r), "seed": seed,
                           **({"attack": a or "none"} if tag else {}), **out["metrics"],
                           "schedule_digest": out["meta"]["schedule_digest"]}
                    if with_curves:
                        row["curves"] = out["curves"]
                    rows.append(row)
                    if progress is not None:
                        progress(len(rows), total)
    return rows
