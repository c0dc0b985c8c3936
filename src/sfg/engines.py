"""The engines that run one run configuration, and what each does with every setting.

Every engine runs the same experiment from one :class:`~sfg.experiments.config.RunConfig`;
none may ignore a setting. For every engine, every setting of the run (every field but
``kind``) is declared exactly one of:

* ``affects``: a value other than the default changes the final parameters or a named metric
  or output (not the echoed settings, not the run id);
* ``invariant``: the run is the same, bit for bit, as with the default (``data_root`` for the
  same data, the replay's ``horizon`` in training) — for :data:`FLOAT_TERMS` (``backend``,
  ``device``), which compute the same float terms in another order, up to float rounding;
* ``refused``: a value other than the default is refused with one :class:`~sfg.errors.SfgError`
  line naming the engine and the setting and saying what to do instead (:func:`refuse`).

``clock``, ``protocol`` and ``nodes`` select the engine (:func:`engine_of`): another value is
another engine, whose runs differ, so they are ``affects`` everywhere; :func:`refuse` checks
that a run's values are its engine's own. Real nodes are two engines, ``real-lockstep`` and
``real-async`` (the protocol selects, as for the node on the virtual clock); their timer
(``period``, ``jitter``, ``window``) is in wall seconds.

*affects* is checked on the final parameters, an accuracy (``acc_*``) or, for a setting that
acts on a run's counts or times only, the metrics and outputs :data:`METRIC_ONLY` declares
for it: any other metric moving (a figure per device-hour moves with the horizon) is no
evidence that a setting acts.

``tests/test_engine_fields.py`` runs every engine with every setting at a non-default value
and checks the declaration; ``docs/reference/engines.md`` is :func:`markdown` (write it with
``python -m sfg.engines docs/reference/engines.md``). This module imports nothing heavy (no
torch, numba or pydantic), so the run context and the command line can read it at no cost.
"""

from __future__ import annotations

import sys
from typing import Any

from sfg.errors import SfgError

AFFECTS, INVARIANT, REFUSED = "affects", "invariant", "refused"
CLASSES = (AFFECTS, INVARIANT, REFUSED)

# engine -> how it is run (the command that runs it)
ENGINE_COMMANDS: dict[str, str] = {
    "rounds": "sfg run",
    "clock-lockstep": "sfg run --clock virtual --protocol lockstep",
    "clock-async": "sfg run --clock virtual --protocol async",
    "clock-event": "sfg run --clock virtual --protocol event",
    "node-lockstep": "sfg swarm --clock virtual --protocol lockstep",
    "node-async": "sfg swarm --clock virtual --protocol async",
    "real-lockstep": "sfg swarm --protocol lockstep (or sfg node), over gRPC",
    "real-async": "sfg swarm --protocol async (or sfg node), over gRPC",
}
ENGINES: tuple[str, ...] = tuple(ENGINE_COMMANDS)

# the settings that select the engine: each engine's own values
SELECTORS: dict[str, dict[str, str]] = {
    "rounds": {"clock": "rounds", "protocol": "lockstep", "nodes": "none"},
    "clock-lockstep": {"clock": "virtual", "protocol": "lockstep", "nodes": "none"},
    "clock-async": {"clock": "virtual", "protocol": "async", "nodes": "none"},
    "clock-event": {"clock": "virtual", "protocol": "event", "nodes": "none"},
    "node-lockstep": {"clock": "virtual", "protocol": "lockstep", "nodes": "virtual"},
    "node-async": {"clock": "virtual", "protocol": "async", "nodes": "virtual"},
    "real-lockstep": {"clock": "rounds", "protocol": "lockstep", "nodes": "real"},
    "real-async": {"clock": "rounds", "protocol": "async", "nodes": "real"},
}
# real nodes' period P in wall seconds where a run gives none (async; resolved and stored)
REAL_PERIOD = 0.2

