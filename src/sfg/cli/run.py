"""``sfg run``: one training run from flags or a config file (YAML or JSON).

Flags and the config file are validated by the one settings schema of a run,
:class:`sfg.experiments.config.RunConfig` (the same that checks grid entries): a wrong-typed or
out-of-range value is a one-line error naming the key. Flags given explicitly override the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from sfg.cli import clockflags, console
from sfg.cli.options import cuts_and_crashes, faults_with, opt
from sfg.errors import SfgError
from sfg.util.extras import require

# peers chosen per exchange (docs/concepts/peers.md#training-with-peers): their costs
PEER_ROWS = (("peer_messages_per_device_hour", "messages to drawn peers per device-hour"),
             ("messages_to_offline_per_device_hour", "of those, to offline peers, per device-hour"),
             ("membership_bytes_per_device_hour", "membership bytes per device-hour"))


def load_config(path: Path) -> dict[str, Any]:
    """The settings mapping of a YAML or JSON file, read safely (size, depth and alias limits;
    UTF-8 with a clear error); RunConfig then checks names and types."""
    from sfg.util.safety import load_settings_file

    return load_settings_file(path)


def run_config(config: Path | None, flags: dict[str, Any],
               fixed: dict[str, Any] | None = None):
    """The :class:`RunConfig` of ``sfg run``: the config file's settings, then the flags given.

    ``flags`` maps RunConfig field names to values (``None`` = not given). A file may name
    ``kind: train`` (e.g. a grid's base); other kinds are refused (use ``sfg replay`` or
    ``sfg grid run``). ``fixed``: the settings the command itself sets (``sfg swarm``'s
    ``nodes``), checked with the file's.
    """
    from sfg.experiments.config import ConfigError, make_config

    values: dict[str, Any] = load_config(config) if config else {}
    kind = values.pop("kind", "train")
    if kind != "train":
        raise SfgError(f"config file {config}: kind {kind!r} cannot run with `sfg run` (it "
                       f"trains); use `sfg replay --config {config}` for kind: replay, or put "
                       "the config in a grid for `sfg grid run`")
    try:
        if config is not None:
            make_config({**values, **(fixed or {})}, kind="train")  # errors name the file
    except ConfigError as e:
        raise SfgError(f"config file {config}: {str(e).removeprefix('bad run config: ')}") from None
    values.update({k: v for k, v in flags.items() if v is not None})
    return make_config({**values, **(fixed or {})}, kind="train")


def register(app: typer.Typer) -> None:
    """Add ``run`` to the ``sfg`` app."""
    app.command("run")(run)


def run(
    config: Path | None = opt("config"),
    dataset: str | None = opt("dataset"),
    data_root: str | None = opt("data_root"),
    model: str | None = opt("model"),
    process: str | None = opt("process"),
    rule: str | None = opt("rule"),
    graph: str | None = opt("graph"),
    peers: str | None = opt("peers"),
    seed: int | None = opt("seed"),
    clients: int | None = opt("clients"),
    rounds: int | None = opt("rounds"),
    local_steps: int | None = opt("local_steps"),
    batch_size: int | None = opt("batch_size"),
    lr: float | None = opt("lr"),
    weight_decay: float | None = opt("weight_decay"),
    momentum: float | None = opt("momentum"),
    alpha: float | None = opt("alpha"),
    partition: str | None = opt("partition"),
    backbone_from: str | None = typer.Option(None, help="Start every client from this pretrained backbone (.safetensors from `sfg pretrain`), head re-initialised"),
    diagnostics: str | None = typer.Option(None, help="Training diagnostics to record: raw,lag,finetune,returning or all"),
    backbone: str | None = typer.Option(None, help="full, personal-head, dfedavgm, ditto"),
    ditto_lambda: float | None = typer.Option(None, help="Ditto's proximal weight λ (with --backbone ditto)"),
    anatomy: str | None = opt("anatomy"),
    link_failure: float | None = opt("link_failure"),
    eval_every: int | None = opt("eval_every"),
    backend: str | None = typer.Option(None, help="auto, loop, vmap, batched"),
    device: str | None = typer.Option(None, help="cpu, cuda, auto"),
    precision: str | None = typer.Option(None, help="Local training's arithmetic: fp32 (default), tf32 (CUDA only; a no-op on CPU), bf16 (autocast; parameters stay fp32)"),
    attack: str | None = opt("attack"),
    as_json: bool = opt("json", False),
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
    eval_seconds: float | None = clockflags.EVAL_SECONDS,
    target_accuracy: float | None = clockflags.TARGET,
    faults: str | None = clockflags.FAULTS,
    faults_seed: int | None = clockflags.FAULTS_SEED,
    on_return: str | None = clockflags.ON_RETURN,
    cut: list[str] = clockflags.CUT,
    crash: list[str] = clockflags.CRASH,
) -> None:
    """Train N personalised models under outages with one rule; print the metrics."""
    faults = faults_with(faults, *cuts_and_crashes(cut, crash))
    require("sfg run", "torch")
    on_clock = clockflags.clock_values(
        clock=clock, protocol=protocol, round_seconds=round_seconds, period=period,
        jitter=jitter, window=window, compute=compute, uplink=uplink, latency=latency,
        loss=loss, message_bytes=message_bytes, eval_seconds=eval_seconds,
        target_accuracy=target_accuracy, faults=faults, faults_seed=faults_seed,
        on_return=on_return)
    cfg = run_config(config, {
        "dataset": dataset, "data_root": data_root, "model": model, "process": process,
        "rule": rule, "graph": graph, "peers": peers, "seed": seed, "n_clients": clients,
        "rounds": rounds,
        "local_steps": local_steps, "batch_size": batch_size, "lr": lr,
        "weight_decay": weight_decay, "momentum": momentum, "alpha": alpha,
        "backbone": backbone, "ditto_lambda": ditto_lambda, "anatomy": anatomy,
        "link_failure": link_failure, "eval_every": eval_every, "backend": backend,
        "device": device, "precision": precision, "partition": partition, "backbone_from": backbone_from,
        "diagnostics": diagnostics, "attack": attack, **on_clock})
    from sfg.experiments.config import run_id
    from sfg.sim.run import resolve_config, train

    settings = cfg.model_dump()
    events = cfg.clock == "virtual" and cfg.protocol != "lockstep"
    with console.progress(f"training on the virtual clock ({cfg.protocol})" if events
                          else "training", enabled=not as_json) as update:
        res = train(resolve_config(settings), progress=update)
    if as_json:  # diagnostics: per-bin sums and counts, and the lag law's fitted ρ
        console.print_json({"config": settings, "run_id": run_id(cfg), **res.summary(),
                            "meta": res.meta})
        return
    if events:
        _show_events(cfg, res)
        return
    m = res.metrics
    honest = ([("honest clients: mean accuracy", m["acc_honest_mean"]),
               ("honest clients: 10th percentile", m["acc_honest_p10"])] if cfg.attack else [])
    rows = [("mean accuracy", m["acc_mean"]), ("10th percentile", m["acc_p10"]), *honest,
            ("time-averaged accuracy", m["acc_time_avg"]),
            *((f"accuracy, availability quartile {q}", m[f"acc_q{q}"]) for q in range(1, 5)),
            ("realised unavailability", m["unavailability"]), ("messages", m["messages"]),
            ("staleness scalars sent", m["scalars"]),
            ("local steps / DFedAvg", m["local_steps_rel"]),
            *((name, m[k]) for k, name in PEER_ROWS if k in m), ("seconds", res.meta["seconds"])]
    t = console.table(f"sfg run: {cfg.rule} under {cfg.process}", ["metric", ("value", "right")])
    for name, v in rows:
        t.add_row(name, "empty (no client)" if v != v
                  else f"{v:.4f}" if abs(v) < 100 else f"{v:.0f}")
    for name, v in _rate_rows(res.diagnostics):
        t.add_row(name, v)
    console.show(t)
    console.caption(f"backend {res.meta.get('backend')}, D = {res.meta.get('D')} parameters per "
                 f"model; {res.meta.get('with_replacement_clients')} clients have fewer examples "
                 "than the batch and sample it with replacement")


def _show_events(cfg, got) -> None:
    """The table of ``sfg run --clock virtual --protocol async|event`` (:mod:`sfg.clock.train`)."""
    m = got.metrics
    tta = m["time_to_accuracy_h"]
    rows = [("mean accuracy", f"{m['acc_mean']:.4f}"), ("10th percentile", f"{m['acc_p10']:.4f}"),
            ("time-averaged accuracy", f"{m['acc_time_avg']:.4f}"),
            (f"time to mean accuracy {got['meta']['target_accuracy']:g}",
             "not reached" if tta != tta else f"{tta:.2f} h"),
            ("realised unavailability", f"{m['unavailability']:.4f}"),
            ("local rounds per device-hour", f"{m['local_rounds_per_device_hour']:.3f}"),
            ("messages delivered", f"{m['delivered']:.0f}"),
            ("messages lost (sender offline / receiver offline / random)",
             f"{m['lost_sender']:.0f} / {m['lost_receiver']:.0f} / "
             f"{m['lost_random']:.0f}"),
            ("interrupted / skipped local rounds",
             f"{m['interrupted']:.0f} / {m.get('skipped', 0.0):.0f}"),
            ("compute-seconds per device-hour", f"{m['compute_seconds_per_device_hour']:.1f}"),
            *((name, f"{m[k]:.2f}") for k, name in PEER_ROWS if k in m),
            ("seconds", f"{got['meta']['seconds']:.1f}")]
    t = console.table(f"sfg run --clock virtual --protocol {cfg.protocol}: {cfg.rule} under "
                      f"{cfg.process}", ["metric", ("value", "right")])
    for name, v in [*rows, *_rate_rows(got.diagnostics)]:
        t.add_row(name, v)
    console.show(t)
    console.caption(f"{got['meta']['levels']} batches of local rounds, backend "
                    f"{got['meta']['backend']}, D = {got['meta']['D']}; schedule digest "
                    f"{got['meta']['schedule_digest']}")


def _rate_rows(diagnostics: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The table rows of the lag law's fitted rates (docs/concepts/diagnostics.md#distance-laws) as the run recorded them
    (:func:`sfg.sim.diagnostics.law_rates`, the fit the report uses); none without ``lag``."""
    lag = (diagnostics or {}).get("lag")
    if not lag:
        return []
    from sfg.sim.diagnostics import FIT_RANGE

    lo, hi = FIT_RANGE
    none = f"– (no live pairs at differences {lo}–{hi} to fit)"
    rows = [(f"lag law: ρ against ages (differences {lo}–{hi})", lag["rho_age"], none),
            (f"lag law: ρ against lags (differences {lo}–{hi})", lag["rho_lag"], none),
            ("lag law: ρ lags ÷ ρ ages", lag["rho_ratio"], "–")]
    return [(name, blank if v != v else f"{v:.4f}") for name, v, blank in rows]
