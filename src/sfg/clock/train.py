"""Training on the virtual clock (docs/concepts/clock.md#the-virtual-clock with the training protocol of docs/concepts/training.md#the-training-protocol).

``lockstep`` is ``sfg run`` itself (:func:`sfg.sim.run.simulate`) on the lockstep schedule's
participants and deliveries, so every rule, backbone and diagnostic runs there (the async
and event protocols take the backbones, the model-reading rules, the oracles, the anatomy
modes and the training diagnostics too: below; the diagnostics, docs/concepts/diagnostics.md#training-diagnostics with one staleness
unit for a round, in :mod:`sfg.clock.diagnostics`, read every batch's models as they are
computed and change nothing).

``async`` and ``event`` (:func:`simulate_events`) first fix the schedule (model-free,
rule-independent), then run the rule's staleness over it (:func:`sfg.clock.replay.staleness_events`:
every local round's weights over its candidates), and only then compute the models, batched:
a local round's model is needed only by the local rounds that read it (its own device's next
one, and the receivers of its messages) and by the evaluations after it, so every local round
gets a *level* (one more than the levels of the models it reads) and all local rounds of one
level aggregate and train together, as one batch through the training backend. Asynchrony
therefore never falls back to one client at a time: the batches are about as large as the
synchronous run's rounds.

Pairing (docs/concepts/training.md#pairing, docs/concepts/clock.md#pairing-and-the-schedule-digest): data, graph, initial models, world and schedule come from the seed
(the run every engine builds, :func:`sfg.sim.context.build_run`); device i's local round keyed
``step`` (its wake index under async, its count of completed local rounds under event) trains
on the minibatches ``sfg run`` draws for client i in round ``step``
(:class:`sfg.sim.context.Minibatches`), whatever the rule. Evaluation every ``eval_seconds`` of
virtual time uses each device's model as it stands then (its last completed local round).

Metrics: as ``sfg run`` (final and time-averaged accuracy, per-availability-quartile means),
plus ``time_to_accuracy_h``: the first evaluation time (hours) at which the mean accuracy
reaches ``target_accuracy`` — NaN with ``reached_target`` 0 when it never does — and the
schedule's counts per device-hour (:func:`sfg.clock.replay.per_device_hour`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from sfg.clock.instant import EVAL_SIDE, eval_every_seconds, evaluation_instants
from sfg.clock.schedule import (
    LOCAL,
    Schedule,
    dependency_levels,
    level_candidates,
    level_plan,
    make_schedule,
)
from sfg.clock.settings import make_settings
from sfg.errors import SfgError
from sfg.util.numba_start import njit


@njit(cache=True, nogil=True)
def _last_by(ptr, vals, group, q):  # pragma: no cover - compiled
    """For each query: the index of the last value ≤ q[k] in group[k]'s sorted run
    vals[ptr[g]:ptr[g+1]], or −1."""
    out = np.empty(group.shape[0], np.int64)
    for k in range(group.shape[0]):
        a, b = ptr[group[k]], ptr[group[k] + 1]
        j = a + np.searchsorted(vals[a:b], q[k], side=EVAL_SIDE) - 1
        out[k] = j if j >= a else -1
    return out


class _Pool:
    """Models by id in one [capacity, D] tensor with a free list: the initial models are ids
    0..N−1, local round r's model is id N + r.

    Initial models given as one row expanded over the N devices (the common initial model)
    are held once, in row 0, which every initial id reads; the store is sized once from the
    plan (:meth:`reserve`: the most models alive at once) or grows."""

    def __init__(self, X0: torch.Tensor, n_ids: int):
        self.n0 = X0.shape[0]
        self.shared = int(self.n0 > 1 and X0.stride(0) == 0)  # rows below are never freed
        self.buf = X0[:1].clone() if self.shared else X0.clone()
        self.free: list[int] = []
        self.row = np.full(n_ids, -1, np.int64)
        self.row[: self.n0] = 0 if self.shared else np.arange(self.n0)
        self.alive = np.zeros(n_ids, bool)
        self.alive[: self.n0] = True
        self.live = self.peak = self.n0

    def reserve(self, capacity: int) -> _Pool:
        """Room for ``capacity`` more models beside those held; returns the pool."""
        start = self.buf.shape[0]
        self.buf = torch.cat([self.buf, self.buf.new_empty((capacity, self.buf.shape[1]))])
        self.free.extend(range(start + capacity - 1, start - 1, -1))
        return self

    def put(self, ids: np.ndarray, X: torch.Tensor) -> None:
        k = ids.size
        take = [self.free.pop() for _ in range(min(k, len(self.free)))]
        need = k - len(take)
        if need:
            start = self.buf.shape[0]
            grow = max(need, start // 2)
            self.buf = torch.cat([self.buf, self.buf.new_empty((grow, self.buf.shape[1]))])
            self.free.extend(range(start + grow - 1, start + need - 1, -1))
            take.extend(range(start, start + need))
        rows = np.array(take, np.int64)
        self.buf.index_copy_(0, torch.from_numpy(rows), X)
        self.row[ids] = rows
        self.live += int(k - np.count_nonzero(self.alive[ids]))
        self.alive[ids] = True
        self.peak = max(self.peak, self.live)

    def get(self, ids: np.ndarray) -> torch.Tensor:
        assert self.alive[ids].all(), "a model was read after it was freed"
        return self.buf.index_select(0, torch.from_numpy(self.row[ids]))

    def drop(self, ids: np.ndarray) -> None:
        ids = ids[self.alive[ids]]
        rows = self.row[ids]
        self.free.extend(rows[rows >= self.shared].tolist())
        self.row[ids] = -1
        self.alive[ids] = False
        self.live -= ids.size


# "every neighbour's latest message is a candidate": a window longer than any run
_UNBOUNDED = 1e12


def _poisoned(M: torch.Tensor, cidx: np.ndarray, sched: Schedule, attackers: np.ndarray,
              attack, X0: torch.Tensor, seed: int) -> torch.Tensor:
    """The candidates' models as sent: an attacker's message poisoned as the rounds poison it
    (:func:`sfg.sim.attack_train.poisoned`, keyed by the sending local round)."""
    from sfg.sim.attack_train import poisoned

    msg = sched.cmsg[cidx]
    hit = np.flatnonzero((msg >= 0) & attackers[np.where(msg >= 0, sched.dev[msg], 0)])
    if hit.size == 0:
        return M
    M = M.clone()
    for k in hit:  # few: the attackers' messages of one batch
        j, m = int(sched.dev[msg[k]]), int(msg[k])
        M[k] = poisoned(M[k:k + 1], X0[j:j + 1], attack, seed=seed, key=m)[0]
    return M


def _clipped(M: torch.Tensor, wt: torch.Tensor, row: np.ndarray, first: np.ndarray,
             n: int) -> torch.Tensor:
    """``+clip`` per local round: x̃ = x + Σ_{j≠i} w_j · clip(x_j − x, r), r the lower median
    distance to the round's neighbour candidates (:func:`sfg.sim.attack_train.clipped_steps`,
    the rounds' own definition)."""
    from sfg.sim.attack_train import clipped_steps

    own = M[torch.from_numpy(first)]
    out = own.clone()
    nb = np.ones(row.size, bool)
    nb[first] = False
    sl = np.flatnonzero(nb)
    if sl.size == 0:
        return out
    r_of = row[sl]
    diff = M[torch.from_numpy(sl)] - own[torch.from_numpy(r_of)]
    out.index_add_(0, torch.from_numpy(r_of), clipped_steps(diff, r_of, wt[torch.from_numpy(sl)], n))
    return out


