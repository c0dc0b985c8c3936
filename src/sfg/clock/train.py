"""Training on the virtual clock (SPEC §12 with the training protocol of §6).

``lockstep`` is ``sfg run`` itself (:func:`sfg.sim.run.simulate`) on the lockstep schedule's
participants and deliveries, so every rule, backbone and diagnostic runs there (the async
and event protocols take the backbones, the model-reading rules, the oracles, the anatomy
modes and the training diagnostics too: below; the diagnostics, SPEC §10 with one staleness
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

Pairing (SPEC §7, §12.4): data, graph, initial models, world and schedule come from the seed;
device i's local round keyed ``step`` (its wake index under async, its count of completed
local rounds under event) trains on the minibatches ``sfg run`` draws for client i in round
``step`` (stream ``minibatch``), whatever the rule. Evaluation every ``eval_seconds`` of
virtual time uses each device's model as it stands then (its last completed local round).

Metrics: as ``sfg run`` (final and time-averaged accuracy, per-availability-quartile means),
plus ``time_to_accuracy_h``: the first evaluation time (hours) at which the mean accuracy
reaches ``target_accuracy`` — NaN with ``reached_target`` 0 when it never does — and the
schedule's counts per device-hour (:func:`sfg.clock.replay.per_device_hour`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from sfg.clock.schedule import (
    LOCAL,
    Schedule,
    _levels,
    level_candidates,
    level_plan,
    make_schedule,
    make_world,
)
from sfg.clock.settings import HEADER_BYTES, make_settings
from sfg.errors import SfgError
from sfg.util.numba_start import njit


@njit(cache=True, nogil=True)
def _last_by(ptr, vals, group, q):  # pragma: no cover - compiled
    """For each query: the index of the last value ≤ q[k] in group[k]'s sorted run
    vals[ptr[g]:ptr[g+1]], or −1."""
    out = np.empty(group.shape[0], np.int64)
    for k in range(group.shape[0]):
        a, b = ptr[group[k]], ptr[group[k] + 1]
        j = a + np.searchsorted(vals[a:b], q[k], side="right") - 1
        out[k] = j if j >= a else -1
    return out


class _Pool:
    """Models by id in one growing [capacity, D] tensor with a free list: the initial models
    are ids 0..N−1, local round r's model is id N + r."""

    def __init__(self, X0: torch.Tensor, n_ids: int):
        self.n0 = X0.shape[0]
        self.buf = X0.clone()
        self.row = np.full(n_ids, -1, np.int64)
        self.row[: self.n0] = np.arange(self.n0)
        self.free: list[int] = []
        self.peak = self.n0

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
        self.peak = max(self.peak, int((self.row >= 0).sum()))

    def get(self, ids: np.ndarray) -> torch.Tensor:
        rows = self.row[ids]
        assert (rows >= 0).all(), "a model was read after it was freed"
        return self.buf.index_select(0, torch.from_numpy(rows))

    def drop(self, ids: np.ndarray) -> None:
        rows = self.row[ids]
        rows = rows[rows >= 0]
        self.free.extend(rows.tolist())
        self.row[ids] = -1


# "every neighbour's latest message is a candidate": a window longer than any run
_UNBOUNDED = 1e12


def _memory_kernel(rule):
    """``model-memory`` (MIFA analogue, SPEC §3.2) on the async and event protocols: each
    receiver keeps the latest model it received from every neighbour and aggregates all of
    them whenever it aggregates — the async protocol with an unbounded window W, remembered
    messages counted with their waited staleness (age τ + ⌊d⌋, lag ℓ + d, as SPEC §3.2's "age
    or lag at reception plus the rounds since"). So it is its kernel — ``dfedavg`` (every
    model undiscounted), ``sfg`` or ``sfg-l`` for ``model-memory+sfg``/``+sfg-l`` — on that
    window; its candidates, and so its schedule's digest, are its own. None for other rules."""
    from sfg.round.rules import parse_rule

    kernels = {"model-memory": "dfedavg", "model-memory+sfg": "sfg", "model-memory+sfg-l": "sfg-l"}
    if rule.name not in kernels:
        return None
    k = kernels[rule.name]
    if k != "dfedavg":
        k = f"{k}:gamma={rule.params['gamma']}"
    return parse_rule(k)


