"""``sfg grid``: run a grid file into a results store, or show a store's status (thin CLI).

::

    sfg grid run examples/demo.yaml --store results.sqlite [--workers 0]
    sfg grid run examples/paper-cifar10.yaml --store c10.sqlite --executor ray \\
        --address auto --gpus-per-run 0.25
    sfg grid run GRID.yaml --store S --dry-run     # validate and count, run nothing
    sfg grid check GRID.yaml                      # can its seeds resolve its family?
    sfg grid status --store results.sqlite [--json]
    sfg grid upgrade --store results.sqlite       # sfg 0.2's swarm runs: their own run ids

Also runnable on its own: ``python -m sfg.experiments run GRID.yaml --store S``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import typer

from sfg.cli import console
from sfg.cli.options import opt

app = typer.Typer(help="Run experiment grids into a results store (runs paired by seed across rules).",
                  no_args_is_help=True, add_completion=False)


@app.command("run")
def run_cmd(
    grid: Path = typer.Argument(..., help="grid YAML file, e.g. examples/demo.yaml"),
    store: Path = opt("store", ...),
    executor: str = typer.Option("local", help="local or ray"),
    workers: int = typer.Option(1, help="local worker processes; 0 = one per CPU"),
    address: str | None = typer.Option(
        None, help="Ray address: auto, local or ray://host:port (default: start a local one)"),
    gpus_per_run: float = typer.Option(0.0, help="GPUs per Ray task (0.25: 4 runs per GPU)"),
    cpus_per_run: float = typer.Option(1.0, help="CPUs per Ray task"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and count; run nothing"),
    progress: bool = typer.Option(True, help="show a progress bar"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary"),
) -> None:
    """Run every config of GRID not yet done in STORE (resumable; failed runs are retried).

    Exit status 1 when a run failed or is still pending (the summary says which).
    """
    from sfg.experiments.executors import run_grid
    from sfg.experiments.grid import check_family, load_grid
    from sfg.experiments.store import Store

    g = load_grid(grid)
    if g.family is not None:  # a grid that cannot resolve its declared family runs nothing
        check_family(g)
    if dry_run:
        done = 0
        if store.exists():
            with Store(store, create=False) as s:
                done = s.counts(g.run_ids())["done"]
        summary = {"grid": g.name, "runs": len(g), "already_done": done,
                   "to_run": len(g) - done,
                   "axes": {a: len(v) for a, v in g.axes.items()},
                   "kinds": sorted({c.kind for c in g})}
        if as_json:
            console.print_json(summary, indent=None)
            return
        axes = " x ".join(f"{n} {a}" for a, n in summary["axes"].items()) or "base only"
        console.echo(f"grid {g.name!r}: {len(g)} runs ({axes}); {done} already done in "
                     f"{store}, {len(g) - done} to run")
        return
    from sfg.util.extras import require

    if any(c.kind == "train" for c in g):
        require(f"sfg grid run {grid} (it has training runs)", "torch")
    if executor == "ray":
        require("sfg grid run --executor ray", "ray")
    result = run_grid(g.configs, store, executor=executor, workers=workers, address=address,
                      gpus_per_run=gpus_per_run, cpus_per_run=cpus_per_run,
                      show_progress=progress and not as_json, label=g.name,
                      grid=g.name)
    if as_json:
        console.print_json({"grid": g.name, "total": result.total,
                            "already_done": result.already_done, "done": result.done,
                            "failed": result.failed, "pending": result.pending,
                            "seconds": round(result.seconds, 3),
                            "failures": [{"run_id": r, "error": e} for r, e in result.failures]},
                           indent=None)
    else:
        console.echo(f"grid {g.name!r}: {result.done}/{result.total} done "
                     f"({result.already_done} were already done), {result.failed} failed, "
                     f"{result.pending} pending, {result.seconds:.1f} s; store {store}")
        for rid, err in result.failures[:10]:
            console.echo(f"  failed {rid}: {err}")
        if len(result.failures) > 10:
            console.echo(f"  ... and {len(result.failures) - 10} more (sfg grid status)")
    if result.failed or result.pending:
        what = " and ".join(f"{n} {k}" for n, k in ((result.failed, "failed"),
                                                     (result.pending, "pending")) if n)
        raise console.WorkFailed(f"grid {g.name!r}: {what} of {result.total} runs; see "
                                 f"`sfg grid status --store {store}` and run the grid again "
                                 "to retry them")


@app.command("check")
def check_cmd(
    grid: Path = typer.Argument(..., help="grid YAML file with a family: {comparisons: M}"),
) -> None:
    """Check that GRID's seeds can resolve the family of comparisons it declares: with U seeds
    the exact sign-flip test's smallest p, 2^(1-U), must lie below alpha/M (Holm's strictest
    threshold). Exit status 2, with the seeds needed, when they cannot."""
    from sfg.experiments.grid import check_family, load_grid

    console.echo(check_family(load_grid(grid)))


@app.command("status")
def status_cmd(
    store: Path = opt("store", ...),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Show how many runs are queued, running, done and failed, and why runs failed."""
    from sfg.experiments.store import Store, worker_gone

    with Store(store, create=False) as s:
        counts = s.counts()
        rows = [r for r in s.runs() if r["status"] in ("running", "failed")]
        meta = s.meta()
    now = time.time()
    running = [{"run_id": r["run_id"], "rule": r["rule"], "process": r["process"],
                "seed": r["seed"], "worker": r["worker"],
                "seconds": round(now - (r["started"] or now), 1),
                "worker_alive": not worker_gone(r["worker"])}
               for r in rows if r["status"] == "running"]
    failed = [{"run_id": r["run_id"], "rule": r["rule"], "process": r["process"],
               "seed": r["seed"], "error": r["error"]} for r in rows if r["status"] == "failed"]
    if as_json:
        console.print_json({"store": str(store), "schema_version": int(meta["schema_version"]),
                            "counts": counts, "running": running, "failed": failed}, indent=None)
        return
    total = sum(counts.values())
    console.echo(f"{store}: {total} runs - " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    for title, items, cols in (("running", running, ("run_id", "rule", "process", "seed",
                                                      "worker", "seconds", "worker_alive")),
                               ("failed", failed, ("run_id", "rule", "process", "seed",
                                                   "error"))):
        if items:
            table = console.table(title, cols, overflow="fold")
            for it in items[:50]:
                table.add_row(*(str(it[c]) for c in cols))
            console.show(table)


@app.command("upgrade")
def upgrade_cmd(
    store: Path = opt("store", ...),
    period: float | None = typer.Option(
        None, help="real async nodes' period in wall seconds, which sfg 0.2 did not store "
                   "(default 0.2, the real nodes' default)"),
    jitter: float = typer.Option(0.0, help="real async nodes' jitter, which sfg 0.2 did not "
                                           "store"),
    window: float = typer.Option(1.0, help="real async nodes' window, which sfg 0.2 did not "
                                           "store"),
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would change; change "
                                                          "nothing"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Give the `sfg swarm --store` runs of a store written by sfg 0.2 their own identity.

    0.2 stored them with `backend: swarm-<mode>`; their settings now say which nodes ran them
    (`nodes: virtual` or `real`, the protocol, `backend: loop`) and their run ids cover that.
    Other runs keep their ids. One transaction: all rows move, or none.
    """
    from sfg.experiments.upgrade import upgrade_store

    changes = upgrade_store(store, period=period, jitter=jitter, window=window,
                            dry_run=dry_run)
    if as_json:
        console.print_json({"store": str(store), "dry_run": dry_run, "runs": changes},
                           indent=None)
        return
    verb = "would re-key" if dry_run else "re-keyed"
    console.echo(f"{store}: {verb} {len(changes)} swarm run(s) written by sfg 0.2")
    for c in changes:
        console.echo(f"  {c['old']} -> {c['new']} ({c['engine']})")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m sfg.experiments``: the exit statuses of ``sfg`` (0 success,
    1 failed or pending runs, 2 bad input with one ``error: ...`` line)."""
    return console.run_app(app, argv, prog_name="python -m sfg.experiments")


if __name__ == "__main__":
    sys.exit(main())
