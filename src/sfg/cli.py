"""The ``sfg`` command. Thin: parse, call the library, print (tables for people, --json for scripts).

Bad input raises :class:`sfg.errors.SfgError` in the library; :func:`main` prints it as one line
(``error: ...``) and exits with status 2 — never a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from .errors import SfgError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="sfg — decentralised learning when devices go offline.")
# piped output gets a wide console so that tables are not squeezed to 80 columns
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)


def _mount(module: str, name: str, help: str) -> None:
    try:
        mod = __import__(module, fromlist=["app"])
    except ImportError:
        return
    app.add_typer(mod.app, name=name, help=help)


@contextmanager
def progress_bar(description: str, *, enabled: bool = True):
    """A rich progress bar on stderr; yields ``update(done, total)``."""
    if not enabled or not err.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as prog:
        task = prog.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        yield update


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        if v.is_integer() and abs(v) >= 10:
            return f"{v:.0f}"
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


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
                seeds.extend(range(int(a), int(b) + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise SfgError(f"cannot read seeds {text!r}; write e.g. --seeds 1,2,3 or --seeds 1-5") from None
    if not seeds or any(s < 0 for s in seeds):
        raise SfgError(f"seeds {text!r} must be non-negative integers, e.g. --seeds 1,2,3")
    return seeds


def _replay_columns() -> list[tuple[str, str]]:
    from .replay.metrics import columns  # the metrics' own list (no numba import)

    return columns()


REPLAY_COLUMNS = _replay_columns()


def summarise_replay(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over seeds per (process, rule[, attack]), in first-seen order."""
    from .replay.metrics import columns

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
        out_rows.append(summary)
    return out_rows


def replay_table(summary: list[dict[str, Any]], title: str) -> Table:
    from .replay.metrics import columns

    with_attack = any("attack" in r for r in summary)
    cols = columns(attack=with_attack)
    table = Table(title=title, title_justify="left")
    table.add_column("process")
    table.add_column("rule")
    if with_attack:
        table.add_column("attack")
    for _, label in cols:
        table.add_column(label, justify="right")
    for r in summary:
        table.add_row(r["process"], r["rule"], *([r["attack"]] if with_attack else []),
                      *(_fmt(r[k]) for k, _ in cols))
    return table


def _replay_legend() -> str:
    from .replay.metrics import legend

    return legend()


REPLAY_LEGEND = _replay_legend()


