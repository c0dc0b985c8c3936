"""``sfg swarm``, ``sfg node`` and ``sfg tls-ca``: the rules on real, separately running nodes."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import typer

from sfg.cli import clockflags, console
from sfg.cli.options import (
    DEADLINE,
    REAL_PANEL,
    REAL_PERIOD,
    cuts_and_crashes,
    deprecated,
    faults_with,
    opt,
    protocol_of,
)
from sfg.errors import SfgError
from sfg.util.extras import require

NET_MODULES = ("torch", "grpc", "msgpack", "safetensors")  # what a node imports



def _split_or_cut(values: list[str]) -> tuple[str | None, list]:
    """``--partition``: the data split (``dirichlet``, ``classes:k=2``); a value with ``@`` is
    the old spelling of a network cut in rounds (``A|B@R1-R2``), kept for one minor version."""
    from sfg.net.cuts import Cut

    split, cuts = [], []
    for v in values:
        if "@" in v:
            cut = Cut.parse_rounds(v)
            deprecated(f"--partition {v} (a network cut)", f"--cut {v.split('@')[0]}@"
                       f"{int(cut.start)}r-{cut.last_round}r", "swarm")
            cuts.append(cut)
        else:
            split.append(v)
    if len(split) > 1:
        raise SfgError(f"--partition is the data split, given once; got {', '.join(split)} "
                       "(a network cut is --cut A|B@5r-9r)")
    return (split[0] if split else None), cuts


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of a --listen HOST:PORT) is this machine only: 127.0.0.0/8, ::1 or
    localhost. Anything else, 0.0.0.0 and host names included, may be reached from outside."""
    import ipaddress

    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _read_peers(path: Path) -> tuple[dict[int, str], list | None]:
    """peers.yaml: ``nodes: {id: "host:port"}`` and optional ``edges: [[i, j], ...]``."""
    import yaml

    if not path.is_file():
        raise SfgError(f"peers file {path} not found; check the path")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SfgError(f"cannot parse peers file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict):
        raise SfgError(f"peers file {path} needs a mapping 'nodes: {{0: host:port, ...}}'")
    nodes: dict[int, str] = {}
    for k, v in data["nodes"].items():
        if not isinstance(k, int) or k < 0 or not isinstance(v, str) or ":" not in v:
            raise SfgError(f"peers file {path}: entry {k!r}: {v!r} must map a node id to "
                           "'host:port'")
        nodes[k] = v
    if sorted(nodes) != list(range(len(nodes))):
        raise SfgError(f"peers file {path} must list nodes 0..N-1 (got {sorted(nodes)[:10]})")
    edges = data.get("edges")
    if edges is not None and (not isinstance(edges, list) or
                              not all(isinstance(e, list) and len(e) == 2 for e in edges)):
        raise SfgError(f"peers file {path}: edges must be a list of [i, j] pairs")
    return nodes, edges


def _progress_printer(n: int, rounds: int, enabled: bool):
    """A one-line live display on stderr: slowest node's round, live nodes, mean accuracy."""
    if not enabled or not console.interactive():
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    prog = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                    MofNCompleteColumn(), console=console.stderr(), transient=True)
    task = prog.add_task("swarm", total=rounds)
    last_round = [-1] * n
    live = [False] * n
    acc: dict[int, float] = {}

    def update(ev: dict) -> None:
        i = int(ev["node"])
        last_round[i] = int(ev["round"])
        live[i] = bool(ev["available"])
        if ev.get("acc") is not None:
            acc[i] = float(ev["acc"])
        a = f"{sum(acc.values()) / len(acc):.3f}" if acc else "–"
        prog.update(task, completed=min(last_round) + 1,
                    description=f"round · live nodes {sum(live)}/{n} · accuracy {a}")

    return prog, update


