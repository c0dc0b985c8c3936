"""``sfg report``: paired comparisons, tables and plots from a results store (SPEC §8)."""

from __future__ import annotations

from pathlib import Path

import typer

from . import console
from .errors import SfgError


def register(app: typer.Typer) -> None:
    """Add ``report`` to the ``sfg`` app."""
    app.command("report")(report)


def report(
    store: Path = typer.Option(..., "--store", "-s", help="SQLite results store written by `sfg grid run`"),
    out: Path = typer.Option(Path("report"), "--out", "-o", help="Folder for report.md, comparisons.csv and PNG plots"),
    baseline: str = typer.Option("dfedavg", help="Rule every other rule is compared with"),
    metric: str = typer.Option("acc_mean", help="Metric compared (acc_mean, acc_p10, acc_time_avg, ...)"),
    rule: list[str] = typer.Option([], "--rule", "-r", help="Rules to compare (default: all in the store)"),
    alpha: float = typer.Option(0.05, help="Family-wise error rate (Holm)"),
) -> None:
    """Compare every rule with the baseline, paired by (dataset, seed), and plot the gains."""
    if not store.exists():
        raise SfgError(f"results store {store} does not exist; run `sfg grid run GRID.yaml --store {store}` first")
    from .experiments.store import records
    from .report import build_report, print_report

    recs = records(store)
    rep = build_report(recs, baseline=baseline, out_dir=out, metric=metric,
                       rules=rule or None, alpha=alpha)
    print_report(rep, console=console.stdout())
    console.note(f"wrote {', '.join(str(p) for p in rep.files.values())}")
