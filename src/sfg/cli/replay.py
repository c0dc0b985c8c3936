"""``sfg replay``, ``sfg rules``, ``sfg processes``: model-free replay and the registries (docs/concepts/replay.md#model-free-analyses).

Thin: parse, call :func:`sfg.modelfree.replay`, print. The library (numpy, numba, the graph and
outage code) is imported inside the commands, so ``sfg --help`` stays fast; matplotlib only
with ``--plot``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from sfg.cli import clockflags, console
from sfg.cli.options import cuts_and_crashes, faults_with, opt
from sfg.errors import SfgError
from sfg.util.safety import max_runs

#: the self-return's horizon h when --horizon is not given (T when the replay is shorter)
DEFAULT_HORIZON = 50


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"`` or ``"1-5"`` -> list of ints."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                span = range(int(a), int(b) + 1)
            else:
                span = range(int(part), int(part) + 1)
        except ValueError:
            raise SfgError(f"cannot read seeds {text!r}; write e.g. --seeds 1,2,3 or --seeds 1-5") from None
        if len(seeds) + len(span) > max_runs():  # counted before the list is built
            raise SfgError(f"seeds {text!r} name {len(seeds) + len(span):,} seeds, over the "
                           f"limit of {max_runs():,} runs (raise SFG_MAX_RUNS if it is meant)")
        seeds.extend(span)
    if not seeds or any(s < 0 for s in seeds):
        raise SfgError(f"seeds {text!r} must be non-negative integers, e.g. --seeds 1,2,3")
    return seeds


def _replay_columns() -> list[tuple[str, str]]:
    from sfg.modelfree.metrics import columns  # the metrics' own list (no numba import)

    return columns()


def _replay_legend() -> str:
    from sfg.modelfree.metrics import legend

    return legend()


def __getattr__(name: str):
    # REPLAY_COLUMNS / REPLAY_LEGEND are read from the metrics on first use, so that `sfg --help`
    # (which imports this module to register the command) loads no numpy
    if name == "REPLAY_COLUMNS":
        return _replay_columns()
    if name == "REPLAY_LEGEND":
        return _replay_legend()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def summarise_replay(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over seeds per (process, rule[, attack]), in first-seen order (with the damage
    measures of sfg.round.attacks when rows carry an attack)."""
    from sfg.modelfree.metrics import columns

    with_attack = any("attack" in r for r in rows)
    groups: dict[tuple[str, str, str | None], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["process"], r["rule"], r.get("attack")), []).append(r)
    out_rows = []
    for (p, rule, att), rs in groups.items():
        summary: dict[str, Any] = {"process": p, "rule": rule,
                                   **({"attack": att} if with_attack else {}), "seeds": len(rs)}
        for key, _ in columns(attack=with_attack):
            vals = [r[key] for r in rs if not math.isnan(r[key])]
            summary[key] = float(sum(vals) / len(vals)) if vals else float("nan")
        summary.update(_online_returns(rs))
        for key, _ in PEER_COLUMNS:  # peers chosen per exchange: their costs
            if all(key in r for r in rs):
                summary[key] = float(sum(r[key] for r in rs) / len(rs))
        out_rows.append(summary)
    return out_rows


# returns in time (docs/concepts/clock.md#returns-in-time), on the clock's async and event
# protocols: (key, label) — the starts of online intervals, the share of those that
# aggregated whose first aggregation held a neighbour's model, the share with no neighbour
# online at the return
ONLINE_RETURNS = (("online_returns", "back"), ("online_heard", "back heard"),
                  ("online_alone", "alone"))
# peers chosen per exchange (docs/concepts/peers.md): messages, those to offline peers and
# membership bytes, per device-hour
PEER_COLUMNS = (("peer_messages_per_device_hour", "msgs/dh"),
                ("messages_to_offline_per_device_hour", "offline/dh"),
                ("membership_bytes_per_device_hour", "member B/dh"))


def _online_returns(rs: list[dict[str, Any]]) -> dict[str, float]:
    if not all("returns" in r for r in rs):
        return {}
    tot = {k: sum(float(r[f"returns{k}"]) for r in rs)
           for k in ("", "_aggregated", "_heard", "_alone")}
    def share(a: float, b: float) -> float:
        return a / b if b else float("nan")

    return {"online_returns": tot[""] / len(rs),
            "online_heard": share(tot["_heard"], tot["_aggregated"]),
            "online_alone": share(tot["_alone"], tot[""])}