@app.command()
def replay(
    process: list[str] = typer.Option(["bursty:u=0.8"], "--process", "-p",
                                      help="Outage process, e.g. iid:u=0.6, bursty:u=0.8, flash:rule=strict,path=FILE (repeatable)"),
    rule: list[str] = typer.Option(["dfedavg", "sfg", "sfg-l", "sfg-cut"], "--rule", "-r",
                                   help="Aggregation rule, e.g. sfg-cut:L=2, sfg-l:gamma=0.3+ipw (repeatable)"),
    seeds: str = typer.Option("1,2,3", help="Seeds: 1,2,3 or 1-5"),
    clients: int = typer.Option(100, "--clients", "-n", help="Number of clients N"),
    rounds: int = typer.Option(300, "--rounds", "-T", help="Number of rounds T"),
    graph: str = typer.Option("knn:k=6", help="Graph: knn:k=6, erdos-renyi:mean_degree=6, regular:d=6, ring:k=1"),
    anatomy: str = typer.Option("full", help="What an outage disables: full, cannot-communicate, cannot-train-shares, cannot-train-adopts"),
    link_failure: float = typer.Option(0.0, help="Per-round probability that each link fails"),
    horizon: int = typer.Option(50, help="Horizon h of the self-return H (0 = skip)"),
    engine: str = typer.Option("auto", help="auto or compiled (one compiled round runs every rule; numpy is accepted as an alias)"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (per-seed rows and summary)"),
    plot: str | None = typer.Option(None, "--plot", help="Write a PNG of mean age and lag over rounds, e.g. staleness.png"),
    attack: list[str] = typer.Option([], "--attack", help="Forged-staleness attack, e.g. forge:frac=0.1,claim=fresh or none (repeatable: one more axis)"),
) -> None:
    """Replay outage processes × rules × seeds with no training (SPEC §9)."""
    from .replay import plot_staleness
    from .replay import replay as run_replay

    seed_list = parse_seeds(seeds)
    if not as_json and err.is_terminal:
        from .replay import warm_compiled

        with err.status("loading the compiled round of each rule (a rule's first use on a "
                        "machine compiles it: about 15 s)"):
            warm_compiled(rule)
    with progress_bar("replay", enabled=not as_json) as update:
        rows = run_replay(process, rule, seed_list, n=clients, T=rounds, graph=graph,
                          anatomy=anatomy, link_failure=link_failure, horizon=horizon,
                          with_curves=plot is not None, progress=update, engine=engine,
                          attacks=attack or [None])
    if plot is not None:
        written = plot_staleness(rows, plot)
        for r in rows:
            r.pop("curves", None)
        err.print(f"[dim]wrote {written}[/dim]")
    summary = summarise_replay(rows)
    if as_json:
        print(dumps_json({"rows": rows, "summary": summary}))
        return
    out.print(replay_table(summary, f"Replay: N={clients}, T={rounds}, graph {graph}, "
                                    f"seeds {','.join(map(str, seed_list))}"))
    from .replay.metrics import legend

    out.print(f"[dim]{legend(attack=bool(attack))}[/dim]")


def jsonable(v: Any) -> Any:
    """Strict JSON values: NaN and infinities become null (json.dumps would write NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (str, int, bool)) or v is None:
        return v
    return str(v)


def dumps_json(v: Any) -> str:
    return json.dumps(jsonable(v), indent=2, allow_nan=False)


@app.command("rules")
def list_rules(as_json: bool = typer.Option(False, "--json")) -> None:
    """List every aggregation rule with its parameters and defaults."""
    from .rules import RULES, rule_names

    rows = []
    for name in rule_names():
        e = RULES.entry(name)
        rows.append({"rule": name, "tags": sorted(e.tags), "params": e.params, "doc": e.doc})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="Aggregation rules (modifiers: +ipw, +rounded, +catchup; universal c)")
    for col in ("rule", "kind", "parameters", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["rule"], ",".join(r["tags"]),
                      ", ".join(f"{k}={v}" for k, v in r["params"].items()), r["doc"])
    out.print(table)


@app.command("processes")
def list_processes() -> None:
    """List the outage processes (synthetic and real traces)."""
    from .outages import PROCESSES, process_names

    table = Table(title="Outage processes")
    for col in ("process", "parameters"):
        table.add_column(col)
    for name in process_names():
        e = PROCESSES.entry(name)
        table.add_row(name, ", ".join(f"{k}={v}" for k, v in e.params.items()))
    out.print(table)


@app.command()
def demo(
    quick: bool = typer.Option(False, help="One seed and 30 rounds: a smoke test of the pipeline"),
    resume: bool = typer.Option(False, help="Keep runs already in sfg-out/demo.sqlite"),
) -> None:
    """The main job on embedded data (no download): pilot, replay, paired grid, report."""
    from .demo import run_demo

    run_demo(quick=quick, console=out, resume=resume)


_mount("sfg.traces.cli", "traces", "Real availability traces: stats and plots.")
_mount("sfg.experiments.cli", "grid", "Paired experiment grids and the results store.")
for _name in ("sfg.sim.cli", "sfg.report_cli"):
    try:
        _mod = __import__(_name, fromlist=["register"])
        _mod.register(app)
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors for bad input (exit status 2), never a traceback."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="sfg", standalone_mode=False)
    except SfgError as e:
        err.print(f"[bold red]error:[/bold red] {e}", highlight=False, soft_wrap=True)
        return 2
    except FileNotFoundError as e:
        err.print(f"[bold red]error:[/bold red] file not found: {e.filename}; check the path",
                  highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted; results already written are kept")
        return 130
    except Exception as e:  # click's (typer-vendored) usage errors, Exit and Abort
        kind = type(e).__name__
        if kind == "Exit":
            return int(getattr(e, "exit_code", 0))
        if kind == "Abort":
            err.print("aborted")
            return 130
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            return int(e.exit_code)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
