"""A node's local round, in either protocol: aggregate, train, commit (docs/concepts/round.md#one-round).

:func:`aggregate` takes the candidates in slot order, clamps their claims by the rule's
defences (``+guard``, ``+relative``: the round's compiled clamp,
:func:`sfg.round.defences.clamp_one`, ``+guard`` with the node's evidence), weights them with
:meth:`sfg.round.rules.Rule.weights_one` — the rule code ``sfg run`` and ``sfg replay`` use —
and sums them with the simulator's one aggregation (:func:`sfg.sim.gossip.weighted_sum`, or
the rounds' clipped steps under ``+clip``); it also returns the candidates' scalars as the rule
saw them. :func:`train` takes the K local steps; :func:`commit` makes the result the node's
model and staleness state, updated with the claims as clamped — as in ``sfg run``.

Each function takes the node (a :class:`sfg.net.node.Node`) first.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from sfg.net.wire import Message, encode_params
from sfg.round.defences import GUARD, RELATIVE, clamp_one, weights_after
from sfg.round.kernel import rule_draws
from sfg.sim.gossip import weighted_sum


def degrees(node: Any, r: int, nodes: list[int]) -> list[int] | None:
    """Lockstep: the live-neighbour counts of ``nodes`` at round r (the trace and graph are
    common knowledge), for rules that read them; async: None (the rule's default)."""
    if node.cfg.mode != "lockstep":
        return None
    A, out = node.world.available[r], []
    for j in nodes:
        nb = node.world.neighbours(j)
        out.append(int(sum(1 for k in nb if A[k] and not node.blocked_pair(j, int(k), r))))
    return out


def aggregate(node: Any, r: int, senders: list[int], msgs: list[Message],
              ages: list[int], lags: list[float]) -> tuple[np.ndarray, dict]:
    """Weights with the rule's one-receiver form (:meth:`Rule.weights_one`), the
    aggregate Σ_j w_j x_j, and the candidates' scalars as the rule saw them.

    The rule's claim defences (``+guard``, ``+relative``) first clamp the claims with the
    round's own compiled clamp (:func:`sfg.round.defences.clamp_one`, with this node's evidence,
    :meth:`sfg.net.evidence.GuardEvidence.bounds`); the rule then scores the clamped claims (``+cap`` applies to the
    weights), and the staleness update uses the claims as clamped — as in ``sfg run``."""
    # the candidates in slot order (the node first, then its neighbours by id), as the
    # rounds and the clock hold them: sums over candidates (the weights' normalisation,
    # the staleness update, the aggregate) then add in the same order in every engine
    order = sorted(range(len(senders)), key=lambda k: node.pos[senders[k]])
    senders, msgs = [senders[k] for k in order], [msgs[k] for k in order]
    ages, lags = [ages[k] for k in order], [lags[k] for k in order]
    s = node.state
    rule = node.world.rule
    counts = [s.count] + [m.header.count for m in msgs]
    local = [s.local_count] + [m.header.local_count for m in msgs]
    ages, lags, changed = [s.age, *ages], [s.lag, *lags], 0
    marks = None
    if rule.defence_flags & (GUARD | RELATIVE):
        min_ages = [0, *node.guard.bounds(
            r, senders, msgs, lockstep=node.cfg.mode == "lockstep",
            now=node.clock.monotonic(), period=node.cfg.period)] \
            if rule.defence_flags & GUARD else None
        a, lg, c, changed, marks = clamp_one(rule, r, ages, lags, counts, min_ages,
                                             timed=node.cfg.mode != "lockstep")
        ages, lags, counts = a.tolist(), lg.tolist(), c.tolist()
    q = [1.0] + [s.q_hat[node.pos[j] - 1] for j in senders]
    u, keys = 0.5, None
    if rule.random:  # the round's own draws: stream keyed by (seed, round), global slots
        u_all, key_all = rule_draws(node.world.seed, r, node.world.n, node.world.rg.n_slots)
        seg = key_all[node.world.rg.indptr[node.i]:node.world.rg.indptr[node.i + 1]]
        u, keys = float(u_all[node.i]), seg[[0] + [node.pos[j] for j in senders]]
    w = node.scorer.weights_one(ages=ages, lags=lags, counts=counts, local_counts=local,
                                 q_hat=q, t=r, u=u, keys=keys,
                                 degrees=degrees(node, r, [node.i, *senders]))
    if marks is not None:  # +refute: the refuted dropped, then +cap, as the round does
        w = weights_after(rule, w, marks)
    if node.cfg.record_headers:
        node.weights.append({"round": r, "receiver": node.i, "candidates": [node.i, *senders],
                             "weights": [float(v) for v in w], "clamped": changed,
                             "rounds": [m.header.round for m in msgs],
                             "claimed": [m.header.sha256 for m in msgs],
                             # the digest of what is aggregated, not of what was announced
                             "content": [hashlib.sha256(bytes(encode_params(
                                 m.params, node.layout))).digest() for m in msgs]})
    X = np.stack([node.x] + [m.params for m in msgs])
    if rule.clip and msgs:  # +clip: x + Σ_j w_j · clip(x_j − x, r), the rounds' own steps
        from sfg.sim.attack_train import clipped_steps

        Xt = torch.from_numpy(X)
        row = np.zeros(len(msgs), np.int64)
        out = Xt[:1].clone()
        out.index_add_(0, torch.from_numpy(row), clipped_steps(
            Xt[1:] - Xt[0], row, torch.from_numpy(w[1:].astype(np.float32)), 1))
        agg = out[0].numpy()
    else:
        # the one aggregation (sfg.sim.gossip.weighted_sum), candidates in slot order
        agg = weighted_sum(torch.from_numpy(X), np.arange(len(X)), w.astype(np.float32),
                           np.zeros(1, np.int64), np.full(1, len(X)))[0].numpy()
    k = node.star.deg + 1
    full = {"cand": np.zeros(k, bool), "weights": np.zeros(k), "ages": np.zeros(k, np.int64),
            "lags": np.zeros(k), "counts": np.ones(k, np.int64),
            "local_counts": np.ones(k, np.int64)}
    idx = [0] + [node.pos[j] for j in senders]
    full["cand"][idx] = True
    full["weights"][idx] = w
    full["ages"][idx] = ages
    full["lags"][idx] = lags
    full["counts"][idx] = counts
    full["local_counts"][idx] = local
    if node.diagnostics is not None:  # what this local round aggregated, for commit
        node.last_aggregation = (r, msgs, agg, node.clock.time())
    return agg, full


async def train(node: Any, r: int, agg: np.ndarray) -> tuple[np.ndarray, int]:
    """K local steps from ``agg`` (the trainer's; on the virtual clock, batched with the
    other nodes' requests and taking the device's compute time): (model, steps)."""
    n_steps = node.trainer.steps(node.state.age)
    x = await node.trainer.train_async(agg, r, node.state.age)
    return x, n_steps


def commit(node: Any, x: np.ndarray, n_steps: int, full: dict) -> None:
    """The local round's result becomes the node's model and state (docs/concepts/staleness.md#the-staleness-state)."""
    if node.diagnostics is not None:  # docs/concepts/diagnostics.md#training-diagnostics: the local round, before the state changes
        assert node.last_aggregation is not None
        r, msgs, agg, start = node.last_aggregation
        node.diagnostics.commit(r, own=node.x, age=node.state.age, lag=node.state.lag,
                                full=full, neighbours=node.nbrs, agg=agg, trained=x,
                                models=[m.params for m in msgs], start=start,
                                end=node.clock.time())
    node.x = x
    node.stats.steps += n_steps
    node.stats.trains += 1
    node.stats.messages += int(full["cand"].sum()) - 1
    node.state = node.star.advance(node.state, available=True, **full)