def _store(path: str, rc: Any, out: dict) -> str:
    """Write the swarm's run into the results store under its own settings (``nodes``
    included): the run id :func:`sfg.swarm` gives the same settings."""
    from sfg.experiments.store import Store, new_worker_id

    with Store(path) as st:
        (rid,) = st.add_runs([rc])
        worker = new_worker_id()
        claimed = st.claim([rid], worker)
        if claimed is None:
            raise SfgError(f"run {rid} is already done in {path}; use another --store or seed")
        metrics = {k: v for k, v in out["metrics"].items() if isinstance(v, float)}
        st.finish(rid, worker, {"metrics": metrics, "curves": out["curves"]},
                  seconds=out["metrics"]["wall_seconds"])
    return rid


def _print_summary(out: dict, title: str) -> None:
    m = out["metrics"]
    t = console.table(title, ["metric", ("value", "right")])
    for name, key in [("mean accuracy", "acc_mean"), ("10th percentile", "acc_p10"),
                      ("time-averaged accuracy", "acc_time_avg"),
                      ("realised unavailability", "unavailability"), ("messages", "messages"),
                      ("messages sent", "messages_sent"), ("bytes sent", "bytes"),
                      ("bytes received (encoded)", "wire_bytes_received"),
                      ("messages rejected", "rejected"),
                      ("deliveries refused (offline)", "deliveries_refused"),
                      ("restarts", "restarts"), ("wall seconds", "wall_seconds")]:
        v = m[key]
        counted = key in ("messages", "messages_sent", "bytes", "wire_bytes_received",
                          "rejected", "deliveries_refused", "restarts")
        t.add_row(name, "–" if math.isnan(v) else f"{v:.0f}" if counted or abs(v) >= 100
                  else f"{v:.1f}" if key == "wall_seconds" else f"{v:.4f}")
    if "pull_requests_made" in m:  # on_return pull (docs/concepts/nodes.md#returns-in-the-node)
        for name, key in [("returns", "returns"), ("returns heard", "returns_heard"),
                          ("returns unanswered", "returns_unanswered"),
                          ("pull requests", "pull_requests_made"),
                          ("pull replies accepted", "pull_replies_delivered"),
                          ("pull empty", "pull_empty_received"),
                          ("pull unreachable", "pull_unreachable_received"),
                          ("pull replies rejected", "pull_rejected")]:
            t.add_row(name, f"{m[key]:.0f}")
        t.add_row("pull wait seconds", f"{m['pull_wait_seconds']:.2f}")
    from sfg.cli.run import PEER_ROWS

    for key, name in PEER_ROWS:  # peers chosen per exchange (sfg.net.membership)
        if key in m:
            t.add_row(name, f"{m[key]:.2f}")
    if "claims_refused" in m:  # +certified (sfg.net.certify)
        t.add_row("claims refused (certified)", f"{m['claims_refused']:.4f}")
        t.add_row("header bytes per message", f"{m['header_bytes']:.0f}")
        t.add_row("signing ms per node-round", f"{m['sign_ms_per_node_round']:.3f}")
        t.add_row("verifying ms per node-round", f"{m['verify_ms_per_node_round']:.3f}")
    console.show(t)


def _node_log(path: str | None, mode: str):
    """``sfg node --record-log``: the node's event log (:class:`sfg.net.eventlog.EventLog`)."""
    if path is None:
        return None
    if mode != "async":
        raise SfgError("--record-log records async runs (a lockstep run's models do not "
                       "depend on its timing); add --protocol async")
    from sfg.net.eventlog import EventLog

    return EventLog(path)


def _replay_swarm(paths: list[Path], clock: str, given: list[str], workdir: str | None,
                  as_json: bool) -> None:
    """``sfg swarm --replay-log FILE --clock virtual`` (:mod:`sfg.net.replaylog`)."""
    from sfg.net.eventlog import read_logs
    from sfg.net.replaylog import replay

    if clock != "virtual":
        raise SfgError("--replay-log re-executes the recorded run on the virtual clock; add "
                       "--clock virtual")
    if given:
        raise SfgError(f"--replay-log takes the run's settings from the log; drop {given[0]}")
    rec = read_logs(paths)
    res = replay(rec, workdir=workdir)
    s = rec.settings
    out = {"config": {**rec.world, "mode": "async", "period": s["period"],
                      "jitter": s["jitter"], "window": s["window"], "clock": "virtual",
                      "replay_log": [str(p) for p in paths]}, **res.summary()}
    if as_json:
        console.print_json(out)
        return
    _print_summary(res, f"sfg swarm --replay-log ({len(rec.events)} nodes, "
                        f"{res['replay']['arrivals']} arrivals, digests all matched)")
    diff = res["max_param_diff"]
    console.echo("final models: " + ("not kept beside the log" if diff is None else
                                     f"max |replay - recorded run| = {diff:.3g}"))