# RunConfig's defaults without ``kind`` (tests/test_engine_fields.py checks they are the
# schema's; ``eval_every`` not given is min(10, rounds) there)
DEFAULTS: dict[str, Any] = {
    "dataset": "digits", "data_root": None, "alpha": 0.3, "model": "mlp", "backbone": "full",
    "process": "bursty:u=0.8", "rule": "dfedavg", "graph": "knn:k=6", "seed": 1,
    "n_clients": 100, "rounds": 300, "local_steps": 10, "batch_size": 32, "lr": 0.05,
    "weight_decay": 5e-4, "momentum": 0.0, "ditto_lambda": 0.2, "anatomy": "full",
    "link_failure": 0.0, "eval_every": 10, "backend": "auto", "device": "cpu",
    "precision": "fp32", "horizon": 50, "partition": "dirichlet", "diagnostics": "",
    "backbone_from": None, "attack": None,
    "clock": "rounds", "protocol": "lockstep", "round_seconds": 600.0, "period": None,
    "jitter": 0.0, "window": 1.0, "compute": "const:value=0", "uplink": "const:value=inf",
    "latency": "const:value=0", "loss": "const:value=0", "message_bytes": None,
    "eval_seconds": None, "target_accuracy": 0.8, "faults": "none", "faults_seed": 0,
    "on_return": "none", "nodes": "none", "peers": "fixed",
}
FIELDS: tuple[str, ...] = tuple(DEFAULTS)
# invariant up to float rounding: the same float terms, summed in another order
FLOAT_TERMS: tuple[str, ...] = ("backend", "device")

# what every engine trains with: the data, the model, the world and the rule
_TRAINING = ("dataset", "alpha", "model", "process", "rule", "graph", "seed", "n_clients",
             "rounds", "local_steps", "batch_size", "lr", "weight_decay", "eval_every",
             "partition", "attack", "precision", "diagnostics", "backbone_from")
# the same arithmetic, the same data
_SAME = ("data_root", "backend", "horizon")
# the simulators' local training (docs/concepts/training.md#the-training-protocol backbones, docs/concepts/outages.md#anatomy-modes anatomy, docs/concepts/outages.md#link-failures link failures)
_SIMULATOR = ("backbone", "momentum", "ditto_lambda", "anatomy", "link_failure")
# the virtual clock's settings (docs/concepts/clock.md#the-virtual-clock), clock and protocol aside
_CLOCK = ("round_seconds", "period", "jitter", "window", "compute", "uplink", "latency", "loss",
          "message_bytes", "eval_seconds", "target_accuracy", "faults", "faults_seed", "on_return")


def _declare(affects: tuple[str, ...] = (), invariant: tuple[str, ...] = (),
             refused: tuple[str, ...] = ()) -> dict[str, str]:
    out = {**{f: AFFECTS for f in affects}, **{f: INVARIANT for f in invariant},
           **{f: REFUSED for f in refused}}
    assert len(out) == len(affects) + len(invariant) + len(refused), "a field declared twice"
    return {f: out[f] for f in FIELDS if f in out}


