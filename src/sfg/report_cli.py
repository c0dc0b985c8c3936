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
    files: dict = {}
    if any((r.get("config") or {}).get("attack") for r in recs):
        # forged-staleness runs (sfg.attacks) get their own paired report; the ordinary one
        # compares the training runs without an attack
        from .attack_report import print_attack_rows, without_attacks, write_attack_report

        rows, files = write_attack_report(recs, out)
        print_attack_rows(rows, console=console.stdout())
        recs = [r for r in without_attacks(recs)
                if (r.get("config") or {}).get("kind", "train") == "train"]
    if recs or not files:
        rep = build_report(recs, baseline=baseline, out_dir=out, metric=metric,
                           rules=rule or None, alpha=alpha)
        print_report(rep, console=console.stdout())
        files = {**rep.files, **files}
    console.note(f"wrote {', '.join(str(p) for p in files.values())}")
