"""Run one configuration: dispatch by kind to the simulator, the replay engine or the selftest.

Every kind returns ``{"metrics": {name: float}, "curves": {name: [float, ...]}}``; curves are
sampled by the producer (train runs every ``eval_every`` rounds). ``progress(done, total)``
is called with rounds done so far.

``kind: selftest`` is a built-in diagnostic workload for checking executors, results stores
and clusters without data or torch: a toy gossip-consensus problem (docs/concepts/round.md#one-round round structure)
with iid outages at the process's ``u``, vectorised numpy, no BLAS (so results are
bit-identical across thread counts and machines with the same numpy), about 2-4 ms per round
at N = 100. Its rule handling is a stand-in: ``dfedavg`` averages uniformly, ``local`` keeps
its own model, every other rule name weights candidates by 0.5^(age - youngest age). It is
not the real rule library and its numbers mean nothing about learning.

For tests of executors (a run killed mid-run, a worker that dies): with the environment
variable ``SFG_SELFTEST_HOLD=DIR`` a selftest run announces itself and holds (:func:`_hold`),
so that a test waits for the event instead of polling for a state it could miss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.experiments.config import RunConfig, broken_module
from sfg.util.components import parse_component
from sfg.util.rng import stream

Progress = Callable[[int, int], None]

SELFTEST_DIM = 64


def run_result(cfg: RunConfig, *, progress: Progress | None = None):
    """Run ``cfg`` on the engine its kind, clock, protocol and nodes name — the one dispatch of a
    run, for the grid's workers and ``sfg.run`` — and return its :class:`sfg.result.RunResult`
    (a replay's and the self-test's carry metrics and curves)."""
    from sfg.result import RunResult

    if cfg.kind == "selftest":
        out = selftest_run(cfg, progress=progress)
    elif cfg.kind == "replay":
        try:
            from sfg.modelfree import replay_config
        except ImportError as e:
            raise broken_module("kind 'replay' needs sfg.modelfree", e) from None
        if cfg.clock == "virtual":
            from sfg.clock.replay import clock_replay_config

            out = clock_replay_config(cfg.model_dump(), progress=progress)
        else:
            out = replay_config(cfg.model_dump(), progress=progress)
    elif cfg.kind == "train" and cfg.nodes != "none":  # the nodes: one swarm assembly
        from sfg.net.assemble import run_nodes_config

        return run_nodes_config(cfg, progress=progress)
    elif cfg.kind == "train":
        try:
            from sfg.sim.run import resolve_config, train
        except ImportError as e:
            from sfg.util.extras import missing_extra

            raise (missing_extra(e, "a 'train' run")
                   or broken_module("kind 'train' needs sfg.sim.run", e)) from None
        # the rounds or the clock (lockstep, async, event): one call, one result type
        return train(resolve_config(cfg.model_dump()), progress=progress)
    else:  # pragma: no cover - RunConfig's Literal rules this out
        raise SfgError(f"unknown run kind {cfg.kind!r}; use train, replay or selftest")
    return RunResult.from_summary(out)


def run_config(cfg: RunConfig, *, progress: Progress | None = None) -> dict:
    """Run ``cfg`` and return ``{"metrics": {str: float}, "curves": {str: list[float]}}``
    (and ``diagnostics`` when recorded): :func:`run_result`'s summary, numbers as floats."""
    return normalise_result(run_result(cfg, progress=progress).summary())


def normalise_result(out: Any) -> dict:
    """Check the result shape and convert every number to a Python float."""
    if not isinstance(out, dict) or not {"metrics", "curves"} <= set(out):
        raise SfgError("a run must return a dict with 'metrics' and 'curves'; "
                       f"got {type(out).__name__}")
    metrics = {str(k): float(v) for k, v in dict(out["metrics"]).items()}
    curves = {str(k): [float(x) for x in np.asarray(v, dtype=np.float64).reshape(-1)]
              for k, v in dict(out["curves"]).items()}
    result = {"metrics": metrics, "curves": curves}
    if isinstance(out.get("diagnostics"), dict):  # training diagnostics (docs/concepts/diagnostics.md#training-diagnostics), JSON-ready
        result["diagnostics"] = out["diagnostics"]
    return result


# ---------------------------------------------------------------------- selftest workload
def _unavailability(process: str) -> float:
    comp = parse_component(process, kind="outage process")
    if comp.name == "none":
        return 0.0
    u = comp.params.get("u", 0.5)
    if not isinstance(u, (int, float)) or not 0 <= u < 1:
        raise SfgError(f"selftest: process {process!r} has u={u!r}; use 0 <= u < 1")
    return float(u)