_SELECT = ("clock", "protocol", "nodes")
# peers chosen per exchange (docs/concepts/peers.md): the rounds and the clock's lockstep
# train with them (the replay's sends, sfg.modelfree.peers), async and event on the replay's
# schedule (sfg.clock.pull), the nodes (sfg.net.membership: real, and async on the virtual
# clock)
_PEERS = ("peers",)
# engine -> field -> class
DECLARED: dict[str, dict[str, str]] = {
    # sfg run: the clock's settings are the clock's (the schema refuses them without it)
    "rounds": _declare(affects=(*_TRAINING, *_SIMULATOR, *_SELECT, *_PEERS),
                       invariant=(*_SAME, "device"), refused=_CLOCK),
    # the lockstep clock: no timer (period, jitter), no window, evaluation every eval_every
    # rounds, no message faults
    "clock-lockstep": _declare(
        affects=(*_TRAINING, *_SIMULATOR, *_SELECT, "round_seconds", "compute", "uplink",
                 "latency", "loss", "message_bytes", "target_accuracy", *_PEERS),
        invariant=(*_SAME, "device"),
        refused=("period", "jitter", "window", "eval_seconds", "faults", "faults_seed",
                 "on_return")),
    "clock-async": _declare(affects=(*_TRAINING, *_SIMULATOR, *_SELECT, *_CLOCK, *_PEERS),
                            invariant=(*_SAME, "device")),
    # the event protocol has no timer: no period, no jitter
    "clock-event": _declare(
        affects=(*_TRAINING, *_SIMULATOR, *_SELECT,
                 *(f for f in _CLOCK if f not in ("period", "jitter")), *_PEERS),
        invariant=(*_SAME, "device"), refused=("period", "jitter")),
    # the node trains one model per node on the cpu with plain SGD; it is evaluated at the
    # clock's engine's instants (docs/concepts/clock.md#one-instant): async every eval_seconds,
    # lockstep every eval_every rounds (no eval_seconds, as the lockstep clock); lockstep has
    # no timer, and waits for every message of a round (no loss)
    "node-lockstep": _declare(
        affects=(*_TRAINING, *_SELECT, "round_seconds", "period", "compute", "uplink",
                 "latency", "message_bytes", "faults", "faults_seed", "target_accuracy",
                 *_PEERS),
        invariant=_SAME,
        refused=(*_SIMULATOR, "device", "jitter", "window", "loss", "eval_seconds",
                 "on_return")),
    "node-async": _declare(
        affects=(*_TRAINING, *_SELECT, "round_seconds", "period", "jitter", "window", "compute",
                 "uplink", "latency", "loss", "message_bytes", "faults", "faults_seed",
                 "on_return", "eval_seconds", "target_accuracy", *_PEERS),
        invariant=_SAME,
        refused=(*_SIMULATOR, "device")),
    # real nodes take their own time: none of the virtual clock's world; the node trains
    # with the loop backend (the one it runs); lockstep waits for the messages (no timer)
    "real-lockstep": _declare(affects=(*_TRAINING, *_SELECT, *_PEERS),
                              invariant=("data_root", "horizon"),
                              refused=(*_SIMULATOR, "device", "backend", *_CLOCK)),
    # async: a timer in wall seconds (period, jitter, window) and a returning node's pull
    "real-async": _declare(
        affects=(*_TRAINING, *_SELECT, "period", "jitter", "window", "on_return", *_PEERS),
        invariant=("data_root", "horizon"),
        refused=(*_SIMULATOR, "device", "backend",
                 *(f for f in _CLOCK if f not in ("period", "jitter", "window", "on_return")))),
}
# the nodes' engines
NODE_ENGINES = tuple(e for e in ENGINES if SELECTORS[e]["nodes"] != "none")
# engines whose numbers depend on wall time (real async nodes): their affects and invariant
# settings are checked to reach the engine, their refusals by running them
WALL_TIME = ("real-async",)

# (engine, setting) -> the metrics and outputs that show a setting that acts on a run's
# counts, times or outputs but not on its models (affects is checked on the final
# parameters, an accuracy, or these)
_TARGET = ("metric reached_target", "metric time_to_accuracy_h")
METRIC_ONLY: dict[tuple[str, str], tuple[str, ...]] = {
    **{(e, "diagnostics"): ("output diagnostics",) for e in ENGINES},
    # the time to accuracy: when the mean accuracy first reaches it
    **{(e, "target_accuracy"): _TARGET for e in ENGINES if DECLARED[e]["target_accuracy"]
       == AFFECTS},
    # the node's lockstep waits for every message: the network's times and losses (pushes
    # lost are pulled) move its clock and counts, not its models
    ("node-lockstep", "latency"): ("metric virtual_seconds",),
    **{("node-lockstep", f): ("metric net_dropped", "metric send_failed",
                              "metric virtual_seconds") for f in ("faults", "faults_seed")},
}
# invariant settings that a training engine does not read, and why (every other invariant
# setting is read by the engine: the checks fail on one that is not)
UNREAD: dict[str, str] = {
    "horizon": "the model-free replay's horizon: a training run has none (a grid gives one "
               "base to both kinds)",
}

# values that mean the default on an engine (the nodes train on the cpu: auto picks it)
SAME_AS_DEFAULT: dict[tuple[str, str], tuple[Any, ...]] = {
    **{(e, "device"): ("auto",) for e in NODE_ENGINES},
    # real nodes train with the loop backend (a run's auto resolves to it)
    **{(e, "backend"): ("loop",) for e in ("real-lockstep", "real-async")}}


# settings that no training engine implements yet, and what runs them
ELSEWHERE: dict[str, str] = {}

