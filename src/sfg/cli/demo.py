"""``make demo`` / ``sfg demo``: the main job on data that ships inside a package (no download).

1. **Pilot** (seed 0, docs/concepts/training.md#pairing: seeds 1–5 evaluate, seed 0 is for pilots): DFedAvg with and
   without outages, to show the accuracy gap that outages cost and that the rules can recover.
   The demo's scale (T = 60 rounds, K = 5 local steps, α = 0.3) was chosen by this pilot:
   on seed 0 bursty outages (u = 0.8) cost DFedAvg about 13 points of mean accuracy (at
   T = 100 the gap was 7 points, at T = 300 smaller still: the outage cost is largest early).
2. **Replay** of the demo's outage process: how stale models get and what each rule does with
   them (docs/concepts/replay.md#model-free-analyses), in a second or two.
3. **The paired grid**: digits (scikit-learn's bundled 8×8 images), N = 100 clients on a 6-NN
   graph, processes ``none`` and ``bursty:u=0.8``, the rules below, seeds 1–8 (eight units, so
   that the exact sign-flip test can pass a Holm correction over six comparisons); run with the
   local process-pool executor into a SQLite store (``sfg-out/demo.sqlite``).
4. **The report**: paired gains over DFedAvg with stratified intervals, sign-flip and Wilcoxon
   tests with Holm correction (docs/concepts/statistics.md#paired-statistics), the comparisons CSV and PNG plots in
   ``sfg-out/demo-report/``. Accuracies print in %, gains in percentage points; the CSV keeps
   fractions.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

from sfg.cli import console

DEMO_RULES = ["dfedavg", "aoi+ipw", "dfl-aa", "limited-merging:L=2", "sfg", "sfg-l", "sfg-cut"]
OUT = Path("sfg-out")


def demo_grid_text() -> str:
    return resources.files("sfg").joinpath("assets/demo.yaml").read_text()


def _say(text: str, *, style: str | None = None) -> None:
    """One literal line of the demo's story on stdout (``style`` e.g. "bold", "dim")."""
    console.stdout().print(text, style=style, soft_wrap=True)


def run_pilot(base: dict) -> tuple[float, float]:
    from sfg.sim.run import simulate

    accs = []
    for process in ("none", "bursty:u=0.8"):
        res = simulate({**{k: v for k, v in base.items() if k != "kind"}, "seed": 0,
                        "process": process, "rule": "dfedavg"})
        accs.append(res.metrics["acc_mean"])
    _say(f"1. Pilot (seed 0, DFedAvg): mean accuracy {100 * accs[0]:.1f} % without "
         f"outages, {100 * accs[1]:.1f} % under bursty outages (u = 0.8): outages cost "
         f"{100 * (accs[0] - accs[1]):.1f} percentage points.")
    return accs[0], accs[1]


def run_replay_demo(*, seeds=(1, 2, 3), n: int = 100, T: int = 100) -> None:
    from sfg.cli.replay import REPLAY_LEGEND, replay_table, summarise_replay
    from sfg.modelfree import plot_staleness, replay

    with console.progress("replay") as update:
        rows = replay(["bursty:u=0.8"], DEMO_RULES, list(seeds), n=n, T=T, with_curves=True,
                      progress=update)
    OUT.mkdir(exist_ok=True)
    png = plot_staleness(rows, OUT / "demo-staleness.png")
    console.show(replay_table(summarise_replay(rows),
                              f"2. Model-free replay: N={n} clients on a 6-NN graph, T={T} "
                              f"rounds, seeds {list(seeds)}"))
    _say(REPLAY_LEGEND, style="dim")
    _say(f"   mean age and effective lag over rounds: {png}")


def run_demo(*, quick: bool = False, resume: bool = False) -> None:
    from sfg.experiments.executors import run_grid
    from sfg.experiments.grid import parse_grid
    from sfg.experiments.report.paired import build_report, print_report
    from sfg.experiments.store import records

    t0 = time.perf_counter()
    grid = parse_grid(demo_grid_text(), source="sfg/assets/demo.yaml")
    configs = list(grid.configs)
    if quick:  # one seed, fewer rounds: a smoke test of the whole pipeline
        configs = [c.model_copy(update={"rounds": 30}) for c in configs if c.seed == 1]
    base = configs[0].model_dump()
    run_pilot(base if not quick else {**base, "rounds": 30})
    run_replay_demo(seeds=(1,) if quick else (1, 2, 3), T=int(base["rounds"]))

    OUT.mkdir(exist_ok=True)
    store = OUT / ("demo-quick.sqlite" if quick else "demo.sqlite")
    if store.exists() and not resume:
        store.unlink()
    _say(f"3. Paired grid: {len(configs)} runs (digits, N = 100, T = "
         f"{base['rounds']}, K = {base['local_steps']}; processes none and bursty u=0.8; "
         f"{len(DEMO_RULES)} rules; seeds {sorted({c.seed for c in configs})}) -> {store}")
    summary = run_grid(configs, store, workers=0, show_progress=True, label="demo grid")
    _say(f"   {summary.done} runs done, {summary.failed} failed in {summary.seconds:.0f} s")
    for rid, error in summary.failures[:5]:
        _say(f"   failed {rid}: {error}", style="red")

    recs = records(store)
    out_dir = OUT / ("demo-report-quick" if quick else "demo-report")
    rep = build_report(recs, baseline="dfedavg", out_dir=out_dir, metric="acc_mean")
    _say("4. Report: gain in mean personalised accuracy over DFedAvg in percentage points "
         "(pp), paired by seed and averaged over the two processes; accuracies in %")
    print_report(rep, console=console.stdout())
    console.note(f"wrote {', '.join(str(p) for p in rep.files.values())}")
    _say(f"demo finished in {time.perf_counter() - t0:.0f} s", style="dim")
    if summary.failed or summary.pending:
        raise console.WorkFailed(f"demo grid: {summary.failed} failed and {summary.pending} "
                                 f"pending runs; see `sfg grid status --store {store}`")