def _pull_timeout(cfg: dict[str, Any]) -> float | None:
    """The run's ``on_return``: S wall seconds of a returning node's pull, or None
    (docs/concepts/nodes.md#returns-in-the-node)."""
    from sfg.clock.settings import parse_on_return

    return parse_on_return(cfg.get("on_return"))


def _virtual_progress(total: int, enabled: bool):
    """A progress bar on stderr over the run's node-rounds."""
    if not enabled or not console.interactive():
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    prog = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                    MofNCompleteColumn(), console=console.stderr(), transient=True)
    task = prog.add_task("node-rounds on the virtual clock", total=total)

    def update(done: int, _total: int) -> None:
        if done % 64 == 0 or done == total:
            prog.update(task, completed=done)

    return prog, update


def _virtual_swarm(config: Path | None, flags: dict[str, Any], world_flags: dict[str, Any], *,
                   mode: str | None, period: float | None, jitter: float | None,
                   window: float | None, deadline: float | None, faults: str | None,
                   faults_seed: int | None, refused: list[str], store: str | None,
                   as_json: bool) -> None:
    """``sfg swarm --clock virtual``: every node's own code in this process on the virtual
    clock, the in-memory network and the batched trainer (:func:`sfg.net.virtual.run_virtual_swarm`),
    in the clock world's settings (``--compute``, ``--uplink``, ``--latency``, ``--loss``,
    ``--message-bytes``). The run's settings — a ``--config`` file's protocol, period (also
    Δ), jitter, window and faults included — are taken as ``sfg run`` takes them; a flag
    overrides its setting; :func:`sfg.net.assemble.run_nodes_config` runs them, as
    :func:`sfg.swarm` does. Prints the swarm's JSON; it holds no wall time, so the same
    settings print the same bytes."""
    from sfg.cli.run import run_config
    from sfg.net.assemble import run_nodes_config

    if refused:
        raise SfgError(f"{refused[0]} is for real nodes; with --clock virtual, faults are events "
                       "of the schedule: --faults (e.g. faults:crash=3@1200 or "
                       "partition=0-3|4-7@1200-3600)")
    if period is not None and not period > 0:
        raise SfgError(f"--period must be > 0 seconds, got {period}")
    # the run's settings: sfg run's one schema, with the clock's keys (validated there); the
    # node's period P is also Δ, the staleness unit (a period alone sets both)
    given = {"protocol": mode, "round_seconds": period, "period": period, "jitter": jitter,
             "window": window, "faults": faults, "faults_seed": faults_seed, **world_flags}
    cfg = run_config(config, {**flags, **given}, fixed={"clock": "virtual", "nodes": "virtual"})
    prog, update = _virtual_progress(cfg.n_clients * cfg.rounds, not as_json)
    if prog is not None:
        with prog:
            res = run_nodes_config(cfg, deadline=deadline, progress=update)
    else:
        res = run_nodes_config(cfg, deadline=deadline)
    P = float(cfg.period or cfg.round_seconds)
    config_out = {**res.meta["config"], "mode": cfg.protocol}
    if cfg.protocol == "lockstep":
        config_out.update(deadline=float(cfg.rounds * P if deadline is None else deadline))
    wall = res["metrics"].pop("wall_seconds")  # not in the JSON: the same run, the same bytes
    out = {"config": config_out, **res.summary()}
    if store is not None:
        out["run_id"] = _store(store, cfg, {**res.summary(),
                                            "metrics": {**res["metrics"], "wall_seconds": wall}})
    if as_json:
        console.print_json(out)
        return
    _print_summary({**res.summary(), "metrics": {**res["metrics"], "wall_seconds": wall}},
                   f"sfg swarm --clock virtual ({cfg.protocol}): {cfg.rule} under "
                   f"{cfg.process}, {cfg.n_clients} nodes, "
                   f"{res['metrics']['virtual_seconds']:.0f} virtual seconds")


