"""The training simulator: N personalised models trained in parallel under outages (SPEC §1, §6–8).

One loop, one round at a time:

1. availability and capabilities of round t (the outage process, anatomy mode §4.1, link failures);
2. candidate sets, the rule's weights and the next staleness state (:func:`sfg.round.kernel.play_round`,
   the round the replay runs too);
3. gossip: the weights applied as one sparse row-stochastic product to the flat ``[N, D]``
   parameter store (rows of clients that do not adopt are untouched);
4. K local SGD steps for the clients that train (catch-up, update amplification, backbones);
5. the staleness state of step 2 is taken over (SPEC §2); evaluation every ``eval_every`` rounds.

Pairing (SPEC §7): graph, partition, initial model, outage trace, link failures and the
minibatch of every (client, round, step) come from streams keyed by the seed only. Minibatches
are drawn for *all* clients every round (whether or not they train), so changing the rule never
changes them; catch-up's extra steps have their own stream ``catchup``.

Minibatches: ``batch_size`` distinct examples of the client's training split when it has at
least that many; a client with fewer examples samples its batch with replacement (reported in
``meta['with_replacement_clients']``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sfg.errors import SfgError, check
from sfg.round.attacks import Heard, availability, claims, parse_attack, place, true_claims
from sfg.round.certified import evidence_for
from sfg.round.kernel import RoundResult, candidate_mask, caps_at, play_round
from sfg.round.rules import CATCHUP_CAP, Rule, parse_rule
from sfg.round.slots import RoundGraph
from sfg.round.staleness import StalenessState, init_state
from sfg.sim.gossip import gossip_
from sfg.util.rng import stream
from sfg.util.safety import check_cells
from sfg.world.graphs import Graph, make_graph
from sfg.world.outages import make_process
from sfg.world.outages.anatomy import capabilities
from sfg.world.outages.links import live_links_round

BACKBONES = ("full", "personal-head", "dfedavgm", "ditto")


def backbone_momentum(c: dict) -> float:
    """The local SGD momentum of a run: ``momentum``, or 0.9 for the ``dfedavgm`` backbone
    when none is given (the clock's engine trains with the same, sfg.clock.train)."""
    return float(c["momentum"]) or (0.9 if c["backbone"] == "dfedavgm" else 0.0)



@dataclass
class SimResult:
    """What a run produced. ``accuracy``: [N] final personalised test accuracy per client."""

    metrics: dict[str, float]
    curves: dict[str, list[float]]
    accuracy: np.ndarray
    params: torch.Tensor
    personal: torch.Tensor | None
    state: StalenessState
    meta: dict[str, Any] = field(default_factory=dict)
    weights_log: list[np.ndarray] | None = None
    diagnostics: dict[str, Any] | None = None


# ----------------------------------------------------------------------------- minibatches
def numerics() -> dict:
    """How this process computes floats: the instruction set torch uses, its threads and
    whether ``SFG_REPRODUCIBLE`` pins them (:mod:`sfg.reproducible`)."""
    from sfg.reproducible import describe

    return {**describe(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads()}


def minibatch_indices(sizes: np.ndarray, steps: int, batch: int, *, seed: int, stream_name: str,
                      t: int) -> np.ndarray:
    """[N, steps, batch] int64 local example indices for every client at round t.

    Keyed by (seed, stream_name, t) only. Distinct examples within a batch when the client has
    at least ``batch`` examples (the ``batch`` smallest of uniform keys), else with replacement.
    """
    n = sizes.shape[0]
    maxn = int(sizes.max())
    # uniform draws and int64 picks for [N, steps, batch], keys and their sort for the clients
    # with enough examples [N, steps, maxn]: checked before anything is drawn
    check_cells(n * steps, 16 * batch + 24 * maxn, 1, "a round's minibatch draws",
                rows_name="client-steps", cols_name="bytes each",
                fix="lower --batch-size or --local-steps")
    g = stream(seed, stream_name, t)
    u = g.random((n, steps, batch))
    out = np.minimum((u * sizes[:, None, None]).astype(np.int64), sizes[:, None, None] - 1)
    big = sizes >= batch
    if big.any():
        keys = g.random((int(big.sum()), steps, maxn))
        keys = np.where(np.arange(maxn)[None, None, :] >= sizes[big][:, None, None], np.inf, keys)
        if batch < maxn:
            pick = np.argpartition(keys, batch - 1, axis=2)[..., :batch]
        else:
            pick = np.argsort(keys, axis=2)[..., :batch]
        out[big] = pick
    return out


class _ClientData:
    """Every client's training split concatenated once, with offsets, on the device.

    A round's minibatches of n clients are one ``index_select`` of ``n·K·B`` rows."""

    def __init__(self, data, device: torch.device):
        self.sizes = np.array([len(y) for y in data.train_y], dtype=np.int64)
        check(bool((self.sizes > 0).all()), "every client needs at least one training example")
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.x = torch.cat(list(data.train_x)).to(device, torch.float32).contiguous()
        self.y = torch.cat(list(data.train_y)).to(device).contiguous()
        self.hflip = bool(getattr(data, "augment_hflip", False))
        self.device = device

    def gather(self, clients: np.ndarray, local_idx: np.ndarray, flips: np.ndarray | None):
        """xs [n, K, B, *shape], ys [n, K, B] for the given clients' local indices [n, K, B]."""
        lead = local_idx.shape
        gidx = torch.from_numpy((self.offsets[clients][:, None, None] + local_idx).reshape(-1))
        gidx = gidx.to(self.device)
        xs = self.x.index_select(0, gidx).view(*lead, *self.x.shape[1:])
        ys = self.y.index_select(0, gidx).view(lead)
        if self.hflip and flips is not None:
            f = torch.from_numpy(flips).to(self.device)
            xs = torch.where(f.reshape(*f.shape, *([1] * (xs.dim() - 3))), xs.flip(-1), xs)
        return xs, ys


# ----------------------------------------------------------------------------- setup
def resolve_config(cfg: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """The run's settings, validated by the one schema of a run (:class:`RunConfig`, SPEC §6
    defaults): ``cfg`` then ``overrides``; ``kind`` is taken as ``"train"``. Bad or unknown
    settings raise a one-line :class:`SfgError` naming the key."""
    from sfg.experiments.config import make_config

    values = {k: v for k, v in {**(cfg or {}), **overrides}.items() if k != "kind"}
    return make_config(values, kind="train").model_dump()


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SfgError(f"device {name!r} requested but CUDA is not available here; use --device cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise SfgError(f"unknown device {name!r}; use cpu, cuda, cuda:0 or auto") from None


@contextmanager
def _single_threaded():
    """Run the round loop's own tensor ops (gossip, gathers, copies, checks) on one intra-op
    thread, restoring torch's setting afterwards.

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


def _quartile_means(acc: np.ndarray, availability: np.ndarray) -> dict[str, float]:
    """Mean accuracy per availability quartile (q1 = least available clients)."""
    order = np.argsort(availability, kind="stable")
    q = np.empty(acc.shape[0], np.int64)
    q[order] = (np.arange(acc.shape[0]) * 4) // acc.shape[0]
    return {f"acc_q{k + 1}": float(acc[q == k].mean()) if (q == k).any() else float("nan")
            for k in range(4)}


# ----------------------------------------------------------------------------- the loop
def simulate(cfg: dict[str, Any] | None = None, *, progress: Callable[[int, int], None] | None = None,
             record_weights: bool = False, observer: Callable[[dict[str, Any]], None] | None = None,
             validated: bool = False, **overrides: Any) -> SimResult:
    """Run one training simulation (SPEC §1, §6). ``cfg``: the fields of
    :class:`sfg.experiments.config.RunConfig` (missing ones take their defaults).

    ``validated``: ``cfg`` is already :func:`resolve_config`'s output (every field), taken as
    it is without the schema, so the run needs no pydantic (``benchmarks/bench_gpu.py`` on a
    device machine); no overrides then.

    ``record_weights`` keeps every round's slot weights in ``SimResult.weights_log``;
    ``observer`` is called once per round with the round's tensors (``t``, ``X`` at the start
    of the round, ``X_agg``, ``X_next``, ``weights``, ``caps``, ``state``) for inspection.
    """
    import hashlib

    from sfg.sim.attack_train import mix
    from sfg.sim.backends import make_backend
    from sfg.sim.model_rules import make_model_rule
    from sfg.sim.params import ParamSpec, init_params
    from sfg.world.data import load_federated
    from sfg.world.models import make_model

    if validated:
        check(cfg is not None and not overrides,
              "simulate(validated=True) takes one resolved config and no overrides")
        c = dict(cfg)
    else:
        c = resolve_config(cfg, **overrides)
    t0 = time.perf_counter()
    seed = int(c["seed"])
    N, T, K, B = int(c["n_clients"]), int(c["rounds"]), int(c["local_steps"]), int(c["batch_size"])
    rule: Rule = parse_rule(c["rule"])
    device = _device(str(c["device"]))

    # -- everything keyed by the seed only (pairing, SPEC §7)
    data = load_federated(c["dataset"], n_clients=N, seed=seed, data_root=c["data_root"],
                          alpha=float(c["alpha"]), partition=c["partition"])
    graph: Graph = make_graph(c["graph"], N, seed=seed)
    available = make_process(c["process"]).sample(T, N, seed=seed, positions=graph.positions)
    # forged staleness (sfg.round.attacks): attackers from the attack's own stream; frac=0 is no attack
    attack = parse_attack(c.get("attack"))
    attackers = place(attack, N, np.bincount(graph.edges.ravel(), minlength=N), seed=seed)
    attack = attack if attackers.any() else None
    available = availability(available, attack, attackers)
    caps_all = capabilities(available, c["anatomy"])

    # a pretrained body for every client, the head freshly initialised (SPEC §6)
    body = {"backbone": str(c["backbone_from"])} if c.get("backbone_from") else {}

    def factory():
        return make_model(c["model"], input_shape=tuple(data.input_shape),
                          num_classes=data.num_classes, **body)

    model = factory()
    spec = ParamSpec.from_module(model)
    X = init_params(factory, N, seed=seed).to(device)
    # the virtual clock's lockstep (SPEC §12.2): its participants and per-slot deliveries
    clock_meta: dict[str, Any] = {}
    clock_live = None
    if c.get("clock", "rounds") == "virtual":
        from sfg.clock.schedule import lockstep_rounds, make_world
        from sfg.clock.settings import HEADER_BYTES, make_settings

        cs = make_settings(c).with_bytes(4.0 * spec.D + HEADER_BYTES)
        if cs.protocol != "lockstep":
            raise SfgError(f"protocol {cs.protocol!r} trains through sfg.clock.train")
        world = make_world(cs, process=c["process"], graph=c["graph"], n=N, rounds=T, seed=seed)
        lk = lockstep_rounds(world, cs, local_steps=K, rounds=T, seed=seed)
        available = availability(lk.available, attack, attackers)
        caps_all = capabilities(available, c["anatomy"])
        clock_live = lk.live
        from sfg.clock.replay import per_device_hour

        clock_meta = {"clock": "virtual", "protocol": "lockstep", "schedule_digest": lk.digest,
                      "message_bytes": cs.message_bytes,
                      "_stats": per_device_hour(lk.stats, N, world.horizon)}
    backend = make_backend(str(c["backend"]), model, device=str(device),
                           precision=str(c["precision"]))
    clients = _ClientData(data, device)
    test_x: list[torch.Tensor] | torch.Tensor = [x.to(device) for x in data.test_x]
    test_y: list[torch.Tensor] | torch.Tensor = [y.to(device) for y in data.test_y]
    if len({int(y.shape[0]) for y in test_y}) == 1:
        # equal-sized test sets as one [N, m, ...] tensor: evaluate() then skips its
        # per-client bookkeeping on every call (same accuracies)
        test_x, test_y = torch.stack(test_x), torch.stack(test_y)

    backbone = c["backbone"]
    momentum = backbone_momentum(c)
    lr, wd = float(c["lr"]), float(c["weight_decay"])
    head = spec.head_mask.to(device)
    personal = X.clone() if backbone == "ditto" else None
    ditto_lam = float(c["ditto_lambda"])
    amplify = rule.amplify
    model_rule = make_model_rule(rule, N=N, D=spec.D, device=device) if rule.reads_models else None

    rg = RoundGraph.from_graph(graph)
    undirected_id = rg.edge_id
    certified = rule.certified  # the certified protocol (sfg.round.certified)
    evidence = evidence_for(rule, attack, rg, anatomy=str(c["anatomy"]))
    if clock_live is not None or certified:  # deliveries per direction: one link id per slot
        from sfg.clock.schedule import directed

        rg = directed(rg)
    state = init_state(rg, rounds=T, track_missed=rule.oracle)  # A only for oracle rules
    if attack is not None and model_rule is not None and attack.forges:
        raise SfgError(f"rule {rule.name!r} reads model parameters; forged claims apply to "
                       "model-free rules (use claim=honest to poison models only)")
    X0 = X.clone() if (attack is not None and attack.model == "constant") else X
    frozen = attackers if (attack is not None and attack.model == "constant") else None
    heard = Heard(rg) if attack is not None else None  # what attackers observed
    mixes = (attack is not None and attack.model != "none") or rule.clip or bool(rule.robust)
    sizes = clients.sizes
    with_replacement = int((sizes < B).sum())

    messages = scalars = 0
    steps_taken = 0
    steps_dfedavg = 0
    curve_round: list[float] = []
    curve_mean: list[float] = []
    curve_p10: list[float] = []
    weights_log: list[np.ndarray] | None = [] if record_weights else None
    scalars_per_msg = rule.scalars_per_message
    digest = hashlib.blake2b(digest_size=16)  # of every minibatch drawn (pairing checks)

    diag = _diagnostics(c, rg=rg, available=available, seed=seed, model=model, spec=spec,
                        data=data, clients=clients, backend=backend, device=device, K=K, B=B,
                        lr=lr, wd=wd, momentum=momentum)
    watch = observer is not None or diag is not None  # keep the round's tensors intact

    def evaluate() -> np.ndarray:
        evalX = personal if personal is not None else X
        return backend.evaluate(evalX, test_x, test_y).detach().cpu().numpy().astype(np.float64)

    # X is updated in place: gossip overwrites the adopters' rows, training the trainers' rows.
    # The loop's own tensor ops run on one intra-op thread (see _single_threaded).
    with _single_threaded():
        for t in range(T):
            caps = caps_at(caps_all, t)
            live = live_links_round(graph.edges.shape[0], t, p=float(c["link_failure"]), seed=seed) \
                if float(c["link_failure"]) > 0 else None
            if clock_live is not None or certified:
                delivered = clock_live[t].copy() if clock_live is not None \
                    else np.ones(rg.n_slots, bool)
                if live is not None:
                    nbs = undirected_id >= 0
                    delivered[nbs] &= live[undirected_id[nbs]]
                live = delivered
            X_start = X.clone() if watch else X

            # ---- aggregation (reads the models as they were at the start of round t)
            if model_rule is None:
                cand = None if evidence is None else candidate_mask(rg, caps, live)
                forged = None if attack is None else claims(attack, rg, state, attackers,
                                                            seed=seed, heard=heard,
                                                            evidence=evidence, cand_now=cand)
                if evidence is not None:
                    told = forged if forged is not None else true_claims(rg, state)
                    if certified:  # refused claims: excluded, as lost messages
                        live = evidence.screen(told, cand, live)
                rw: RoundResult = play_round(rule, rg, state, caps, seed=seed, live=live,
                                             slot_staleness=forged,
                                             attackers=None if attack is None else attackers,
                                             frozen=frozen)
                if heard is not None and forged is not None:
                    heard.note(rg, rw.candidate, forged)
                if evidence is not None:  # the heard-sets: what was received
                    evidence.note(cand, told)
                if mixes:  # a poisoned model, +clip or a robust aggregator (sfg.sim.attack_train)
                    X_mix = mix(X, X0, rg, rw.weights, rw.candidate, caps.adopt, attackers,
                                attack, clip=rule.clip, seed=seed, t=t, rule=rule, rounds=T)
                    if backbone == "personal-head":
                        X_mix[:, head] = X[:, head]
                    X = X_mix
                else:
                    gossip_(X, rg, rw.weights, caps.adopt,
                            keep=head if backbone == "personal-head" else None)
            else:
                X_agg, rw = model_rule.aggregate(X, rg, state, caps, live=live, seed=seed)
                if backbone == "personal-head":
                    X_agg[:, head] = X[:, head]
                X = X_agg
            X_agg = X.clone() if watch else X
            if weights_log is not None:
                weights_log.append(rw.weights.copy())
            nb = int(np.count_nonzero(rw.candidate & ~rg.is_self))
            messages += nb
            scalars += nb * scalars_per_msg

            # ---- local training (minibatches drawn for all clients: rule-independent)
            base_idx = minibatch_indices(sizes, K, B, seed=seed, stream_name="minibatch", t=t)
            digest.update(base_idx.tobytes())
            flips = stream(seed, "augment", t).random((N, K, B)) < 0.5 if clients.hflip else None
            trains = caps.train
            steps = rule.local_steps(K, trains, state.ages)
            n_train = int(np.count_nonzero(trains))
            steps_taken += int(steps.sum())
            steps_dfedavg += n_train * K
            finite = True
            extra_idx = extra_flips = None
            if rule.catchup and (steps > K).any():
                extra_idx = minibatch_indices(sizes, CATCHUP_CAP * K, B, seed=seed, stream_name="catchup", t=t)
                if clients.hflip:
                    extra_flips = stream(seed, "catchup-augment", t).random((N, CATCHUP_CAP * K, B)) < 0.5
            groups = [K] if not rule.catchup else np.unique(steps[steps > 0])
            for n_steps in groups if n_train else ():
                group = np.flatnonzero(steps == n_steps)
                idx = base_idx[group]
                fl = flips[group] if flips is not None else None
                if n_steps > K:
                    idx = np.concatenate([idx, extra_idx[group, : n_steps - K]], axis=1)
                    if fl is not None:
                        fl = np.concatenate([fl, extra_flips[group, : n_steps - K]], axis=1)
                xs, ys = clients.gather(group, idx, fl)
                gi = torch.from_numpy(group).to(device)
                start = X.index_select(0, gi)
                buf = torch.zeros_like(start) if momentum > 0 else None
                trained = backend.train(start, xs, ys, lr=lr, weight_decay=wd, momentum=momentum,
                                        momentum_buf=buf)
                if amplify is not None and (state.ages[group] >= 1).any():
                    # FedAWE-style: a returning client scales its local update by 1 + min(τ_i, c)
                    ret = torch.from_numpy(np.flatnonzero(state.ages[group] >= 1)).to(device)
                    tau = torch.from_numpy(np.minimum(state.ages[group], amplify)).to(
                        device=device, dtype=X.dtype)[ret]
                    trained[ret] = start[ret] + (1 + tau)[:, None] * (trained[ret] - start[ret])
                X.index_copy_(0, gi, trained)
                finite = finite and bool(torch.isfinite(trained.sum(dim=1)).all())
                if personal is not None:
                    pbuf = torch.zeros_like(start) if momentum > 0 else None
                    pers = backend.train(personal.index_select(0, gi), xs, ys, lr=lr,
                                         weight_decay=wd, momentum=momentum, momentum_buf=pbuf,
                                         prox_center=start, prox_lam=ditto_lam)
                    personal.index_copy_(0, gi, pers)
                    finite = finite and bool(torch.isfinite(pers.sum(dim=1)).all())
            # ---- divergence is reported, never averaged into neighbours
            if not finite:
                bad_rows = ~torch.isfinite(X.sum(dim=1))
                if personal is not None:
                    bad_rows |= ~torch.isfinite(personal.sum(dim=1))
                i = int(torch.nonzero(bad_rows)[0])
                raise SfgError(f"training diverged (non-finite parameters) at round {t} on client {i}; "
                               f"lower --lr (now {lr}) or check the data")
            if watch:
                seen = {"t": t, "X": X_start, "X_agg": X_agg, "X_next": X, "weights": rw.weights,
                        "candidate": rw.candidate, "caps": caps, "state": state, "rg": rg,
                        "personal": personal, "head": head}
                if observer is not None:
                    observer(seen)
                if diag is not None:  # SPEC §10: reads the models, draws from its own streams
                    diag.observe(seen)
            state = rw.state

            if (t + 1) % int(c["eval_every"]) == 0 or t == T - 1:
                acc = evaluate()
                curve_round.append(float(t + 1))
                curve_mean.append(float(acc.mean()))
                curve_p10.append(float(np.percentile(acc, 10)))
            if progress is not None:
                progress(t + 1, T)

        acc = evaluate()
    metrics = {
        "acc_mean": float(acc.mean()),
        "acc_p10": float(np.percentile(acc, 10)),
        "acc_time_avg": float(np.mean(curve_mean)),
        **_quartile_means(acc, available.mean(axis=0)),
        "messages": float(messages),
        "scalars": float(scalars),
        "local_steps_rel": float(steps_taken / steps_dfedavg) if steps_dfedavg else float("nan"),
        "unavailability": float(1 - available.mean()),
    }
    if c.get("attack") is not None:  # honest clients only (sfg.round.attacks; all clients at frac=0)
        metrics["acc_honest_mean"] = float(acc[~attackers].mean())
        metrics["acc_honest_p10"] = float(np.percentile(acc[~attackers], 10))
    if certified and evidence is not None:  # the share of neighbour claims refused
        metrics["refused"] = evidence.refused_share
    # an availability quartile with no client (N < 4) is reported empty (NaN), not an error
    if not all(math.isfinite(v) for k, v in metrics.items()
               if k.startswith("acc") and not k.startswith("acc_q")):
        raise SfgError("evaluation produced non-finite accuracies; check the data and model")
    curves = {"round": curve_round, "acc_mean": curve_mean, "acc_p10": curve_p10}
    meta = {"seconds": time.perf_counter() - t0, "with_replacement_clients": with_replacement,
            "backend": getattr(backend, "name", ""),
            "D": spec.D, "minibatch_digest": digest.hexdigest(),
            "client_steps": steps_taken,  # local SGD steps taken by available clients
            "numerics": numerics()}
    if clock_meta:  # lockstep on the clock: the same time metrics as async and event
        metrics.update(clock_meta.pop("_stats"))
        hours = [r * float(c["round_seconds"]) / 3600.0 for r in curve_round]
        target = float(c.get("target_accuracy", 0.8))
        hit = [h for h, a in zip(hours, curve_mean, strict=True) if a >= target]
        metrics["time_to_accuracy_h"] = hit[0] if hit else float("nan")
        metrics["reached_target"] = 1.0 if hit else 0.0
        curves["hours"] = hours
        meta.update(clock_meta, target_accuracy=target)
    return SimResult(metrics=metrics, curves=curves, accuracy=acc, params=X, personal=personal,
                     state=state, meta=meta, weights_log=weights_log,
                     diagnostics=diag.result() if diag is not None else None)


def simulate_config(cfg: dict[str, Any], *, progress: Callable[[int, int], None] | None = None) -> dict:
    """The grid runner's ``kind: train``: metrics and curves of one run."""
    res = simulate(cfg, progress=progress)
    out = {"metrics": res.metrics, "curves": res.curves}
    if res.diagnostics is not None:
        out["diagnostics"] = res.diagnostics
    return out


def _diagnostics(c: dict[str, Any], *, rg, available, seed, model, spec, data, clients, backend,
                 device, K, B, lr, wd, momentum):
    """The run's :class:`~sfg.sim.diagnostics.Diagnostics` (None when none are asked for)."""
    from sfg.sim.diagnostics import Diagnostics

    tools = diagnostic_tools(c, seed=seed, model=model, spec=spec, data=data, clients=clients,
                             backend=backend, device=device, K=K, B=B, lr=lr, wd=wd,
                             momentum=momentum)
    if tools is None:
        return None
    return Diagnostics(tools.pop("kinds"), rg=rg, available=available, seed=seed, **tools)


def diagnostic_tools(c: dict[str, Any], *, seed, model, spec, data, clients, backend, device,
                     K, B, lr, wd, momentum) -> dict[str, Any] | None:
    """What a run's diagnostics (SPEC §10) read besides its models, for the rounds and the
    virtual clock alike: ``kinds``; ``val``, the clients' validation splits
    (:class:`~sfg.sim.diagnostics.ValidationLoss`, for ``finetune`` and ``returning``);
    ``train_batches(i, t)``, client i's K minibatches of the fine-tuning at t (streams
    ``diagnostics-finetune-<i>`` and ``diagnostics-finetune-augment-<i>`` keyed by t, never
    the training's); ``train(P, xs, ys)``, the run's local training (lr, weight decay,
    momentum from a zero buffer). None when no diagnostic is asked for."""
    from sfg.sim.diagnostics import ValidationLoss, parse_diagnostics

    kinds = parse_diagnostics(c.get("diagnostics") or "")
    if not kinds:
        return None
    val = ValidationLoss(model, spec, data.val_x, data.val_y, device) \
        if {"finetune", "returning"} & set(kinds) else None
    sizes = clients.sizes

    def train_batches(i: int, t: int):
        idx = minibatch_indices(sizes[i:i + 1], K, B, seed=seed,
                                stream_name=f"diagnostics-finetune-{i}", t=t)
        flips = (stream(seed, f"diagnostics-finetune-augment-{i}", t).random((1, K, B)) < 0.5
                 if clients.hflip else None)
        xs, ys = clients.gather(np.array([i]), idx, flips)
        return xs[0], ys[0]

    def train(P, xs, ys):
        buf = torch.zeros_like(P) if momentum > 0 else None
        return backend.train(P, xs, ys, lr=lr, weight_decay=wd, momentum=momentum,
                             momentum_buf=buf)

    return {"kinds": kinds, "val": val, "train_batches": train_batches, "train": train}