# settings that act through another one (the checks set both)
NOTES: dict[str, str] = {
    "ditto_lambda": "the proximal pull of `backbone: ditto`; it acts with that backbone",
    "message_bytes": "acts through the transfer time, with a finite `uplink`",
    "faults_seed": "the seed of `faults`; it acts with faults",
    "device": "the nodes train on the cpu (`auto` picks it there); another device is refused",
    "backend": "the nodes' `auto` is `loop` (resolved and stored); real nodes train with "
               "`loop` only",
    "period": "the node on the virtual clock: P is also Δ (`period` and `round_seconds` are "
              "both P, resolved and stored); real async nodes: wall seconds, default 0.2 "
              "(resolved and stored)",
    "nodes": "which nodes run the run: `none` (the simulators), `virtual` (the node's code on "
             "the virtual clock) or `real` (real nodes over gRPC); with `clock` and "
             "`protocol` it names the engine",
    "loss": "the node's lockstep waits for every message of a round: it refuses `loss`",
    "peers": "whom each send goes to (`fixed`: the graph; `epidemic:s=S`, `online:s=S,...`: "
             "drawn per exchange): the model-free replay (`sfg replay`), the rounds, the "
             "virtual clock's protocols and the nodes, real and on the virtual clock, run it "
             "(a lockstep node `epidemic` only); a rule that keeps state per neighbour is "
             "refused with it",
    "on_return": "a returning device's pull of its neighbours' models: async and event only "
                 "(the nodes: async, S below the period, in virtual seconds on the virtual "
                 "clock and wall seconds on real nodes; a lockstep node refuses it)",
}


def declaration(engine: str) -> dict[str, str]:
    """field -> class (``affects``, ``invariant``, ``refused``) of ``engine``."""
    _check_engine(engine)
    return dict(DECLARED[engine])


def _check_engine(engine: str) -> None:
    if engine not in DECLARED:
        raise SfgError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")


def _norm(field: str, value: Any) -> Any:
    if isinstance(value, str) and field in ("device", "backend"):
        return value.strip().lower()
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and isinstance(DEFAULTS.get(field), float):
        return float(value)
    return value


def is_default(engine: str, field: str, value: Any) -> bool:
    """Whether ``value`` of ``field`` means the default on ``engine``."""
    v = _norm(field, value)
    return v == DEFAULTS[field] or v in SAME_AS_DEFAULT.get((engine, field), ())


def refuse(engine: str, cfg: dict[str, Any]) -> None:
    """Raise one :class:`SfgError` line for the first setting of ``cfg`` that ``engine``
    refuses (its declaration) at a value other than the default, naming the engine, the
    setting and what to do instead; also when ``cfg``'s clock or protocol are not the
    engine's own. ``cfg``: a run's settings as the schema resolves them
    (:func:`sfg.sim.run.resolve_config`; a missing key is the default)."""
    _check_engine(engine)
    for key, own in SELECTORS[engine].items():
        got = cfg.get(key, DEFAULTS[key])
        if got != own:
            kinds = {"none": ["none", "virtual", "real"], "virtual": ["virtual", "real", "none"],
                     "real": ["real", "virtual", "none"]}[_nodes(engine)]
            runs = [e for e in ENGINES if SELECTORS[e] == {k: cfg.get(k, DEFAULTS[k])
                                                          for k in SELECTORS[e]}]
            runs.sort(key=lambda e: kinds.index(_nodes(e)))
            other = (f"they are engine {runs[0]} ({ENGINE_COMMANDS[runs[0]]}): run that"
                     if runs else "no engine runs them")
            raise SfgError(f"engine {engine} ({ENGINE_COMMANDS[engine]}) runs {key} {own}, "
                           f"not {got!r}; with {_selectors(cfg)} {other}, or drop {key}")
    for field, cls in DECLARED[engine].items():
        if cls != REFUSED or field not in cfg or is_default(engine, field, cfg[field]):
            continue
        honour = [e for e in ENGINES if DECLARED[e][field] != REFUSED]
        where = (f"run it on an engine that implements it: {', '.join(honour)}" if honour
                 else ELSEWHERE.get(field, "no engine implements it"))
        raise SfgError(f"engine {engine} ({ENGINE_COMMANDS[engine]}) does not implement "
                       f"{field}={cfg[field]!r}; drop it (the default is "
                       f"{DEFAULTS[field]!r}) or {where}")


def _nodes(engine: str) -> str:
    return SELECTORS[engine]["nodes"]