def _real_swarm(config: Path | None, flags: dict[str, Any], world_flags: dict[str, Any], *,
                round_seconds: float | None, cuts: list, crashes: list, protocol: str | None,
                period: float | None, jitter: float | None, window: float | None,
                deadline: float | None, procs: int, workdir: str | None, tls_dir: str | None,
                record_log: str | None, store: str | None, as_json: bool,
                peers: str | None = None) -> None:
    """``sfg swarm`` on real nodes (worker processes, gRPC on 127.0.0.1): the flags checked
    for real nodes (rounds, not seconds), the nodes run with a progress bar, the summary."""
    from sfg.cli.run import run_config
    from sfg.net.assemble import run_nodes_config

    given = [k for k, v in {**world_flags, "round_seconds": round_seconds}.items()
             if v is not None]
    if given:
        raise SfgError(f"--{given[0].replace('_', '-')} is a setting of the virtual clock; "
                       "add --clock virtual (real nodes take their own time)")
    for x, flag, example in [*((c, "--cut", "0,1|2,3@5r-9r") for c in cuts),
                             *((c, "--crash", "3@10r") for c in crashes)]:
        if x.unit != "rounds":
            raise SfgError(f"{flag} in seconds is for the virtual clock; real nodes count "
                           f"rounds: write e.g. {flag} {example}, or add --clock virtual")
    if protocol == "event":
        raise SfgError("--protocol event runs on the virtual clock only; real nodes run "
                       "lockstep or async (or add --clock virtual)")
    # the run's settings, the nodes' protocol and timer (wall seconds) among them
    cfg = run_config(config, {**flags, "protocol": protocol, "period": period,
                              "jitter": jitter, "window": window}, fixed={"nodes": "real"})
    if tls_dir is not None and not Path(tls_dir, "ca.pem").is_file():
        raise SfgError(f"no ca.pem in --tls-dir {tls_dir} (the folder `sfg tls-ca` writes, "
                       f"with a bundle per node); create one with "
                       f"`sfg tls-ca --dir {tls_dir} --nodes N`")
    n = cfg.n_clients
    for c in cuts:
        c.check_nodes(n, f"--cut {c.text()}")
    for c in crashes:
        if c.node >= n:
            raise SfgError(f"--crash {c.node}@{int(c.at)}r: node {c.node} does not exist; "
                           f"nodes are 0..{n - 1}")
    prog, update = _progress_printer(n, cfg.rounds, not as_json)
    kw = dict(deadline=deadline, procs=procs, workdir=workdir,
              kills=[c.pair for c in crashes], partitions=[c.text() for c in cuts],
              tls_dir=tls_dir, record_log=record_log, peers=peers)
    try:
        if prog is not None:
            with prog:
                res = run_nodes_config(cfg, on_round=update, **kw)
        else:
            res = run_nodes_config(cfg, **kw)
    except RuntimeError as e:
        raise console.WorkFailed(f"swarm failed: {e}") from None
    mode = cfg.protocol
    out = {"config": {**res.meta["config"], "mode": mode, "procs": procs,
                      **({"peers": peers} if peers else {})}, **res.summary()}
    if store is not None:
        out["run_id"] = _store(store, cfg, res.summary())
    if as_json:
        console.print_json(out)
        return
    _print_summary(res, f"sfg swarm ({mode}): {cfg.rule} under {cfg.process}, {n} nodes")


