"""``make demo``: the main job on data that ships inside a package (no download)."""

from __future__ import annotations

from rich.console import Console

DEMO_PROCESSES = ["iid:u=0.6", "bursty:u=0.8", "heterogeneous:u=0.6", "regional:u=0.6"]
DEMO_RULES = ["dfedavg", "aoi+ipw", "dfl-aa", "limited-merging:L=2", "sfg", "sfg-l", "sfg-cut"]


def run_replay_demo(console: Console, *, seeds=(1, 2, 3), n: int = 100, T: int = 300) -> list[dict]:
    """Replay report over the synthetic outage processes (SPEC §9)."""
    from .cli import REPLAY_LEGEND, progress_bar, replay_table, summarise_replay
    from .replay import replay

    with progress_bar("replay") as update:
        rows = replay(DEMO_PROCESSES, DEMO_RULES, list(seeds), n=n, T=T, progress=update)
    summary = summarise_replay(rows)
    console.print(replay_table(summary, f"Model-free replay: N={n} clients on a 6-NN graph, "
                                        f"T={T} rounds, seeds {list(seeds)}"))
    console.print(f"[dim]{REPLAY_LEGEND}[/dim]")
    return summary


def run_demo(*, quick: bool = False, console: Console | None = None) -> None:
    console = console or Console()
    run_replay_demo(console, seeds=(1,) if quick else (1, 2, 3), T=100 if quick else 300)
