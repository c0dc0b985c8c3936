"""``sfg traces``: statistics and plots of real availability traces (docs/concepts/traces.md#real-availability-traces).

    sfg traces stats --source flash --path FILE --availability strict [--json]
    sfg traces stats --source stunner --path FILE --variant 6day
    sfg traces plot --source tabular --path fleet.csv --out plots/
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sfg.cli import console
from sfg.cli.options import deprecated
from sfg.errors import SfgError

if TYPE_CHECKING:  # pragma: no cover
    from sfg.world.traces.base import Trace

app = typer.Typer(help="Real availability traces (FLASH, STUNner, your own CSV): stats, plots.",
                  no_args_is_help=True, add_completion=False)

_SOURCE = typer.Option(..., "--source", help="flash | stunner | tabular")
_PATH = typer.Option(..., "--path", help="trace file")
_AVAILABILITY = typer.Option("strict", "--availability",
                             help="FLASH: the availability criterion a minute must meet: strict "
                                  "| relaxed (flash:rule= of the outage process)")
_RULE = typer.Option(None, "--rule", hidden=True, help="Deprecated: --availability")


def _short(short: str, long: str, meaning: str):
    """``-p`` / ``-s``: gone from ``sfg traces`` (elsewhere they are --process and --store)."""
    def refuse(value: str | None) -> str | None:
        if value is not None:
            raise SfgError(f"{short} is {meaning} in every other command; write {long}")
        return value

    return typer.Option(None, short, hidden=True, is_eager=True, callback=refuse,
                        expose_value=False)


_P = _short("-p", "--path", "--process")
_S = _short("-s", "--source", "--store (sfg report)")


def _availability(availability: str, rule: str | None) -> str:
    if rule is not None:
        deprecated(f"--rule {rule}", f"--availability {rule}", "traces")
        return rule
    return availability
_SCREEN = typer.Option("either", "--screen",
                       help="FLASH screen reading: either | last-event | display | lock")
_VARIANT = typer.Option("10min", "--variant", help="STUNner variant: 10min | 6day")
_ROUNDS = typer.Option(None, "--rounds", help="window length in rounds (default: source's)")
_RM = typer.Option(None, "--round-minutes", help="round length in minutes (default: source's)")
_MINAV = typer.Option(None, "--min-availability",
                      help="eligibility threshold (default 0.05; tabular 0)")


def _load(source: str, path: Path, rule: str, variant: str, rounds: int | None,
          round_minutes: float | None, min_availability: float | None,
          screen: str = "either") -> Trace:
    from sfg.world.traces.process import load_trace

    src = source.lower()
    params: dict = {"rounds": rounds, "round_minutes": round_minutes,
                    "min_availability": min_availability}
    if src == "flash":
        params["rule"] = rule
        params["screen"] = screen
    elif src == "stunner":
        params["variant"] = variant
    return load_trace(src, path, **params)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@app.command()
def stats(source: str = _SOURCE, path: Path = _PATH, availability: str = _AVAILABILITY,
          rule: str | None = _RULE, _p: str | None = _P, _s: str | None = _S, screen: str = _SCREEN,
          variant: str = _VARIANT, rounds: int | None = _ROUNDS,
          round_minutes: float | None = _RM, min_availability: float | None = _MINAV,
          as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
          interior: bool = typer.Option(False, "--interior-outages",
                                        help="ignore outages touching the window edges")) -> None:
    """Eligible devices, availability and outage lengths of a trace."""
    from sfg.world.traces.stats import trace_stats

    rule = _availability(availability, rule)
    trace = _load(source, path, rule, variant, rounds, round_minutes, min_availability, screen)
    s = trace_stats(trace, include_edges=not interior)
    if as_json:
        console.print_json(s)
        return
    label = s.get("rule") or s.get("variant")
    table = console.table(f"{s['source']} trace" + (f" ({label})" if label else ""),
                          ["statistic", ("value", "right")], caption=str(s["path"]))
    for k, v in s.items():
        if k not in ("source", "path"):
            table.add_row(k, _fmt(v))
    console.show(table)


@app.command()
def plot(source: str = _SOURCE, path: Path = _PATH, availability: str = _AVAILABILITY,
         rule: str | None = _RULE, _p: str | None = _P, _s: str | None = _S, screen: str = _SCREEN,
         variant: str = _VARIANT, rounds: int | None = _ROUNDS,
         round_minutes: float | None = _RM, min_availability: float | None = _MINAV,
         out: Path = typer.Option(..., "--out", "-o", help="folder for the PNGs")) -> None:
    """Availability by hour, outage lengths, per-device availability, raster (PNG)."""
    from sfg.util.extras import require

    require("sfg traces plot", "matplotlib")
    from sfg.world.traces.plot import plot_trace

    rule = _availability(availability, rule)
    trace = _load(source, path, rule, variant, rounds, round_minutes, min_availability, screen)
    for p in plot_trace(trace, out):
        console.echo(p)