def swarm(
    nodes: int | None = opt("clients", also=("--nodes",)),
    protocol: str | None = clockflags.PROTOCOL,
    mode: str | None = typer.Option(None, "--mode", hidden=True, help="Deprecated: --protocol"),
    procs: int = typer.Option(2, help="Worker processes the nodes are spread over", rich_help_panel=REAL_PANEL),
    config: Path | None = opt("config"),
    dataset: str | None = opt("dataset"),
    data_root: str | None = opt("data_root"),
    model: str | None = opt("model"),
    process: str | None = opt("process"),
    rule: str | None = opt("rule"),
    graph: str | None = opt("graph"),
    seed: int | None = opt("seed"),
    rounds: int | None = opt("rounds"),
    local_steps: int | None = opt("local_steps"),
    batch_size: int | None = opt("batch_size"),
    lr: float | None = opt("lr"),
    weight_decay: float | None = opt("weight_decay"),
    alpha: float | None = opt("alpha"),
    partition: list[str] = opt("partition", []),
    eval_every: int | None = opt("eval_every"),
    attack: str | None = opt("attack"),
    period: float | None = clockflags.PERIOD,
    jitter: float | None = clockflags.JITTER,
    window: float | None = clockflags.WINDOW,
    deadline: float | None = clockflags.DEADLINE,
    on_return: str | None = opt("on_return"),
    peers: str | None = opt("peers"),
    cut: list[str] = clockflags.CUT,
    crash: list[str] = clockflags.CRASH,
    kill: list[str] = typer.Option([], "--kill", hidden=True, help="Deprecated: --crash NODE@ROUNDr"),
    tls_dir: str | None = typer.Option(None, help="Mutual TLS with the folder `sfg tls-ca` writes (each node loads its bundle DIR/node-<id>; with a +certified rule also its header-signing key)", rich_help_panel=REAL_PANEL),
    workdir: str | None = typer.Option(None, help="Folder for checkpoints and logs (default: a new temporary folder)"),
    store: str | None = opt("store"),
    record_log: str | None = typer.Option(None, "--record-log", help="async: write the run's event log (every node's wake-ups, arrivals with their digests, restarts) to this file, the final models beside it", rich_help_panel=REAL_PANEL),
    replay_log: list[Path] = typer.Option([], "--replay-log", help="Re-execute a recorded run (its log, or every node's log) with the node code on the virtual clock; needs --clock virtual"),
    clock: str = opt("clock", "rounds"),
    round_seconds: float | None = clockflags.ROUND_SECONDS,
    faults: str | None = clockflags.FAULTS,
    faults_seed: int | None = clockflags.FAULTS_SEED,
    compute: str | None = clockflags.COMPUTE,
    uplink: str | None = clockflags.UPLINK,
    latency: str | None = clockflags.LATENCY,
    loss: str | None = clockflags.LOSS,
    message_bytes: float | None = clockflags.MESSAGE_BYTES,
    eval_seconds: float | None = clockflags.EVAL_SECONDS,
    target_accuracy: float | None = clockflags.TARGET,
    as_json: bool = opt("json", False),
) -> None:
    """Launch N nodes on this machine that train and gossip over gRPC under churn."""
    protocol = protocol_of(protocol, mode, "swarm")
    if clock == "wall":
        deprecated("--clock wall", "--clock rounds (real nodes)", "swarm")
        clock = "rounds"
    if clock not in ("rounds", "virtual"):
        raise SfgError(f"unknown --clock {clock!r}; choose rounds (real nodes over gRPC) or "
                       "virtual (the node code on the virtual clock)")
    split, old_cuts = _split_or_cut(partition)
    for k in kill:
        deprecated(f"--kill {k}", f"--crash {k}r", "swarm")
    from sfg.net.cuts import Crash

    cuts, crashes = cuts_and_crashes(cut, crash)
    cuts += old_cuts
    crashes += [Crash.parse_round(k) for k in kill]
    require("sfg swarm", *NET_MODULES, extra="net")
    flags = {"dataset": dataset, "data_root": data_root, "model": model, "process": process,
             "rule": rule, "graph": graph, "seed": seed, "n_clients": nodes,
             "rounds": rounds, "local_steps": local_steps, "batch_size": batch_size,
             "lr": lr, "weight_decay": weight_decay, "alpha": alpha,
             "eval_every": eval_every, "attack": attack, "partition": split,
             "on_return": on_return}
    if replay_log:
        given = {**{f"--{k.replace('_', '-')}": v for k, v in flags.items()},
                 "--config": config, "--crash": crashes, "--cut": cuts,
                 "--store": store, "--record-log": record_log, "--tls-dir": tls_dir,
                 "--faults": faults, "--faults-seed": faults_seed}
        _replay_swarm(replay_log, clock, [k for k, v in given.items() if v], workdir,
                      as_json)
        return
    if faults is not None or faults_seed is not None:
        from sfg.clock.faults import Faults

        # checked here; the virtual clock's run takes
        # run_virtual_swarm(..., faults=Faults.parse(faults, seed=faults_seed or 0))
        Faults.parse(faults, seed=0 if faults_seed is None else faults_seed)
        if clock != "virtual":
            raise SfgError("--faults are events of the virtual clock's schedule; add "
                           "--clock virtual (real nodes: --crash and --cut in rounds)")
    # the virtual clock's settings (the async nodes are evaluated at its instants)
    world_flags = {"compute": compute, "uplink": uplink, "latency": latency, "loss": loss,
                   "message_bytes": message_bytes, "eval_seconds": eval_seconds,
                   "target_accuracy": target_accuracy}
    drawn = _swarm_peers(peers)
    flags["peers"] = drawn  # a setting of the run (its config and run id), as in sfg run
    if clock == "virtual":
        refused = {"--tls-dir": tls_dir, "--record-log": record_log}
        if round_seconds is not None:
            if period is not None and period != round_seconds:
                raise SfgError(f"--round-seconds {round_seconds:g} and --period {period:g} "
                               "disagree: in `sfg swarm --clock virtual` the period P is "
                               "also Δ; give one")
            period = round_seconds
        _virtual_swarm(config, flags, world_flags, mode=protocol, period=period,
                       jitter=jitter, window=window, deadline=deadline,
                       faults=faults_with(faults, cuts, crashes), faults_seed=faults_seed,
                       refused=[k for k, v in refused.items() if v],
                       store=store, as_json=as_json)
        return
    _real_swarm(config, flags, world_flags, round_seconds=round_seconds, cuts=cuts,
                crashes=crashes, protocol=protocol, period=period, jitter=jitter,
                window=window, deadline=deadline, procs=procs, workdir=workdir,
                tls_dir=tls_dir, record_log=record_log, store=store, as_json=as_json,
                peers=drawn)