def replay_table(summary: list[dict[str, Any]], title: str):
    """The per-(process, rule[, attack]) summary as a table (literal names)."""
    from sfg.modelfree.metrics import columns

    att = any("attack" in r for r in summary)
    cols = columns(attack=att)
    if summary and all("online_returns" in r for r in summary):
        cols = [*cols, *ONLINE_RETURNS]
    if summary and all(k in r for r in summary for k, _ in PEER_COLUMNS):
        cols = [*cols, *PEER_COLUMNS]
    return console.table(title, ["process", "rule", *(["attack"] if att else []),
                                 *((label, "right") for _, label in cols)],
                         rows=[[r["process"], r["rule"], *([r["attack"]] if att else []),
                                *(r[k] for k, _ in cols)] for r in summary])


def register(app: typer.Typer) -> None:
    """Add ``replay``, ``rules`` and ``processes`` to the ``sfg`` app."""
    app.command("replay")(replay)
    app.command("rules")(list_rules)
    app.command("processes")(list_processes)


#: replay's own defaults (a replay is cheap: N and T larger than a training run's)
REPLAY_DEFAULTS: dict[str, Any] = {"process": ["bursty:u=0.8"],
                                   "rule": ["dfedavg", "sfg", "sfg-l", "sfg-cut"],
                                   "seeds": "1,2,3", "clients": 100, "rounds": 300,
                                   "graph": "knn:k=6", "anatomy": "full", "link_failure": 0.0,
                                   "local_steps": 10, "peers": "fixed"}
# a replay config file's keys (RunConfig's names) -> this command's parameters
_FROM_FILE = {"process": "process", "rule": "rule", "seed": "seeds", "n_clients": "clients",
              "rounds": "rounds", "graph": "graph", "anatomy": "anatomy",
              "link_failure": "link_failure", "local_steps": "local_steps", "horizon": "horizon",
              "attack": "attack", "peers": "peers"}


def _shown(key: str) -> str:
    v = REPLAY_DEFAULTS[key]
    return ", ".join(v) if isinstance(v, list) else str(v)


def replay_file(path) -> dict[str, Any]:
    """The settings of a ``kind: replay`` config file (RunConfig's names, checked by its schema),
    as this command's parameters; the clock's keys as they are."""
    from sfg.cli.run import load_config
    from sfg.clock.settings import DEFAULTS as CLOCK_KEYS
    from sfg.experiments.config import ConfigError, make_config

    values = load_config(path)
    kind = values.get("kind", "replay")
    if kind != "replay":
        raise SfgError(f"config file {path}: kind {kind!r} cannot run with `sfg replay` (it "
                       "trains nothing); use `sfg run --config` for kind: train")
    try:
        # a replay's axes may be lists (process, rule); the schema checks one of each
        make_config({**{k: (v[0] if isinstance(v, list) and v and k in ("process", "rule")
                            else v) for k, v in values.items()}, "kind": "replay"})
    except ConfigError as e:
        raise SfgError(f"config file {path}: {str(e).removeprefix('bad run config: ')}") from None
    out: dict[str, Any] = {}
    for key, v in values.items():
        if key in _FROM_FILE:
            name = _FROM_FILE[key]
            out[name] = ([v] if isinstance(v, str) else list(v)) if name in ("process", "rule") \
                else [v] if name == "attack" and v is not None else str(v) if name == "seeds" \
                else v
        elif key in CLOCK_KEYS:
            out[key] = v
        elif key != "kind":
            raise SfgError(f"config file {path}: {key!r} is a training setting; `sfg replay` "
                           f"takes {', '.join(sorted([*_FROM_FILE, *CLOCK_KEYS]))}")
    return out


