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

``clock`` and ``protocol`` select the engine (:func:`engine_of`): another value is another
engine, whose runs differ, so they are ``affects`` everywhere; :func:`refuse` checks that a
run's values are its engine's own.

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
    "real-nodes": "sfg swarm / sfg node, over gRPC",
}
ENGINES: tuple[str, ...] = tuple(ENGINE_COMMANDS)

# the settings that select the engine: each engine's own values
SELECTORS: dict[str, dict[str, str]] = {
    "rounds": {"clock": "rounds", "protocol": "lockstep"},
    "clock-lockstep": {"clock": "virtual", "protocol": "lockstep"},
    "clock-async": {"clock": "virtual", "protocol": "async"},
    "clock-event": {"clock": "virtual", "protocol": "event"},
    "node-lockstep": {"clock": "virtual", "protocol": "lockstep"},
    "node-async": {"clock": "virtual", "protocol": "async"},
    "real-nodes": {"clock": "rounds", "protocol": "lockstep"},
}

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
    "on_return": "none",
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


_SELECT = ("clock", "protocol")
# engine -> field -> class
DECLARED: dict[str, dict[str, str]] = {
    # sfg run: the clock's settings are the clock's (the schema refuses them without it)
    "rounds": _declare(affects=(*_TRAINING, *_SIMULATOR, *_SELECT), invariant=(*_SAME, "device"),
                       refused=_CLOCK),
    # the lockstep clock: no timer (period, jitter), no window, evaluation every eval_every
    # rounds, no message faults
    "clock-lockstep": _declare(
        affects=(*_TRAINING, *_SIMULATOR, *_SELECT, "round_seconds", "compute", "uplink",
                 "latency", "loss", "message_bytes", "target_accuracy"),
        invariant=(*_SAME, "device"),
        refused=("period", "jitter", "window", "eval_seconds", "faults", "faults_seed",
                 "on_return")),
    "clock-async": _declare(affects=(*_TRAINING, *_SIMULATOR, *_SELECT, *_CLOCK),
                            invariant=(*_SAME, "device")),
    # the event protocol has no timer: no period, no jitter
    "clock-event": _declare(
        affects=(*_TRAINING, *_SIMULATOR, *_SELECT,
                 *(f for f in _CLOCK if f not in ("period", "jitter"))),
        invariant=(*_SAME, "device"), refused=("period", "jitter")),
    # the node trains one model per node on the cpu with plain SGD; it evaluates every
    # eval_every of its rounds (no eval_seconds, no time to accuracy); lockstep has no timer,
    # and waits for every message of a round (no loss)
    "node-lockstep": _declare(
        affects=(*_TRAINING, *_SELECT, "round_seconds", "period", "compute", "uplink",
                 "latency", "message_bytes", "faults", "faults_seed"),
        invariant=_SAME,
        refused=(*_SIMULATOR, "device", "jitter", "window", "loss", "eval_seconds",
                 "target_accuracy", "on_return")),
    "node-async": _declare(
        affects=(*_TRAINING, *_SELECT, "round_seconds", "period", "jitter", "window", "compute",
                 "uplink", "latency", "loss", "message_bytes", "faults", "faults_seed",
                 "on_return"),
        invariant=_SAME,
        refused=(*_SIMULATOR, "device", "eval_seconds", "target_accuracy")),
    # real nodes take their own time: none of the virtual clock's settings but on_return, a
    # returning node's pull in wall seconds (async; a lockstep node refuses it)
    "real-nodes": _declare(affects=(*_TRAINING, *_SELECT, "on_return"), invariant=_SAME,
                              refused=(*_SIMULATOR, "device",
                                       *(f for f in _CLOCK if f != "on_return"))),
}

# values that mean the default on an engine (the nodes train on the cpu: auto picks it)
SAME_AS_DEFAULT: dict[tuple[str, str], tuple[Any, ...]] = {
    (e, "device"): ("auto",) for e in ("node-lockstep", "node-async", "real-nodes")}


# settings that act through another one (the checks set both)
NOTES: dict[str, str] = {
    "ditto_lambda": "the proximal pull of `backbone: ditto`; it acts with that backbone",
    "message_bytes": "acts through the transfer time, with a finite `uplink`",
    "faults_seed": "the seed of `faults`; it acts with faults",
    "device": "the nodes train on the cpu (`auto` picks it there); another device is refused",
    "loss": "the node's lockstep waits for every message of a round: it refuses `loss`",
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
            kinds = {None: [None, "virtual", "real"], "virtual": ["virtual", "real", None],
                     "real": ["real", "virtual", None]}[_nodes(engine)]
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
                 else "no engine implements it")
        raise SfgError(f"engine {engine} ({ENGINE_COMMANDS[engine]}) does not implement "
                       f"{field}={cfg[field]!r}; drop it (the default is "
                       f"{DEFAULTS[field]!r}) or {where}")


def _nodes(engine: str) -> str | None:
    return "virtual" if engine.startswith("node-") else "real" if engine.startswith("real-") \
        else None


def _selectors(cfg: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {cfg.get(k, DEFAULTS[k])}" for k in ("clock", "protocol"))


def engine_of(cfg: dict[str, Any], *, nodes: str | None = None) -> str:
    """The engine that runs ``cfg`` (its ``clock`` and ``protocol``): the simulators by
    default, the node on the virtual clock with ``nodes="virtual"``, real nodes with
    ``nodes="real"``. An SfgError names a combination no engine runs."""
    clock = cfg.get("clock", DEFAULTS["clock"])
    protocol = cfg.get("protocol", DEFAULTS["protocol"])
    want = {"clock": clock, "protocol": protocol}
    for e in ENGINES:
        if SELECTORS[e] == want and _nodes(e) == nodes:
            return e
    kind = {None: "simulator", "virtual": "node on the virtual clock",
            "real": "real node"}.get(nodes, str(nodes))
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

`clock` and `protocol` select the engine (another value is another engine). The engines:

{engines}

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
    return (_PAGE_HEAD.format(engines=engines) + "\n".join([head, rule, *rows]) + "\n\n"
            + "Notes:\n\n" + "\n".join(notes) + "\n")


def main(argv: list[str]) -> int:
    """``python -m sfg.engines [OUT]``: print the page, or write it to OUT."""
    text = markdown()
    if argv:
        with open(argv[0], "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