def _swarm_peers(peers: str | None) -> str | None:
    """``sfg swarm --peers``: the nodes' peers chosen per exchange, a setting of the run (its
    config, run id and store), canonical; None: fixed (left out of the settings)."""
    from sfg.world.peers import parse_peers

    if peers is None or parse_peers(peers).fixed:
        return None
    return str(parse_peers(peers))


def _peer_file(peer_file: Path | None, peers: str | None) -> tuple[Path, str | None]:
    """The node's peer file (``--peer-file``; ``--peers FILE``, its old spelling, read with a
    notice) and the ``peers`` setting (docs/concepts/peers.md#real-nodes), parsed (one line
    when it does not)."""
    from sfg.world.peers import canonical_peers

    if peers is not None and peer_file is None and (
            Path(peers).suffix.lower() in (".yaml", ".yml", ".json") or Path(peers).exists()):
        deprecated(f"--peers {peers} (the peer file)", f"--peer-file {peers}", "node")
        peer_file, peers = Path(peers), None
    if peers is not None:
        peers = canonical_peers(peers)
    if peer_file is None:
        raise SfgError("give --peer-file FILE: a YAML of nodes: {id: host:port} and edges: "
                       "[[i, j], ...]")
    return peer_file, peers


def node(
    id: int = typer.Option(..., "--id", help="This node's id (a key of peers.yaml)"),
    listen: str = typer.Option(..., "--listen", help="HOST:PORT to serve on, e.g. 0.0.0.0:7000"),
    peer_file: Path | None = typer.Option(None, "--peer-file", help="YAML: nodes: {id: host:port}, edges: [[i, j], ...] (required)"),
    peers: str | None = opt("peers"),
    protocol: str | None = clockflags.PROTOCOL,
    mode: str | None = typer.Option(None, "--mode", hidden=True, help="Deprecated: --protocol"),
    config: Path | None = opt("config"),
    dataset: str | None = opt("dataset"),
    data_root: str | None = opt("data_root"),
    model: str | None = opt("model"),
    process: str | None = opt("process"),
    rule: str | None = opt("rule"),
    graph: str | None = opt("graph"),
    seed: int | None = opt("seed"),
    rounds: int | None = opt("rounds"),
    local_steps: int | None = opt("local_steps"),
    batch_size: int | None = opt("batch_size"),
    lr: float | None = opt("lr"),
    weight_decay: float | None = opt("weight_decay"),
    alpha: float | None = opt("alpha"),
    partition: str | None = opt("partition"),
    eval_every: int | None = opt("eval_every"),
    attack: str | None = opt("attack"),
    period: float | None = clockflags.PERIOD,
    jitter: float | None = clockflags.JITTER,
    window: float | None = clockflags.WINDOW,
    deadline: float | None = clockflags.DEADLINE,
    on_return: str | None = opt("on_return"),
    tls_dir: str | None = typer.Option(None, help="Mutual TLS with this node's bundle from `sfg tls-ca` (DIR/node-<id>; with a +certified rule also its header-signing key)"),
    insecure: bool = typer.Option(False, "--insecure", help="Serve and accept models in plaintext on a non-loopback --listen address (without --tls-dir); loopback needs no flag"),
    checkpoint_dir: str | None = typer.Option(None, help="Write a checkpoint every round here"),
    resume: bool = typer.Option(False, help="Continue from the checkpoint in --checkpoint-dir"),
    record_log: str | None = typer.Option(None, "--record-log", help="async: append this node's event log to this file (a restarted node continues it); replay the run's logs with `sfg swarm --replay-log ... --clock virtual`"),
    as_json: bool = opt("json", False),
) -> None:
    """Run one node of a swarm anywhere: serve on --listen, talk to the peers in peers.yaml."""
    peer_file, peers = _peer_file(peer_file, peers)
    mode = protocol_of(protocol, mode, "node")
    if mode == "event":
        raise SfgError("--protocol event runs on the virtual clock only; a node runs "
                       "lockstep or async")
    deadline = DEADLINE if deadline is None else deadline
    require("sfg node", *NET_MODULES, extra="net")
    import asyncio

    from sfg.net.certify import keys_for
    from sfg.net.node import Node, NodeConfig
    from sfg.net.transport import TlsFiles
    from sfg.net.world import build_world

    addresses, edges = _read_peers(peer_file)
    host, _, port_text = listen.rpartition(":")
    if not host or not port_text.isdigit():
        raise SfgError(f"--listen {listen!r} must be HOST:PORT, e.g. 0.0.0.0:7000")
    if id not in addresses:
        raise SfgError(f"--id {id} is not listed in {peer_file}")
    if tls_dir is None and not insecure and not is_loopback(host):
        raise SfgError(f"--listen {listen} is reachable from other machines and, without "
                       "--tls-dir, models would cross in plaintext with every sender taken "
                       "at its word; give --tls-dir (a bundle from `sfg tls-ca`), listen on "
                       "127.0.0.1, or add --insecure")
    flags = {"dataset": dataset, "data_root": data_root, "model": model, "process": process,
             "rule": rule, "graph": graph, "seed": seed, "n_clients": len(addresses),
             "rounds": rounds, "local_steps": local_steps, "batch_size": batch_size,
             "lr": lr, "weight_decay": weight_decay, "alpha": alpha,
             "eval_every": eval_every, "attack": attack, "partition": partition,
             "on_return": on_return}
    tls = TlsFiles.load(tls_dir, id) if tls_dir else None  # a stale certificate stops here
    from sfg.cli.run import run_config

    # the run's settings as sfg swarm's real nodes take them (protocol and timer included)
    rc = run_config(config, {**flags, "protocol": mode, "period": period, "jitter": jitter,
                             "window": window}, fixed={"nodes": "real"})
    cfg = rc.model_dump()
    mode, period = rc.protocol, REAL_PERIOD if rc.period is None else rc.period
    jitter, window = rc.jitter, rc.window
    if peers is not None:  # a lockstep node refuses online before the world is built
        from sfg.net.membership import check_mode
        from sfg.world.peers import parse_peers

        check_mode(parse_peers(peers), mode)
    world = build_world(cfg, edges=edges)
    if checkpoint_dir:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    nc = NodeConfig(mode=mode, host=host, port=int(port_text), period=period, jitter=jitter,
                    window=window, deadline=deadline, tls=tls,
                    checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
                    resume=resume, events=_node_log(record_log, mode),
                    keys=keys_for(world, tls_dir, id), pull_timeout=_pull_timeout(cfg),
                    peers=peers)
    if record_log is not None and nc.pull_timeout is not None:
        raise SfgError("--record-log replays arrivals on the virtual clock, whose node does "
                       "not implement on_return pull; drop --record-log or --on-return")

    async def main() -> dict:
        n = Node(world, id, nc)
        try:
            await n.start()
            n.connect(addresses)
            return await n.run()
        finally:
            await n.close()

    t = time.perf_counter()
    try:
        res = asyncio.run(main())
    except OSError as e:
        raise SfgError(f"cannot serve on {listen}: {e}") from None
    res["wall_seconds"] = time.perf_counter() - t
    if as_json:
        console.print_json(res)
        return
    drawn = res.get("peers")
    console.echo(f"node {id}: accuracy {res['acc']:.4f}, messages {res['messages']}, "
                 f"rejected {sum(res['rejected'].values())}, final age "
                 f"{res['state']['age']}, lag {res['state']['lag']:.2f}"
                 + ("" if not drawn else
                    f"; peers {drawn['peers']}: {drawn['messages']} sends drawn, "
                    f"{drawn['to_offline']} to offline peers, membership "
                    f"{drawn['membership_bytes_per_device_hour']:.0f} B per device-hour"))

