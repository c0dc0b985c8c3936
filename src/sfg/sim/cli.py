"""``sfg run``: one training run from flags or a config file (YAML or JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from ..errors import SfgError


def _load_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise SfgError(f"config file {path} does not exist; check the path")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes one line
        raise SfgError(f"cannot parse config file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SfgError(f"config file {path} must hold a mapping of settings (key: value)")
    return data


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        config: Path | None = typer.Option(None, "--config", "-c", help="YAML/JSON file of settings; flags given explicitly override it"),
        dataset: str | None = typer.Option(None, help="digits (embedded), cifar10, cifar100, femnist"),
        data_root: str | None = typer.Option(None, help="Path to the dataset in its standard format"),
        model: str | None = typer.Option(None, help="mlp, small-cnn, cnn, resnet18-gn"),
        process: str | None = typer.Option(None, "--process", "-p", help="Outage process, e.g. bursty:u=0.8"),
        rule: str | None = typer.Option(None, "--rule", "-r", help="Aggregation rule, e.g. sfg-cut"),
        graph: str | None = typer.Option(None, help="Graph, e.g. knn:k=6"),
        seed: int | None = typer.Option(None, help="Seed (pairs graph, data, trace, minibatches)"),
        clients: int | None = typer.Option(None, "--clients", "-n", help="Number of clients N"),
        rounds: int | None = typer.Option(None, "--rounds", "-T"),
        local_steps: int | None = typer.Option(None, "--local-steps", "-K"),
        batch_size: int | None = typer.Option(None),
        lr: float | None = typer.Option(None),
        weight_decay: float | None = typer.Option(None),
        momentum: float | None = typer.Option(None),
        alpha: float | None = typer.Option(None, help="Dirichlet label-skew concentration"),
        backbone: str | None = typer.Option(None, help="full, personal-head, dfedavgm, ditto"),
        ditto_lambda: float | None = typer.Option(None),
        anatomy: str | None = typer.Option(None, help="full, cannot-communicate, cannot-train-shares, cannot-train-adopts"),
        link_failure: float | None = typer.Option(None),
        eval_every: int | None = typer.Option(None),
        backend: str | None = typer.Option(None, help="auto, loop, vmap, batched"),
        device: str | None = typer.Option(None, help="cpu, cuda, auto"),
        attack: str | None = typer.Option(None, "--attack", help="Forged-staleness attack, e.g. forge:frac=0.1,claim=fresh,model=sign-flip (default none)"),
        as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON"),
    ) -> None:
        """Train N personalised models under outages with one rule; print the metrics."""
        from ..cli import dumps_json, out, progress_bar
        from .run import simulate

        cfg: dict[str, Any] = _load_config(config) if config else {}
        cfg.pop("kind", None)
        cfg.pop("horizon", None)
        flags = {"dataset": dataset, "data_root": data_root, "model": model, "process": process,
                 "rule": rule, "graph": graph, "seed": seed, "n_clients": clients,
                 "rounds": rounds, "local_steps": local_steps, "batch_size": batch_size, "lr": lr,
                 "weight_decay": weight_decay, "momentum": momentum, "alpha": alpha,
                 "backbone": backbone, "ditto_lambda": ditto_lambda, "anatomy": anatomy,
                 "link_failure": link_failure, "eval_every": eval_every, "backend": backend,
                 "device": device, "attack": attack}
        cfg.update({k: v for k, v in flags.items() if v is not None})
        with progress_bar("training", enabled=not as_json) as update:
            res = simulate(cfg, progress=update)
        if as_json:
            print(dumps_json({"config": cfg, "metrics": res.metrics, "curves": res.curves,
                              "meta": res.meta}))
            return
        from rich.table import Table

        m = res.metrics
        table = Table(title=f"sfg run: {cfg.get('rule', 'dfedavg')} under {cfg.get('process', 'bursty:u=0.8')}",
                      title_justify="left")
        table.add_column("metric")
        table.add_column("value", justify="right")
        honest = ([("honest clients: mean accuracy", m["acc_honest_mean"]),
                   ("honest clients: 10th percentile", m["acc_honest_p10"])]
                  if cfg.get("attack") not in (None, "none") else [])
        rows = [("mean accuracy", m["acc_mean"]), ("10th percentile", m["acc_p10"]), *honest,
                ("time-averaged accuracy", m["acc_time_avg"]),
                *((f"accuracy, availability quartile {q}", m[f"acc_q{q}"]) for q in range(1, 5)),
                ("realised unavailability", m["unavailability"]), ("messages", m["messages"]),
                ("staleness scalars sent", m["scalars"]),
                ("local steps / DFedAvg", m["local_steps_rel"]), ("seconds", res.meta["seconds"])]
        for name, v in rows:
            table.add_row(name, f"{v:.4f}" if abs(v) < 100 else f"{v:.0f}")
        out.print(table)
        out.print(f"[dim]backend {res.meta.get('backend')}, D = {res.meta.get('D')} parameters per model; "
                  f"{res.meta.get('with_replacement_clients')} clients have fewer examples than the batch "
                  "and sample it with replacement[/dim]")