def _batches(cache: dict, clients, sizes: np.ndarray, devs: np.ndarray, steps: np.ndarray,
             n_steps: int, K: int, B: int, N: int, seed: int):
    """xs, ys of the local rounds (device, step key) with ``n_steps`` steps: ``sfg run``'s
    minibatches of (client, round = step), and for ``+catchup``'s extra steps its own
    ``catchup`` stream (sfg.sim.run), with the augmentation flips when the data has them."""
    from sfg.round.rules import CATCHUP_CAP
    from sfg.sim.run import minibatch_indices
    from sfg.util.rng import stream

    idx = np.empty((devs.size, n_steps, B), np.int64)
    flips = np.empty((devs.size, n_steps, B), bool) if clients.hflip else None
    for s in np.unique(steps):
        key = (int(s), n_steps > K)
        if key not in cache:
            if len(cache) > 64:
                cache.pop(next(iter(cache)))
            base = minibatch_indices(sizes, K, B, seed=seed, stream_name="minibatch", t=int(s))
            fl = stream(seed, "augment", int(s)).random((N, K, B)) < 0.5 if clients.hflip else None
            if n_steps > K:
                extra = minibatch_indices(sizes, CATCHUP_CAP * K, B, seed=seed,
                                          stream_name="catchup", t=int(s))
                base = np.concatenate([base, extra], axis=1)
                if fl is not None:
                    ef = stream(seed, "catchup-augment", int(s)).random((N, CATCHUP_CAP * K, B))
                    fl = np.concatenate([fl, ef < 0.5], axis=1)
            cache[key] = (base, fl)
        base, fl = cache[key]
        sel = steps == s
        idx[sel] = base[devs[sel], :n_steps]
        if flips is not None and fl is not None:
            flips[sel] = fl[devs[sel], :n_steps]
    return clients.gather(devs, idx, flips)


def _poisoned(M: torch.Tensor, cidx: np.ndarray, sched: Schedule, attackers: np.ndarray,
              model: str, attack, X0: torch.Tensor, seed: int) -> torch.Tensor:
    """The candidates' models as sent: an attacker's message poisoned by the attack's
    ``model`` (SPEC-level definitions of :func:`sfg.sim.attack_train.sent_models`):
    ``sign-flip`` −x, ``noise`` x + σ·N(0, 1) (stream ``attack-noise`` keyed by the seed and
    the sending local round), ``constant`` its initial model."""
    from sfg.util.rng import stream

    msg = sched.cmsg[cidx]
    hit = np.flatnonzero((msg >= 0) & attackers[np.where(msg >= 0, sched.dev[msg], 0)])
    if hit.size == 0:
        return M
    M = M.clone()
    for k in hit:  # few: the attackers' messages of one batch
        j, m = int(sched.dev[msg[k]]), int(msg[k])
        if model == "sign-flip":
            M[k] = -M[k]
        elif model == "noise":
            g = torch.Generator().manual_seed(int(stream(seed, "attack-noise", m).integers(2**62)))
            M[k] = M[k] + attack.sigma * torch.randn(M.shape[1], generator=g, dtype=M.dtype)
        elif model == "constant":
            M[k] = X0[j]
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