def tls_ca(
    dir: Path = typer.Option(..., "--dir", help="Folder to write ca.pem and one bundle per node, node-<id>/, into"),
    nodes: int = typer.Option(..., "--nodes", help="Certificates for node ids 0..N-1"),
    host: list[str] = typer.Option([], "--host", help="Extra host name or IP the certificates are valid for (repeatable)"),
    days: int = typer.Option(30, help="Validity in days"),
    keep_ca_key: bool = typer.Option(False, "--keep-ca-key", help="Also keep the CA's private key, in DIR/ca-key/ca.key (no bundle holds it; sfg never reads it)"),
    force: bool = typer.Option(False, "--force", help="Replace existing keys"),
) -> None:
    """Create a test CA and a key bundle per node (DIR/node-<id>/: the CA and every node's certificate, that node's own keys) for `sfg node --tls-dir DIR/node-<id>` and `sfg swarm --tls-dir DIR`."""
    require("sfg tls-ca", "cryptography", extra="net")
    from sfg.net.tls import make_test_ca

    if nodes < 1 or days < 1:
        raise SfgError("--nodes and --days must be >= 1")
    d = make_test_ca(dir, range(nodes), hosts=host, days=days, keep_ca_key=keep_ca_key,
                     force=force)
    console.echo(f"wrote {d}/ca.pem and one bundle per node, {d}/node-0 .. "
                 f"{d}/node-{nodes - 1}: copy node-<id>/ to the machine of node <id> only"
                 + (f"; the CA's key is in {d}/ca-key/ca.key" if keep_ca_key else ""))


def register(app: typer.Typer) -> None:
    """``sfg swarm``, ``sfg node`` and ``sfg tls-ca`` on ``app``."""
    app.command("swarm")(swarm)
    app.command("node")(node)
    app.command("tls-ca")(tls_ca)