def _neighbours(cfg: RunConfig) -> np.ndarray:
    """[N, k] int64: k nearest neighbours over uniform positions (keyed by seed)."""
    comp = parse_component(cfg.graph, kind="graph")
    k = int(comp.params.get("k", 6))
    k = max(1, min(k, cfg.n_clients - 1))
    pos = stream(cfg.seed, "selftest", "positions").random((cfg.n_clients, 2))
    d2 = ((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    return np.argsort(d2, axis=1, kind="stable")[:, :k]


HOLD_SECONDS = 300.0  # the longest a held selftest run waits (to be killed) before it goes on


def _hold(cfg: RunConfig) -> None:
    """``SFG_SELFTEST_HOLD=DIR``: the first selftest run to start (or the one whose run id is
    in ``DIR/run_id``) writes its process id as a line into the FIFO ``DIR/event`` — the event
    a test waits on, having opened it for reading — and then sleeps up to
    :data:`HOLD_SECONDS`, running, for the test to kill. Only once per DIR (``DIR/held``):
    the run's retry goes through. Without a reader on the FIFO nothing is held."""
    import os
    import time
    from pathlib import Path

    from sfg.experiments.config import run_id

    where = os.environ.get("SFG_SELFTEST_HOLD")
    if not where:
        return
    d = Path(where)
    want = d / "run_id"
    if want.is_file() and want.read_text().strip() != run_id(cfg):
        return
    try:
        os.close(os.open(d / "held", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        fd = os.open(d / "event", os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # held once already, or nobody waits for the event
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(HOLD_SECONDS)


def selftest_run(cfg: RunConfig, *, progress: Progress | None = None) -> dict:
    """The diagnostic workload described in the module docstring (deterministic in cfg)."""
    _hold(cfg)
    n, rounds, dim = cfg.n_clients, cfg.rounds, SELFTEST_DIM
    u = _unavailability(cfg.process)
    rule = parse_component(cfg.rule, kind="rule").name
    idx = np.concatenate([np.arange(n)[:, None], _neighbours(cfg)], axis=1)  # [N, k+1]
    targets = stream(cfg.seed, "selftest", "targets").normal(size=(n, dim))    # [N, D]
    optimum = targets.mean(axis=0)
    avail = stream(cfg.seed, "selftest", "outage").random((rounds, n)) >= u     # [T, N]
    x = np.zeros((n, dim))
    age = np.zeros(n)
    step = min(cfg.lr, 0.5)
    acc_curve: list[float] = []
    loss_curve: list[float] = []
    messages = 0.0

    def evaluate() -> None:
        loss = ((x - optimum) ** 2).mean(axis=1)
        loss_curve.append(float(loss.mean()))
        acc_curve.append(float(np.exp(-loss).mean()))

    for t in range(rounds):
        a = avail[t]
        live = a[idx] & a[:, None]
        live[:, 0] = True
        if rule == "local":
            live[:, 1:] = False
        ages = age[idx]
        if rule == "dfedavg" or rule == "local":
            h = live.astype(np.float64)
        else:
            youngest = np.where(live, ages, np.inf).min(axis=1, keepdims=True)
            h = np.where(live, 0.5 ** (ages - youngest), 0.0)
        w = h / h.sum(axis=1, keepdims=True)
        mixed = (w[:, :, None] * x[idx]).sum(axis=1)
        noise = stream(cfg.seed, "selftest", "batches", t)
        for _ in range(cfg.local_steps):
            grad = mixed - targets + 0.3 * noise.normal(size=(n, dim))
            mixed = mixed - step * grad
        x = np.where(a[:, None], mixed, x)
        age = np.where(a, 0.0, age + 1.0)
        messages += float(live[:, 1:].sum())
        if (t + 1) % cfg.eval_every == 0:
            evaluate()
        if progress is not None:
            progress(t + 1, rounds)
    if rounds % cfg.eval_every:
        evaluate()
    final = np.exp(-((x - optimum) ** 2).mean(axis=1))
    metrics = {
        "final_acc": float(final.mean()),
        "p10_acc": float(np.percentile(final, 10)),
        "time_avg_acc": float(np.mean(acc_curve)),
        "final_loss": loss_curve[-1],
        "messages": messages,
        "unavailability": float(1.0 - avail.mean()),
    }
    if not all(math.isfinite(v) for v in metrics.values()):
        raise SfgError("selftest produced non-finite metrics; lower lr")
    return {"metrics": metrics, "curves": {"acc": acc_curve, "loss": loss_curve}}