def replay(
    config: Path | None = opt("config"),
    process: list[str] = opt("process", [], show_default=_shown("process")),
    rule: list[str] = opt("rule", [], show_default=_shown("rule")),
    seeds: str | None = typer.Option(None, "--seeds", "--seed", show_default=_shown("seeds"), help="Seeds: 1,2,3 or 1-5, or one seed as in `sfg run --seed` (a config file's seed: that one)"),
    clients: int | None = opt("clients", show_default=_shown("clients")),
    rounds: int | None = opt("rounds", show_default=_shown("rounds")),
    graph: str | None = opt("graph", show_default=_shown("graph")),
    peers: str | None = opt("peers", show_default=_shown("peers")),
    anatomy: str | None = opt("anatomy", show_default=_shown("anatomy")),
    link_failure: float | None = opt("link_failure", show_default=_shown("link_failure")),
    horizon: int | None = typer.Option(None, show_default="50, or T when T < 50", help="Horizon h of the self-return H (0 = skip)"),
    engine: str | None = typer.Option(None, hidden=True, help="Deprecated, does nothing (one compiled round runs every rule); removed in 0.4"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (per-seed rows and summary)"),
    plot: str | None = typer.Option(None, "--plot", help="Write a PNG of mean age and lag over rounds, e.g. staleness.png"),
    attack: list[str] = opt("attack", []),
    local_steps: int | None = opt("local_steps", show_default=_shown("local_steps")),
    clock: str | None = clockflags.CLOCK,
    protocol: str | None = clockflags.PROTOCOL,
    round_seconds: float | None = clockflags.ROUND_SECONDS,
    period: float | None = clockflags.PERIOD,
    jitter: float | None = clockflags.JITTER,
    window: float | None = clockflags.WINDOW,
    compute: str | None = clockflags.COMPUTE,
    uplink: str | None = clockflags.UPLINK,
    latency: str | None = clockflags.LATENCY,
    loss: str | None = clockflags.LOSS,
    message_bytes: float | None = clockflags.MESSAGE_BYTES,
    faults: str | None = clockflags.FAULTS,
    faults_seed: int | None = clockflags.FAULTS_SEED,
    on_return: str | None = clockflags.ON_RETURN,
    cut: list[str] = clockflags.CUT,
    crash: list[str] = clockflags.CRASH,
) -> None:
    """Replay outage processes × rules × seeds with no training: staleness, weights and the
    model-free metrics of every client, paired across rules by seed."""
    filed = replay_file(config) if config is not None else {}
    flags = {"process": process or None, "rule": rule or None, "seeds": seeds,
             "clients": clients, "rounds": rounds, "graph": graph, "anatomy": anatomy,
             "link_failure": link_failure, "local_steps": local_steps, "horizon": horizon,
             "attack": attack or None, "peers": peers}
    got = {**REPLAY_DEFAULTS, "horizon": None, "attack": []}
    got.update({k: v for k, v in filed.items() if k in got and v is not None})
    got.update({k: v for k, v in flags.items() if v is not None})
    process, rule, seeds, clients, rounds, graph, anatomy, link_failure, local_steps, \
        horizon, attack = (got[k] for k in ("process", "rule", "seeds", "clients", "rounds",
                                            "graph", "anatomy", "link_failure", "local_steps",
                                            "horizon", "attack"))
    seed_list = parse_seeds(seeds)
    from sfg.world.peers import parse_peers

    sampler = parse_peers(got["peers"]).check(clients)
    faults = faults_with(faults, *cuts_and_crashes(cut, crash))
    on_clock = {k: v for k, v in filed.items() if k not in got}
    on_clock.update(clockflags.clock_values(
        clock=clock, protocol=protocol, round_seconds=round_seconds, period=period,
        jitter=jitter, window=window, compute=compute, uplink=uplink, latency=latency,
        loss=loss, message_bytes=message_bytes, faults=faults, faults_seed=faults_seed,
        on_return=on_return))
    if on_clock.get("clock") == "rounds" and len(on_clock) == 1:
        on_clock = {}
    clock_settings = None
    if on_clock:
        from sfg.clock.settings import make_settings

        if on_clock.get("clock") != "virtual":
            extra = [k for k in on_clock if k != "clock"]
            if extra:
                raise SfgError(f"--{extra[0].replace('_', '-')} is a setting of the virtual "
                               "clock; add --clock virtual or drop it")
        else:
            clock_settings = make_settings(on_clock)
    fitted = horizon is None and 1 <= rounds < DEFAULT_HORIZON
    if horizon is None:  # the default horizon, or what fits in a shorter replay
        horizon = min(DEFAULT_HORIZON, rounds) if rounds >= 1 else DEFAULT_HORIZON
    if horizon < 0:
        raise SfgError(f"--horizon {horizon} must be >= 0 (0 skips the self-return H)")
    from sfg.modelfree import replay as run_replay

    if engine is not None:  # deprecated in 0.3, gone in 0.4: checked, noted, then ignored
        from sfg.modelfree.api import ENGINES

        if engine not in ENGINES:
            raise SfgError(f"unknown replay engine {engine!r}; choose one of "
                           f"{', '.join(ENGINES)}, or better drop --engine (it does nothing)")
        console.note("warning: --engine is deprecated and does nothing (one compiled round "
                     "runs every rule); drop it, it goes in 0.4")

    if plot is not None:  # a folder, a bare name or an unknown format: settled before the work
        from sfg.modelfree.plot import plot_path
        from sfg.util.extras import require

        require("sfg replay --plot", "matplotlib")

        plot = str(plot_path(plot, "staleness.png"))
    # the bar shows from the start: the first use on a machine compiles the round (a few
    # seconds), and each rule's first use its own function
    with console.progress("replay (the first use compiles: a few seconds)",
                          enabled=not as_json) as update:
        if clock_settings is not None:
            from sfg.clock.replay import replay_clock_rows
            from sfg.round.rules import check_model_defences, parse_rule

            for r in rule:  # the clock's model-free replay: no robust aggregator either
                check_model_defences(parse_rule(r), "the model-free replay")

            rows = replay_clock_rows(process, rule, seed_list, settings=clock_settings,
                                     n=clients, rounds=rounds, graph=graph,
                                     local_steps=local_steps, anatomy=anatomy,
                                     link_failure=link_failure, horizon=horizon,
                                     attacks=list(attack) or [None],
                                     with_curves=plot is not None, progress=update,
                                     peers=str(sampler))
        else:
            rows = run_replay(process, rule, seed_list, n=clients, T=rounds, graph=graph,
                              anatomy=anatomy, link_failure=link_failure, horizon=horizon,
                              with_curves=plot is not None, progress=update,
                              attacks=attack or [None], peers=str(sampler))
    if fitted:  # said once the replay has run: bad input stays one error line
        console.note(f"note: T={rounds} is shorter than the default horizon {DEFAULT_HORIZON}; "
                     f"the self-return H is over h={horizon} rounds (set --horizon to choose, "
                     "0 to skip)")
    if plot is not None:
        from sfg.modelfree import plot_staleness

        written = plot_staleness(rows, plot)
        for r in rows:
            r.pop("curves", None)
        console.note(f"wrote {written}")
    summary = summarise_replay(rows)
    if as_json:
        console.print_json({"rows": rows, "summary": summary})
        return
    where = (f", virtual clock {clock_settings.protocol} (T·Δ = "
             f"{rounds * clock_settings.round_seconds / 3600:g} h)" if clock_settings else "")
    whom = f", peers {sampler}" if not sampler.fixed else ""
    console.show(replay_table(summary, f"Replay: N={clients}, T={rounds}, graph {graph}{whom}, "
                                       f"seeds {','.join(map(str, seed_list))}{where}"))
    console.caption(_caption(summary, attack=bool(attack), horizon=horizon))


def _caption(summary: list[dict[str, Any]], *, attack: bool, horizon: int) -> str:
    """The legend under the replay's table (its columns)."""
    from sfg.modelfree.metrics import legend

    text = legend(attack=attack).replace(
        f"self-return over {DEFAULT_HORIZON} rounds", f"self-return over {horizon} rounds")
    if summary and "online_returns" in summary[0]:
        text += (" · back: returns in time per seed (online again after an outage) · back "
                 "heard: share of those, among the ones that aggregated, whose first "
                 "aggregation held a neighbour's model · alone: share with no neighbour online "
                 "at the return (docs/concepts/clock.md#returns-in-time)")
    if summary and PEER_COLUMNS[0][0] in summary[0]:
        text += (" · msgs/dh, offline/dh, member B/dh: messages to the peers drawn, those whose "
                 "target was offline, and membership bytes, per device-hour "
                 "(docs/concepts/peers.md)")
    return text


def list_rules(as_json: bool = typer.Option(False, "--json", help="Print JSON")) -> None:
    """List every aggregation rule with its parameters and defaults."""
    from sfg.plugins import broken
    from sfg.round.rules import RULES, rule_names

    rows = []
    for name in rule_names():
        e = RULES.entry(name)
        rows.append({"rule": name, "tags": sorted(e.tags), "params": e.params, "doc": e.doc})
    for why in broken():  # a plugin that failed to import, listed as broken
        rows.append({"rule": "(broken plugin)", "tags": ["broken"], "params": {}, "doc": why})
    if as_json:
        console.print_json(rows)
        return
    t = console.table("Aggregation rules (modifiers: +ipw, +rounded, +catchup; defences: +guard, "
                      "+refute, +relative, +cap; training only: +clip, +median, +trim, "
                      "+scclip, +balance; universal c)",
                      ["rule", "kind", "parameters", "description"])
    for r in rows:
        t.add_row(r["rule"], ",".join(r["tags"]),
                  ", ".join(f"{k}={v}" for k, v in r["params"].items()), r["doc"])
    console.show(t)


def list_processes(as_json: bool = typer.Option(False, "--json", help="Print JSON")) -> None:
    """List the outage processes (synthetic and real traces)."""
    from sfg.world.outages import PROCESSES, process_names

    rows = [{"process": name, "params": PROCESSES.entry(name).params} for name in process_names()]
    if as_json:
        console.print_json(rows)
        return
    t = console.table("Outage processes", ["process", "parameters"])
    for r in rows:
        t.add_row(r["process"], ", ".join(f"{k}={v}" for k, v in r["params"].items()))
    console.show(t)