def _as_seen(es, sched: Schedule, cidx: np.ndarray, first: np.ndarray,
             devs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates' ages and lags as their receivers see them before the local rounds
    (the receiver's own state; a message's header, waited: age τ + ⌊d⌋, lag ℓ + d)."""
    from sfg.round.staleness import waited

    mm = np.maximum(sched.cmsg[cidx], 0)
    # the one definition of waited staleness, on arrays (its Python form: numpy semantics)
    age, lag = waited.py_func(es.hdr[0, mm], es.hdr_lag[mm], sched.cwait[cidx])
    age, lag = np.asarray(age, np.int64).copy(), np.asarray(lag, np.float64).copy()
    age[first] = es.st[0][devs]
    lag[first] = es.lags[devs]
    return age, lag


class EventLoop:
    """The async or event protocol's training (see the module docstring): the schedule and
    its staleness fixed first (:meth:`_schedule`), the dependency levels and what each reads
    and frees planned (:meth:`_plan`), then the models computed level by level
    (:meth:`play_level`: :meth:`_aggregate`, :meth:`_train`)."""

    def __init__(self, run, progress: Callable[[int, int], None] | None = None):
        from sfg.round.rules import check_model_defences

        self.run, self.c, self.progress = run, run.c, progress
        self.t_start = time.perf_counter()
        settings = make_settings(self.c)
        rule = run.rule
        if rule.robust:  # +clip runs here (below); the robust aggregators only in rounds
            check_model_defences(rule, f"the virtual clock's {self.c.get('protocol')} protocol")
        from sfg.sim.model_rules import memory_kernel

        # model-memory (MIFA analogue, docs/concepts/rules.md#baselines) on the clock: each receiver keeps the latest
        # model of every neighbour and aggregates them all — its kernel on an unbounded window
        memory = memory_kernel(rule)
        if memory is not None:  # model memory on the clock: its kernel, every message remembered
            rule = memory
            settings = replace(settings, window=_UNBOUNDED)
        self.rule = rule
        self.scored = rule.reads_models or rule.oracle  # scores computed between levels
        if rule.reads_models:
            from sfg.clock.scored import make_scorer

            make_scorer(rule, n=1, n_slots=1, X0=torch.zeros(1, 1))  # refuse unknown ones early
        self.settings = run.clock_settings(settings)
        self._schedule()
        X0 = run.initial()
        if torch.equal(X0, X0[:1].expand_as(X0)):  # the common initial model: held once
            X0 = X0[:1].clone().expand_as(X0)
        self.X0 = X0
        self.backend = run.backend
        self.clients = run.clients
        self.batches = run.minibatches(keep=64)
        self.head = run.head
        self._plan()

    def _schedule(self) -> None:
        """The world in time, the schedule and the rule's staleness over it (model-free,
        except for the rules that read models or A's rows: those run level by level)."""
        from sfg.clock.replay import EventStaleness, staleness_events
        from sfg.modelfree.peers import check_rule
        from sfg.world.peers import parse_peers

        run, c, rule = self.run, self.c, self.rule
        K, seed = run.K, run.seed
        self.world = world = run.world_in_time(self.settings)
        peers = parse_peers(c.get("peers", "fixed")).check(run.n)  # (docs/concepts/peers.md)
        check_rule(rule, peers)
        self.sched = sched = make_schedule(world, self.settings, local_steps=K, seed=seed,
                                           catchup=rule.catchup,
                                           link_failure=float(c["link_failure"]),
                                           anatomy=str(c["anatomy"]), peers=peers)
        self.es = None
        if self.scored:
            self.es = EventStaleness(rule, world, sched, seed=seed, attack=run.attack_given)
            self.got = self.es.result()
        else:
            self.got = staleness_events(rule, world, sched, seed=seed, attack=run.attack_given)
        self.weights = self.got["weights"]
        self.own_age = self.got["facts"][:, 1]  # the receiver's age before each event
        self.nsteps = sched.nsteps if sched.nsteps is not None \
            else np.full(sched.n_events, K, np.int64)
        self.attackers = self.got["attackers"]
        attack = run.attack_given
        self.poison = attack.model if (attack is not None and self.attackers.any()) else "none"

    def _plan(self) -> None:
        """Levels, evaluation times and models, the level at which each model is last read
        (then freed), the diagnostics and the scorer."""
        sched, world, settings, N = self.sched, self.world, self.settings, self.run.n
        R = sched.n_events
        self.level, self.prev = level, prev = dependency_levels(sched, N)
        self.loc = loc = np.flatnonzero(sched.kind == LOCAL)
        # evaluations: each device's last completed local round at every eval time
        # at the instants of sfg.clock.instant, after every commit there (docs/concepts/clock.md#one-instant)
        self.te = te = evaluation_instants(world.horizon, eval_every_seconds(
            settings.eval_seconds, int(self.c["eval_every"]), settings.round_seconds))
        self.by_dev = loc[np.lexsort((sched.end[loc], sched.dev[loc]))]
        self.dptr = np.zeros(N + 1, np.int64)
        np.cumsum(np.bincount(sched.dev[loc], minlength=N), out=self.dptr[1:])
        k = self.finished_by(np.tile(np.arange(N), te.size), np.repeat(te, N))
        self.eval_ids = np.where(k >= 0, N + k, np.tile(np.arange(N), te.size)).reshape(te.size, N)
        lvl_of = np.concatenate([np.zeros(N, np.int64), level])  # by model id
        self.eval_level = lvl_of[self.eval_ids].max(axis=1)
        # the last level at which each model is read (then it is freed)
        last_use = np.full(N + R, -1, np.int64)
        src_ids = np.where(prev[loc] >= 0, N + prev[loc], sched.dev[loc])
        np.maximum.at(last_use, src_ids, level[loc])
        nb = np.flatnonzero(sched.cmsg >= 0)
        owner = np.repeat(np.arange(R), np.diff(sched.cptr))
        np.maximum.at(last_use, N + sched.cmsg[nb], level[owner[nb]])
        np.maximum.at(last_use, self.eval_ids.ravel(), np.repeat(self.eval_level, N))
        last_use[N + loc] = np.maximum(last_use[N + loc], level[loc])  # unread: freed when made
        self.n_levels = n_levels = int(level[loc].max()) if loc.size else 0
        self.by_level = np.argsort(level[loc], kind="stable")
        self.bounds = np.searchsorted(level[loc][self.by_level], np.arange(1, n_levels + 2))
        self.by_last = np.argsort(last_use, kind="stable")
        self.free_bounds = np.searchsorted(last_use[self.by_last], np.arange(0, n_levels + 2),
                                           side="right")
        self.eval_order = np.argsort(self.eval_level, kind="stable")
        # the most trained models alive at once: made at their level, freed after their last read
        made = np.bincount(level[loc], minlength=n_levels + 1)
        freed = np.bincount(last_use[N + loc], minlength=n_levels + 1)
        cap = int((np.cumsum(made - freed) + freed).max()) if loc.size else 0
        self.pool = _Pool(self.X0, N + R).reserve(cap)
        # ditto (docs/concepts/training.md#the-training-protocol backbones): a personal model per device beside the shared one,
        # trained from its own previous personal model towards the local round's aggregate
        self.personal = _Pool(self.X0, N + R).reserve(cap) if self.run.backbone == "ditto" else None
        self.diag = self._diagnostics()
        self.scorer = None
        if self.scored:
            from sfg.clock.scored import make_scorer

            self.plan = level_plan(sched, N)
            rg = world.rg if sched.rg is None else sched.rg  # (peers: the run's union graph)
            self.scorer = make_scorer(self.rule, n=N, n_slots=rg.n_slots, X0=self.X0,
                                      sched=sched, prev=self.plan["prev"])
            self.given = np.zeros(int(sched.cptr[-1]))
        self.acc_at: dict[int, np.ndarray] = {}
        self.final: list[torch.Tensor] = []
        self.steps_taken = 0
        self.next_eval = 0

    def _diagnostics(self):
        """The training diagnostics (docs/concepts/diagnostics.md#training-diagnostics) on the clock (:mod:`sfg.clock.diagnostics`): read the
        models, never change them. None when none are asked for."""
        tools = self.run.diagnostic_tools()
        if tools is None:
            return None
        from sfg.clock.diagnostics import EventDiagnostics

        got = self.got
        return EventDiagnostics(tools.pop("kinds"), sched=self.sched, level=self.level,
                                facts=got["facts"], hdr=got["hdr"], hdr_lag=got["hdr_lag"],
                                weights=self.weights, finished_by=self.finished_by,
                                seed=self.run.seed, **tools)

    def finished_by(self, devs: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Each device's last local round whose K steps are done by time q (−1: none): at
        or before q (an evaluation at q sees the commits at q, :data:`sfg.clock.instant.EVAL_SIDE`)."""
        by_dev = self.by_dev
        k = _last_by(self.dptr, self.sched.end[by_dev], devs, q)
        return np.where(k >= 0, by_dev[np.maximum(k, 0)], -1) if by_dev.size else k

    def _aggregate(self, L: int, ev: np.ndarray):
        """Σ_c w_c · model(c) of the local rounds ``ev`` of level L, the receiver's own
        (previous) model first; returns the aggregates and what the diagnostics read."""
        from sfg.sim.gossip import weighted_sum

        sched, prev, N, device = self.sched, self.prev, self.run.n, self.run.device
        cidx, row, first = level_candidates(sched, ev)
        ids = np.where(sched.cmsg[cidx] >= 0, N + sched.cmsg[cidx], -1)
        ids[first] = np.where(prev[ev] >= 0, N + prev[ev], sched.dev[ev])
        M = self.pool.get(ids)
        sent = M  # the candidates' models as trained (what the diagnostics read)
        if self.poison != "none":  # what an attacker sends (sfg.sim.attack_train)
            M = _poisoned(M, cidx, sched, self.attackers, self.run.attack_given, self.X0,
                          self.run.seed)
        es, scorer = self.es, self.scorer
        if scorer is not None:  # the level's staleness, with scores from the models
            es.run(order=self.plan["offline"](L), given=self.given)
            age, lag = _as_seen(es, sched, cidx, first, sched.dev[ev])
            self.given[cidx] = scorer.scores(M, row, first, sched.dev[ev], sched.cslot[cidx],
                                             age, lag, ev=ev, cidx=cidx)
            es.run(order=ev, given=self.given)
        wt = torch.from_numpy(self.weights[cidx]).to(M.dtype).to(device)
        if self.poison != "none":  # attackers that poison keep their own model
            att_rows = np.flatnonzero(self.attackers[sched.dev[ev]])
            if att_rows.size:
                keep = np.zeros(cidx.size)
                keep[first[att_rows]] = 1.0
                mine = np.isin(row, att_rows)
                wt[torch.from_numpy(mine)] = torch.from_numpy(keep[mine]).to(wt.dtype)
        if self.rule.clip:
            agg = _clipped(M, wt, row, first, ev.size)
        else:
            agg = weighted_sum(M, np.arange(cidx.size), wt, first,
                               np.append(first[1:], cidx.size))
        if self.run.backbone == "personal-head":  # the head is never mixed: the own model's
            agg[:, self.head] = M[torch.from_numpy(first).to(device)][:, self.head]
        if scorer is not None:
            scorer.adopted(sched.dev[ev], agg, ev=ev, cidx=cidx, row=row,
                           weights=es.w)
        return agg, (cidx, row, first, sent)

    def _train(self, ev: np.ndarray, agg: torch.Tensor):
        """Local training of the local rounds ``ev`` from their aggregates: ``sfg run``'s
        minibatches of (client, round = step), ``+catchup``'s extra steps from their own
        stream; ditto's personal models beside."""
        run, sched, prev, N = self.run, self.sched, self.prev, self.run.n
        personal = self.personal
        devs, steps, ns = sched.dev[ev], sched.step[ev], self.nsteps[ev]
        out = torch.empty_like(agg)
        pers = torch.empty_like(agg) if personal is not None else None
        for n_steps in np.unique(ns):
            grp = np.flatnonzero(ns == n_steps)
            gi = torch.from_numpy(grp)
            p_ids = np.where(prev[ev[grp]] >= 0, N + prev[ev[grp]], devs[grp])
            if n_steps == 0:  # an offline local round that cannot train (anatomy)
                out[gi] = agg[gi]
                if pers is not None:
                    pers[gi] = personal.get(p_ids)
                continue
            xs, ys = self.clients.gather(devs[grp], *self.batches.select(devs[grp], steps[grp],
                                                                         int(n_steps)))
            out[gi] = run.train(self.backend, agg[gi], xs, ys)
            if pers is not None:
                pers[gi] = run.train(self.backend, agg[gi], xs, ys,
                                     personal=personal.get(p_ids), center=agg[gi])
        self.rule.amplified(agg, out, self.own_age[ev])
        if not bool(torch.isfinite(out.sum(dim=1)).all()):
            bad = int(np.flatnonzero(~torch.isfinite(out.sum(dim=1)).cpu().numpy())[0])
            raise SfgError(f"training diverged (non-finite parameters) on device "
                           f"{int(devs[bad])} at {sched.time[ev[bad]] / 3600:.2f} h "
                           f"of virtual time; lower --lr (now {run.lr}) or check the data")
        if pers is not None and not bool(torch.isfinite(pers.sum(dim=1)).all()):
            raise SfgError("training diverged (non-finite personal parameters, "
                           f"ditto); lower --lr (now {run.lr}) or --ditto-lambda")
        self.steps_taken += int(ns.sum())
        return out, pers

    def _evaluate(self, k: int) -> None:
        X = self.pool.get(self.eval_ids[k])
        if k == self.te.size - 1:
            self.final.append(X)
        if self.personal is not None:
            X = self.personal.get(self.eval_ids[k])
        self.acc_at[k] = self.run.evaluate(X, backend=self.backend)

    def play_level(self, L: int) -> None:
        """Level L's local rounds (aggregate, train), then the evaluations and frees due."""
        if L >= 1:
            ev = self.loc[self.by_level[self.bounds[L - 1]: self.bounds[L]]]
            agg, seen = self._aggregate(L, ev)
            out, pers = self._train(ev, agg)
            if self.diag is not None:  # docs/concepts/diagnostics.md#training-diagnostics on the clock: reads, never writes
                cidx, row, first, sent = seen
                self.diag.batch(ev, cidx, row, first, sent, agg, out)
            self.pool.put(self.run.n + ev, out)
            if pers is not None:
                self.personal.put(self.run.n + ev, pers)
        eval_order = self.eval_order
        while self.next_eval < self.te.size and self.eval_level[eval_order[self.next_eval]] <= L:
            self._evaluate(int(eval_order[self.next_eval]))
            self.next_eval += 1
        if self.diag is not None:  # the units this level completed
            self.diag.level_done(L)
        gone = self.by_last[self.free_bounds[L - 1] if L >= 1 else 0: self.free_bounds[L]]
        self.pool.drop(gone)
        if self.personal is not None:  # read where the shared model is (or earlier)
            self.personal.drop(gone)
        if self.scorer is not None and hasattr(self.scorer, "drop"):  # the oracles' rows
            self.scorer.drop(gone[gone >= self.run.n] - self.run.n)
        if self.progress is not None:
            self.progress(L, self.n_levels)

    def result(self):
        """The run's :class:`~sfg.result.RunResult`."""
        from sfg.clock.replay import peer_costs, per_device_hour
        from sfg.result import RunResult
        from sfg.sim.context import (
            accuracy_metrics,
            check_finite,
            clock_hours,
            curve_point,
            numerics,
            time_to_target,
        )

        if self.scorer is not None:  # offline spans after each device's last local round
            self.es.run(order=self.plan["offline"](self.n_levels + 1), given=self.given)
        te, sched, world, N = self.te, self.sched, self.world, self.run.n
        accs = [self.acc_at[k] for k in range(te.size)]
        curve_t = clock_hours(list(te))
        points = [curve_point(a) for a in accs]
        curve_mean = [m for m, _ in points]
        curve_p10 = [p for _, p in points]
        acc = accs[-1]
        target = float(self.c.get("target_accuracy", 0.8))
        from sfg.metrics import unavailability

        online = world.online.online_seconds() / world.horizon
        metrics = {
            **accuracy_metrics(acc, curve_mean, online,
                               self.attackers if self.c.get("attack") is not None else None),
            # neighbour models aggregated, as sfg run counts them (those delivered: `delivered`)
            "messages": float(sched.stats.get("candidates", 0.0)),
            "scalars": float(sched.stats.get("candidates", 0.0) * self.rule.scalars_per_message),
            "local_steps_rel": 1.0,
            "unavailability": unavailability(world.online.online_seconds(), world.horizon),
            **time_to_target(curve_t, curve_mean, target),
            **per_device_hour(sched.stats, N, world.horizon),
            **peer_costs(sched.stats, N, world.horizon),
        }
        check_finite(metrics)
        curves = {"hours": curve_t, "acc_mean": curve_mean, "acc_p10": curve_p10}
        meta = {"seconds": time.perf_counter() - self.t_start,
                "backend": getattr(self.backend, "name", ""), "D": self.run.spec.D,
                "client_steps": self.steps_taken, "clock": "virtual",
                "protocol": self.settings.protocol, "schedule_digest": sched.digest(),
                "levels": self.n_levels, "peak_models": self.pool.peak,
                "target_accuracy": target, "message_bytes": self.settings.message_bytes,
                "numerics": numerics()}
        return RunResult(metrics=metrics, curves=curves, accuracy=acc, params=self.final[0],
                         meta=meta,
                         diagnostics=self.diag.result() if self.diag is not None else None)


def simulate_events(c: dict[str, Any], *, progress: Callable[[int, int], None] | None = None):
    """Train on the async or event protocol (see the module docstring); ``c`` a resolved run
    config. Returns the run's :class:`~sfg.result.RunResult` (``metrics``, ``curves``,
    ``meta``, ``accuracy``, ``params``, ``diagnostics``: the training diagnostics (docs/concepts/diagnostics.md#training-diagnostics) on the clock,
    :mod:`sfg.clock.diagnostics`, or None)."""
    from sfg.sim.context import build_run, single_threaded

    protocol = str(c.get("protocol", "lockstep"))
    if c.get("clock", "rounds") != "virtual" or protocol not in ("async", "event"):
        raise SfgError(f"simulate_events runs the virtual clock's async and event protocols, "
                       f"not clock={c.get('clock')!r} protocol={protocol!r}; use sfg.sim.run.simulate")
    loop = EventLoop(build_run(c, engine=f"clock-{protocol}"), progress)
    with single_threaded():
        for L in range(0, loop.n_levels + 1):
            loop.play_level(L)
    return loop.result()
