"""``sfg report``: paired comparisons, tables and plots from a results store (docs/concepts/statistics.md#paired-statistics)."""

from __future__ import annotations

from pathlib import Path

import typer

from sfg.cli import console
from sfg.cli.options import opt
from sfg.errors import SfgError


def register(app: typer.Typer) -> None:
    """Add ``report`` to the ``sfg`` app."""
    app.command("report")(report)


def report(
    store: Path = opt("store", ...),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder for report.md, comparisons.csv and PNG plots [default: report; none when only exporting]"),
    baseline: str = typer.Option("dfedavg", help="Rule every other rule is compared with"),
    metric: str = typer.Option("acc_mean", help="Metric compared (acc_mean, acc_p10, acc_time_avg, ...)"),
    rule: list[str] = typer.Option([], "--rule", "-r", help="Rules to compare (default: all in the store)"),
    fwer: float = typer.Option(0.05, "--fwer", help="Family-wise error rate of the comparisons (Holm)"),
    alpha: float | None = typer.Option(None, "--alpha", hidden=True, help="Deprecated: --fwer (--alpha is the data split's Dirichlet concentration elsewhere)"),
    tensorboard: Path | None = typer.Option(None, "--tensorboard", metavar="DIR", help="Write every finished run's curves and final metrics as TensorBoard event files under DIR (one folder per run: grid/dataset/process/rule/seed)"),
    across: str | None = typer.Option(None, "--across", metavar="FIELD=A,B", help="Also pair every run at config FIELD = A with the run that differs from it only in FIELD (= B), per rule (dfedavg included) and remaining setting: B − A in final accuracy and time to target, exact sign-flip p, Holm over each table (across.csv, across.md)"),
    grid: str | None = typer.Option(None, "--grid", "-g", metavar="NAME", help="Report the runs of this grid only (the name in its file; a store may hold several); default: every run, when they are of one kind"),
    mlflow: str | None = typer.Option(None, "--mlflow", metavar="URI", help="Log every finished run (settings as parameters, final metrics, curves by round) to the MLflow tracking store at URI (file:./mlruns, http://host:5000), one experiment per grid"),
) -> None:
    """Compare every rule with the baseline, paired by (dataset, seed), and plot the gains.

    With --tensorboard or --mlflow (and no --out) the runs are exported and no report is
    written; runs exported before are skipped.
    """
    if alpha is not None:
        from sfg.cli.options import deprecated

        deprecated(f"--alpha {alpha:g}", f"--fwer {alpha:g} (--alpha is the data split's "
                   "concentration in every other command)", "report")
        fwer = alpha
    if not store.exists():
        raise SfgError(f"results store {store} does not exist; run `sfg grid run GRID.yaml --store {store}` first")
    if tensorboard is not None or mlflow is not None:
        from sfg.experiments.report.export import (
            check_available,
            export_runs,
            to_mlflow,
            to_tensorboard,
        )

        check_available(tensorboard=tensorboard is not None, mlflow=mlflow is not None)
        runs = export_runs(store)
        if tensorboard is not None:
            console.note(to_tensorboard(runs, tensorboard).line())
        if mlflow is not None:
            console.note(to_mlflow(runs, mlflow).line())
        if out is None:
            return
    out = Path("report") if out is None else out
    from sfg.util.extras import require

    require("sfg report", "matplotlib")
    from sfg.experiments.report.paired import build_report, print_report
    from sfg.experiments.store import Store

    with Store(store, create=False, readonly=True) as st:  # one read of the store
        recs = select_runs(store, st.records(), st.grids(), grid)
    files: dict = {}
    if any((r.get("config") or {}).get("attack") for r in recs):
        # forged-staleness runs (sfg.round.attacks) get their own paired report; the ordinary one
        # compares the training runs without an attack
        from sfg.experiments.report.attacks import (
            print_attack_rows,
            without_attacks,
            write_attack_report,
        )

        rows, files = write_attack_report(recs, out)
        print_attack_rows(rows, console=console.stdout())
        recs = [r for r in without_attacks(recs)
                if (r.get("config") or {}).get("kind", "train") == "train"]
    if across is not None:  # bad input fails here, before the report is written
        from sfg.experiments.report.across import across_report, print_across

        arep = across_report(recs, across=across, out_dir=out, alpha=fwer)
    if recs or not files:
        rep = build_report(recs, baseline=baseline, out_dir=out, metric=metric,
                           rules=rule or None, alpha=fwer)
        print_report(rep, console=console.stdout())
        files = {**rep.files, **files}
    if across is not None:
        print_across(arep, console=console.stdout())
        files = {**files, **arep.files}
    console.note(f"wrote {', '.join(str(p) for p in files.values())}")


def select_runs(store: Path, recs: list[dict], of: dict[str, list[str]],
                grid: str | None) -> list[dict]:
    """The runs ``sfg report`` reads from ``recs`` (``of``: run id -> its grids' names): those
    of ``grid`` or, without one, every run when they are of one kind (training or replay);
    otherwise one error line that says which grids and kinds the store holds."""

    def kind(r: dict) -> str:
        return str((r.get("config") or {}).get("kind", "train"))

    def holds() -> str:
        names: dict[str, list[dict]] = {}
        for r in recs:
            for g in of.get(r["run_id"], ["(no grid)"]):
                names.setdefault(g, []).append(r)
        return "; ".join(f"{g} ({', '.join(sorted({kind(r) for r in rs}))}, {len(rs)} runs)"
                         for g, rs in sorted(names.items()))

    if grid is not None:
        chosen = [r for r in recs if grid in of.get(r["run_id"], [])]
        if not chosen:
            raise SfgError(f"no finished run of grid {grid!r} in {store}; it holds: {holds()}")
        recs = chosen
    kinds = sorted({kind(r) for r in recs})
    if len(kinds) > 1:
        raise SfgError(f"{store} holds runs of several kinds ({', '.join(kinds)}), which one "
                       f"report cannot compare; choose a grid with --grid NAME: {holds()}")
    return recs