def _selectors(cfg: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {cfg.get(k, DEFAULTS[k])}" for k in ("clock", "protocol"))


def engine_of(cfg: dict[str, Any], *, nodes: str | None = None) -> str:
    """The engine that runs ``cfg``: its ``clock``, ``protocol`` and ``nodes`` (``none``, the
    simulators, by default; ``virtual``, the node on the virtual clock; ``real``, real nodes);
    ``nodes`` given here overrides the settings'. An SfgError names a combination no engine
    runs."""
    clock = cfg.get("clock", DEFAULTS["clock"])
    protocol = cfg.get("protocol", DEFAULTS["protocol"])
    nodes = cfg.get("nodes", DEFAULTS["nodes"]) if nodes is None else nodes
    want = {"clock": clock, "protocol": protocol, "nodes": nodes}
    for e in ENGINES:
        if SELECTORS[e] == want:
            return e
    kind = {"none": "simulator", "virtual": "node on the virtual clock",
            "real": "real node"}.get(str(nodes), str(nodes))
    raise SfgError(f"no {kind} engine runs clock {clock}, protocol {protocol}; engines: "
                   + ", ".join(f"{e} ({_selectors(SELECTORS[e])})" for e in ENGINES
                               if _nodes(e) == nodes))


# ----------------------------------------------------------------------------- the page
_PAGE_HEAD = """\
# Engines and settings

Every engine runs the same experiment from one run configuration, and none ignores a
setting. For every engine, each setting is one of:

* **affects**: a value other than the default changes the final models or a named metric or
  output;
* **invariant**: the run is the same, bit for bit, as with the default (`data_root` for the
  same data, the replay's `horizon` in training); `backend` and `device` compute the same
  float terms in another order: the same up to float rounding;
* **refused**: a value other than the default is refused with one error line naming the
  engine and the setting and what to do instead (exit status 2).

`clock`, `protocol` and `nodes` select the engine (another value is another engine): the
simulators run `nodes: none` (the default), the node's own code on the virtual clock
`nodes: virtual`, real nodes over gRPC `nodes: real`. Real nodes are two engines, one per
protocol (as the node on the virtual clock): `real-lockstep` has no timer, `real-async` takes
`period`, `jitter` and `window` in wall seconds (`period` not given: 0.2 s, resolved and
stored in the run's settings). A run's id covers its engine: `nodes` enters it where it is
not `none`. The engines:

{engines}

The event protocol runs on the clock's engine only: no node runs it (a node swarm with
`protocol: event` is refused with one line), so its schedules, `on_return: pull` included,
are checked against the protocols' reference written the other way and against worlds worked
out by hand (`tests/test_clock_pull.py`, `tests/test_clock_hand.py`), not against a node;
lockstep and async are also checked node against engine, curve by curve.

*affects* is checked on the final models, an accuracy, or, for a setting that acts on a run's
counts or times only, the metrics it is declared to move (below). Real asynchronous nodes run
in wall time, so their runs differ from one another: their settings are checked to reach the
engine, their refusals by running them.

`tests/test_engine_fields.py` runs every engine with every setting at a value other than the
default and checks this table; the table is generated from `sfg.engines` (`python -m
sfg.engines docs/reference/engines.md`).

"""


def markdown() -> str:
    """The reference page ``docs/reference/engines.md``: engine × setting -> class."""
    engines = "\n".join(f"* `{e}`: `{ENGINE_COMMANDS[e]}`" for e in ENGINES)
    head = "| setting | " + " | ".join(f"`{e}`" for e in ENGINES) + " |"
    rule = "|---|" + "---|" * len(ENGINES)
    rows = [f"| `{f}` | " + " | ".join(DECLARED[e][f] for e in ENGINES) + " |" for f in FIELDS]
    notes = [f"* `{f}`: {NOTES[f]}." for f in FIELDS if f in NOTES]
    only = [f"* `{e}`, `{f}`: " + ", ".join(f"`{m.split()[-1]}`" for m in METRIC_ONLY[e, f])
            for e, f in METRIC_ONLY]
    return (_PAGE_HEAD.format(engines=engines) + "\n".join([head, rule, *rows]) + "\n\n"
            + "Notes:\n\n" + "\n".join(notes) + "\n\n"
            + "Settings that act on counts, times or outputs only (the metrics that show "
              "them):\n\n" + "\n".join(only) + "\n")


def main(argv: list[str]) -> int:
    """``python -m sfg.engines [OUT]``: print the page, or write it to OUT."""
    from sfg.util.page import page_main

    return page_main(markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