def simulate_events(c: dict[str, Any], *, progress: Callable[[int, int], None] | None = None
                    ) -> dict[str, Any]:
    """Train on the async or event protocol (see the module docstring); ``c`` a resolved run
    config. Returns ``{"metrics", "curves", "meta", "accuracy", "params", "diagnostics"}``
    (``diagnostics``: SPEC §10's on the clock, :mod:`sfg.clock.diagnostics`, or None)."""
    from sfg.clock.replay import EventStaleness, per_device_hour, staleness_events
    from sfg.round.attacks import parse_attack
    from sfg.round.rules import parse_rule
    from sfg.sim.backends import make_backend
    from sfg.sim.gossip import weighted_sum
    from sfg.sim.params import ParamSpec, init_params
    from sfg.sim.run import (
        _ClientData,
        _device,
        _quartile_means,
        _single_threaded,
        backbone_momentum,
        diagnostic_tools,
        numerics,
    )
    from sfg.world.data import load_federated
    from sfg.world.models import make_model

    t_start = time.perf_counter()
    settings = make_settings(c)
    seed = int(c["seed"])
    N, T, K, B = int(c["n_clients"]), int(c["rounds"]), int(c["local_steps"]), int(c["batch_size"])
    rule = parse_rule(c["rule"])
    if rule.robust:  # +clip runs here (below); the robust aggregators only in rounds
        from sfg.round.rules import check_model_defences

        check_model_defences(rule, f"the virtual clock's {c.get('protocol')} protocol")
    memory = _memory_kernel(rule)
    if memory is not None:  # model memory on the clock: its kernel, every message remembered
        rule = memory
        settings = replace(settings, window=_UNBOUNDED)
    scored = rule.reads_models or rule.oracle  # scores computed between dependency levels
    if rule.reads_models:
        from sfg.clock.scored import make_scorer

        make_scorer(rule, n=1, n_slots=1, X0=torch.zeros(1, 1))  # refuse unknown ones early
    attack = parse_attack(c.get("attack"))
    device = _device(str(c["device"]))
    data = load_federated(c["dataset"], n_clients=N, seed=seed, data_root=c["data_root"],
                          alpha=float(c["alpha"]), partition=c["partition"])

    def factory():
        return make_model(c["model"], input_shape=tuple(data.input_shape),
                          num_classes=data.num_classes)

    model = factory()
    spec = ParamSpec.from_module(model)
    settings = settings.with_bytes(4.0 * spec.D + HEADER_BYTES)
    world = make_world(settings, process=c["process"], graph=c["graph"], n=N, rounds=T,
                       seed=seed)
    sched: Schedule = make_schedule(world, settings, local_steps=K, seed=seed,
                                    catchup=rule.catchup,
                                    link_failure=float(c["link_failure"]),
                                    anatomy=str(c["anatomy"]))
    if scored:  # scores from models (or A's rows): the staleness runs level by level below
        es = EventStaleness(rule, world, sched, seed=seed, attack=attack)
        got = es.result()
    else:
        got = staleness_events(rule, world, sched, seed=seed, attack=attack)
    weights = got["weights"]
    own_age = got["facts"][:, 1]  # the receiver's age before each event (filled as it runs)
    nsteps = sched.nsteps if sched.nsteps is not None else np.full(sched.n_events, K, np.int64)
    attackers = got["attackers"]
    poison = attack.model if (attack is not None and attackers.any()) else "none"

    X0 = init_params(factory, N, seed=seed).to(device)
    backend = make_backend(str(c["backend"]), model, device=str(device),
                           precision=str(c.get("precision", "fp32")))
    clients = _ClientData(data, device)
    test_x: Any = [x.to(device) for x in data.test_x]
    test_y: Any = [y.to(device) for y in data.test_y]
    if len({int(y.shape[0]) for y in test_y}) == 1:
        test_x, test_y = torch.stack(test_x), torch.stack(test_y)
    lr, wd, momentum = float(c["lr"]), float(c["weight_decay"]), backbone_momentum(c)
    backbone = str(c["backbone"])
    head = spec.head_mask.to(device)
    ditto_lam = float(c["ditto_lambda"])

    R = sched.n_events
    level, prev = _levels(sched.kind, sched.dev, sched.cptr, sched.cmsg, N)
    loc = np.flatnonzero(sched.kind == LOCAL)
    # evaluations: each device's last completed local round at every eval time
    every = settings.eval_seconds or float(c["eval_every"]) * settings.round_seconds
    te = np.arange(every, world.horizon + 1e-9 * every, every)
    if te.size == 0 or te[-1] < world.horizon - 1e-9 * every:
        te = np.append(te, world.horizon)
    by_dev = loc[np.lexsort((sched.end[loc], sched.dev[loc]))]
    dptr = np.zeros(N + 1, np.int64)
    np.cumsum(np.bincount(sched.dev[loc], minlength=N), out=dptr[1:])

    def finished_by(devs: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Each device's last local round whose K steps are done by time q (−1: none)."""
        k = _last_by(dptr, sched.end[by_dev], devs, q)
        return np.where(k >= 0, by_dev[np.maximum(k, 0)], -1) if by_dev.size else k

    k = finished_by(np.tile(np.arange(N), te.size), np.repeat(te, N))
    eval_ids = np.where(k >= 0, N + k,
                        np.tile(np.arange(N), te.size)).reshape(te.size, N)
    lvl_of = np.concatenate([np.zeros(N, np.int64), level])  # by model id
    eval_level = lvl_of[eval_ids].max(axis=1)
    # the last level at which each model is read (then it is freed)
    last_use = np.full(N + R, -1, np.int64)
    src_ids = np.where(prev[loc] >= 0, N + prev[loc], sched.dev[loc])
    np.maximum.at(last_use, src_ids, level[loc])
    nb = np.flatnonzero(sched.cmsg >= 0)
    owner = np.repeat(np.arange(R), np.diff(sched.cptr))
    np.maximum.at(last_use, N + sched.cmsg[nb], level[owner[nb]])
    np.maximum.at(last_use, eval_ids.ravel(), np.repeat(eval_level, N))
    last_use[N + loc] = np.maximum(last_use[N + loc], level[loc])  # unread: freed when made
    # SPEC §10's diagnostics on the clock (sfg.clock.diagnostics): read the models, never
    # change them
    tools = diagnostic_tools(c, seed=seed, model=model, spec=spec, data=data, clients=clients,
                             backend=backend, device=device, K=K, B=B, lr=lr, wd=wd,
                             momentum=momentum)
    diag = None
    if tools is not None:
        from sfg.clock.diagnostics import EventDiagnostics

        diag = EventDiagnostics(tools.pop("kinds"), sched=sched, level=level,
                                facts=got["facts"], hdr=got["hdr"], hdr_lag=got["hdr_lag"],
                                weights=weights, finished_by=finished_by, seed=seed, **tools)

    pool = _Pool(X0, N + R)
    # ditto (SPEC §6 backbones): a personal model per device beside the shared one, trained
    # from its own previous personal model towards the local round's aggregate; evaluated
    personal = _Pool(X0, N + R) if backbone == "ditto" else None
    n_levels = int(level[loc].max()) if loc.size else 0
    scorer = None
    if scored:
        from sfg.clock.scored import make_scorer

        plan = level_plan(sched, N)
        scorer = make_scorer(rule, n=N, n_slots=world.rg.n_slots, X0=X0, sched=sched,
                             prev=plan["prev"])
        given = np.zeros(int(sched.cptr[-1]))
    by_level = np.argsort(level[loc], kind="stable")
    bounds = np.searchsorted(level[loc][by_level], np.arange(1, n_levels + 2))
    by_last = np.argsort(last_use, kind="stable")
    free_bounds = np.searchsorted(last_use[by_last], np.arange(0, n_levels + 2), side="right")
    sizes = clients.sizes
    batches: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray | None]] = {}
    curve_t: list[float] = []
    curve_mean: list[float] = []
    curve_p10: list[float] = []
    acc_at: dict[int, np.ndarray] = {}
    steps_taken = 0
    next_eval = 0
    eval_order = np.argsort(eval_level, kind="stable")

    final: list[torch.Tensor] = []

    def evaluate(k: int) -> None:
        X = pool.get(eval_ids[k])
        if k == te.size - 1:
            final.append(X)
        if personal is not None:
            X = personal.get(eval_ids[k])
        acc_at[k] = backend.evaluate(X, test_x, test_y).detach().cpu().numpy().astype(np.float64)

    with _single_threaded():
        for L in range(0, n_levels + 1):
            if L >= 1:
                ev = loc[by_level[bounds[L - 1]: bounds[L]]]
                # aggregate: Σ_c w_c · model(c), the receiver's own (previous) model first
                cidx, row, first = level_candidates(sched, ev)
                ids = np.where(sched.cmsg[cidx] >= 0, N + sched.cmsg[cidx], -1)
                ids[first] = np.where(prev[ev] >= 0, N + prev[ev], sched.dev[ev])
                M = pool.get(ids)
                sent = M  # the candidates' models as trained (what the diagnostics read)
                if poison != "none":  # what an attacker sends (sfg.sim.attack_train)
                    M = _poisoned(M, cidx, sched, attackers, poison, attack, X0, seed)
                if scorer is not None:  # the level's staleness, with scores from the models
                    es.run(order=plan["offline"](L), given=given)
                    age, lag = _as_seen(es, sched, cidx, first, sched.dev[ev])
                    given[cidx] = scorer.scores(M, row, first, sched.dev[ev],
                                                sched.cslot[cidx], age, lag, ev=ev, cidx=cidx)
                    es.run(order=ev, given=given)
                wt = torch.from_numpy(weights[cidx]).to(M.dtype).to(device)
                if poison != "none":  # attackers that poison keep their own model
                    att_rows = np.flatnonzero(attackers[sched.dev[ev]])
                    if att_rows.size:
                        keep = np.zeros(cidx.size)
                        keep[first[att_rows]] = 1.0
                        mine = np.isin(row, att_rows)
                        wt[torch.from_numpy(mine)] = torch.from_numpy(keep[mine]).to(wt.dtype)
                if rule.clip:
                    agg = _clipped(M, wt, row, first, ev.size)
                else:
                    agg = weighted_sum(M, np.arange(cidx.size), wt, first,
                                       np.append(first[1:], cidx.size))
                if backbone == "personal-head":  # the head is never mixed: the own model's
                    agg[:, head] = M[torch.from_numpy(first).to(device)][:, head]
                if scorer is not None:
                    scorer.adopted(sched.dev[ev], agg, ev=ev, cidx=cidx, row=row,
                                   weights=es.w)
                # train on sfg run's minibatches of (client, round = step); +catchup's extra
                # steps from their own stream, as in sfg run
                devs, steps, ns = sched.dev[ev], sched.step[ev], nsteps[ev]
                out = torch.empty_like(agg)
                pers = torch.empty_like(agg) if personal is not None else None
                for n_steps in np.unique(ns):
                    grp = np.flatnonzero(ns == n_steps)
                    if n_steps == 0:  # an offline local round that cannot train (anatomy)
                        gz = torch.from_numpy(grp)
                        out[gz] = agg[gz]
                        if personal is not None:
                            p_ids = np.where(prev[ev[grp]] >= 0, N + prev[ev[grp]], devs[grp])
                            pers[gz] = personal.get(p_ids)
                        continue
                    xs, ys = _batches(batches, clients, sizes, devs[grp], steps[grp],
                                      int(n_steps), K, B, N, seed)
                    buf = torch.zeros((grp.size, agg.shape[1]), dtype=agg.dtype) \
                        if momentum > 0 else None
                    gi = torch.from_numpy(grp)
                    out[gi] = backend.train(agg[gi], xs, ys, lr=lr, weight_decay=wd,
                                            momentum=momentum, momentum_buf=buf)
                    if personal is not None:
                        pbuf = torch.zeros_like(buf) if buf is not None else None
                        p_ids = np.where(prev[ev[grp]] >= 0, N + prev[ev[grp]], devs[grp])
                        pers[gi] = backend.train(personal.get(p_ids), xs, ys, lr=lr,
                                                 weight_decay=wd, momentum=momentum,
                                                 momentum_buf=pbuf, prox_center=agg[gi],
                                                 prox_lam=ditto_lam)
                if rule.amplify is not None:  # FedAWE-style: returning devices scale the update
                    tau = own_age[ev]
                    ret = np.flatnonzero(tau >= 1)
                    if ret.size:
                        gr = torch.from_numpy(ret)
                        f = torch.from_numpy(1.0 + np.minimum(tau[ret], rule.amplify)).to(out.dtype)
                        out[gr] = agg[gr] + f[:, None] * (out[gr] - agg[gr])
                if not bool(torch.isfinite(out.sum(dim=1)).all()):
                    bad = int(np.flatnonzero(~torch.isfinite(out.sum(dim=1)).cpu().numpy())[0])
                    raise SfgError(f"training diverged (non-finite parameters) on device "
                                   f"{int(devs[bad])} at {sched.time[ev[bad]] / 3600:.2f} h "
                                   f"of virtual time; lower --lr (now {lr}) or check the data")
                if diag is not None:  # SPEC §10 on the clock: reads, never writes
                    diag.batch(ev, cidx, row, first, sent, agg, out)
                pool.put(N + ev, out)
                if personal is not None:
                    if not bool(torch.isfinite(pers.sum(dim=1)).all()):
                        raise SfgError("training diverged (non-finite personal parameters, "
                                       f"ditto); lower --lr (now {lr}) or --ditto-lambda")
                    personal.put(N + ev, pers)
                steps_taken += int(ns.sum())
            while next_eval < te.size and eval_level[eval_order[next_eval]] <= L:
                evaluate(int(eval_order[next_eval]))
                next_eval += 1
            if diag is not None:  # the units this level completed
                diag.level_done(L)
            gone = by_last[free_bounds[L - 1] if L >= 1 else 0: free_bounds[L]]
            pool.drop(gone)
            if personal is not None:  # read where the shared model is (or earlier): freed alike
                personal.drop(gone)
            if scorer is not None and hasattr(scorer, "drop"):  # the oracles' rows, alike
                scorer.drop(gone[gone >= N] - N)
            if progress is not None:
                progress(L, n_levels)
    if scorer is not None:  # offline spans after each device's last local round
        es.run(order=plan["offline"](n_levels + 1), given=given)
    for k in range(te.size):
        a = acc_at[k]
        curve_t.append(float(te[k] / 3600.0))
        curve_mean.append(float(a.mean()))
        curve_p10.append(float(np.percentile(a, 10)))
    acc = acc_at[te.size - 1]
    target = float(c.get("target_accuracy", 0.8))
    hit = np.flatnonzero(np.array(curve_mean) >= target)
    online = world.online.online_seconds() / world.horizon
    metrics = {
        "acc_mean": float(acc.mean()), "acc_p10": float(np.percentile(acc, 10)),
        "acc_time_avg": float(np.mean(curve_mean)), **_quartile_means(acc, online),
        # neighbour models aggregated, as sfg run counts them (delivered: clock_delivered)
        "messages": float(sched.stats.get("candidates", 0.0)),
        "local_steps_rel": 1.0, "unavailability": float(1.0 - online.mean()),
        "time_to_accuracy_h": float(curve_t[hit[0]]) if hit.size else float("nan"),
        "reached_target": 1.0 if hit.size else 0.0,
        **per_device_hour(sched.stats, N, world.horizon),
    }
    if attack is not None:
        honest = ~got["attackers"]
        metrics["acc_honest_mean"] = float(acc[honest].mean())
        metrics["acc_honest_p10"] = float(np.percentile(acc[honest], 10))
    if not all(math.isfinite(v) for k, v in metrics.items()
               if k.startswith("acc") and not k.startswith("acc_q")):
        raise SfgError("evaluation produced non-finite accuracies; check the data and model")
    curves = {"hours": curve_t, "acc_mean": curve_mean, "acc_p10": curve_p10}
    meta = {"seconds": time.perf_counter() - t_start, "backend": getattr(backend, "name", ""),
            "D": spec.D, "client_steps": steps_taken, "clock": "virtual",
            "protocol": settings.protocol, "schedule_digest": sched.digest(),
            "levels": n_levels, "peak_models": pool.peak, "target_accuracy": target,
            "message_bytes": settings.message_bytes, "numerics": numerics()}
    return {"metrics": metrics, "curves": curves, "meta": meta, "accuracy": acc,
            "params": final[0], "diagnostics": diag.result() if diag is not None else None}
