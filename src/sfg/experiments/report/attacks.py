"""Report of a forged-staleness grid (:mod:`sfg.round.attacks`): damage per rule, defence and attack
fraction, paired against the no-attack runs (docs/concepts/statistics.md#paired-statistics statistics), and a damage-vs-fraction plot.

Runs are told apart by their config's ``attack`` (absent = no attack). For training runs the
damage is the honest clients' accuracy (``acc_honest_mean``, ``acc_honest_p10``), paired per
(dataset, process, seed) with the same rule's no-attack run; units are (dataset, seed), the
interval is the stratified t-interval of :func:`sfg.experiments.stats.stratified_interval`. A defence's cost
is its no-attack accuracy paired against the undefended rule's. For replays (no training) the
damage measures of :mod:`sfg.modelfree.metrics` (weight given to attackers, own model cut, reach)
are averaged over seeds. :func:`sfg.experiments.report.paired.build_report` keeps reporting the no-attack runs.

Units (:mod:`sfg.util.units`): the Markdown and terminal tables and the plot show honest accuracies in
% and their paired differences in percentage points; the damage measures of replays keep their
own units (weights and shares in [0, 1]); ``attack.csv`` keeps the raw fractions. The plot is
titled with its metric and the datasets, processes and seeds of the runs it shows.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sfg.experiments.stats import pair_values, run_values, stratified_interval
from sfg.round.attacks import parse_attack
from sfg.round.defences import DEFENCES
from sfg.util.components import format_component, parse_component
from sfg.util.units import context, is_accuracy, metric_label, percent, points, title

TRAIN_METRICS = ("acc_honest_mean", "acc_honest_p10")
REPLAY_METRICS = ("attack_weight", "self_cut", "reach")


def without_attacks(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The runs without an attack (what the ordinary report compares)."""
    return [r for r in records if not (r.get("config") or {}).get("attack")]


def _attack_key(record: Mapping[str, Any]) -> tuple[str, float]:
    """(attack series = the attack without its fraction, fraction); ("none", 0) without one."""
    a = parse_attack((record.get("config") or {}).get("attack"))
    if a is None or a.frac == 0:  # frac=0 is the run without attack (bit for bit)
        return "none", 0.0
    comp = parse_component(a.text, kind="attack")
    params = {k: v for k, v in comp.params.items() if k != "frac"}
    return format_component(comp.name, params), a.frac


def undefended(rule: str) -> str:
    """The rule without its defence modifiers (and their parameters)."""
    comp = parse_component(rule, kind="rule")
    mods = [m for m in comp.modifiers if m not in DEFENCES]
    params = {k: v for k, v in comp.params.items()
              if not (k in ("kappa", "margin") and len(mods) < len(comp.modifiers))}
    return format_component(comp.name, params, mods)


@dataclass(frozen=True)
class AttackRow:
    kind: str        # "train" or "replay"
    rule: str
    series: str      # the attack without its fraction
    frac: float
    metric: str
    runs: int
    value: float     # mean over runs of the metric
    loss: float      # train: paired mean difference vs the rule's no-attack runs (NaN: replay)
    low: float
    high: float
    units: int


def _label(rule: str, series: str, frac: float) -> str:
    return f"{rule} | {series} | {frac:g}"


def attack_rows(records: Sequence[Mapping[str, Any]], *, confidence: float = 0.95) -> list[AttackRow]:
    """One row per (kind, rule, attack series, fraction, metric)."""
    rows: list[AttackRow] = []
    by_kind: dict[str, list[dict]] = {}
    for r in records:
        kind = (r.get("config") or {}).get("kind", "train")
        series, frac = _attack_key(r)
        metrics = dict(r.get("metrics") or {})
        if kind == "train" and series == "none":  # no attacker: every client is honest
            for honest, every in (("acc_honest_mean", "acc_mean"), ("acc_honest_p10", "acc_p10")):
                if every in metrics:
                    metrics.setdefault(honest, metrics[every])
        if kind == "replay" and series == "none":
            # no attacker: no weight to attackers and no reach (replays without an attack do
            # not report them; own-model cuts are reported by frac=0 runs)
            metrics.setdefault("attack_weight", 0.0)
            metrics.setdefault("reach", 0.0)
        by_kind.setdefault(kind, []).append({**r, "metrics": metrics,
                                             "rule": _label(r["rule"], series, frac),
                                             "_rule": r["rule"], "_series": series,
                                             "_frac": frac})
    for kind, recs in by_kind.items():
        metrics = TRAIN_METRICS if kind == "train" else REPLAY_METRICS
        cells = sorted({(r["_rule"], r["_series"], r["_frac"]) for r in recs},
                       key=lambda c: (c[0], c[1] != "none", c[1], c[2]))
        series_of = {s for _, s, _ in cells if s != "none"}
        for metric in metrics:
            present = [r for r in recs if metric in r.get("metrics", {})]
            if not present:
                continue
            values = run_values(present, metric)
            for rule, series, frac in cells:
                label = _label(rule, series, frac)
                vals = [v.value for v in values if v.rule == label and math.isfinite(v.value)]
                mean = float(np.mean(vals)) if vals else math.nan
                loss = low = high = math.nan
                units = 0
                base = (_label(rule, "none", 0.0) if series != "none"
                        else _label(undefended(rule), "none", 0.0))
                if kind == "train" and base != label:
                    pd = pair_values(values, rule=label, baseline=base, metric=metric)
                    iv = stratified_interval(pd.unit_diffs, pd.unit_strata, confidence=confidence)
                    loss, low, high, units = iv.mean, iv.low, iv.high, iv.units
                # a no-attack row stands for fraction 0 of every attack series
                for s in ([series] if series != "none" else sorted(series_of) or ["none"]):
                    rows.append(AttackRow(kind, rule, s, frac, metric, len(vals), mean, loss,
                                          low, high, units))
    return rows


def _fmt(x: float, signed: bool = False, *, metric: str = "") -> str:
    """A value of ``metric`` as shown: accuracies in % (differences, ``signed``, in pp)."""
    if x is None or not math.isfinite(x):
        return "–"
    if is_accuracy(metric):
        return points(x) if signed else f"{percent(x)} %"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def _delta(r: AttackRow) -> str:
    """The paired difference with its interval (pp), or "–" (replays, no-attack rows)."""
    if not math.isfinite(r.loss):
        return "–"
    return (f"{_fmt(r.loss, True, metric=r.metric)} [{_fmt(r.low, True, metric=r.metric)}, "
            f"{_fmt(r.high, True, metric=r.metric)}]")


DELTA_COLUMN = "Δ vs no attack, pp [CI]"


def _defence(rule: str) -> str:
    """The defence modifiers of a rule ("none" without)."""
    mods = [m for m in parse_component(rule, kind="rule").modifiers if m in DEFENCES]
    return "+".join(mods) or "none"


PLOT_METRIC = {"train": "acc_honest_mean", "replay": "attack_weight"}
_STYLES = ("-", "--", ":", "-.")


def _where(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """{kind: "dataset … · process … · seeds …"} of the runs of each kind (replays are
    model-free: no dataset)."""
    out = {}
    for kind in sorted({(r.get("config") or {}).get("kind", "train") for r in records}):
        recs = [r for r in records if (r.get("config") or {}).get("kind", "train") == kind]
        out[kind] = context(datasets=[] if kind == "replay" else [r["dataset"] for r in recs],
                            processes=[r["process"] for r in recs],
                            seeds=[r["seed"] for r in recs if isinstance(r.get("seed"), int)],
                            extra=["model-free (no dataset)"] if kind == "replay" else [])
    return out


def _plot(rows: Sequence[AttackRow], path: Path, *, where: Mapping[str, str] | None = None,
          confidence: float = 0.95) -> Path | None:
    """One panel per (kind, undefended rule): damage against the attacker fraction, one colour
    per defence, one line style per attack. Training: the paired loss of honest mean accuracy
    against the same rule without attack (pp, ``confidence`` CI); replay: the weight honest
    receivers give attackers. The figure's title names the metrics and ``where`` ({kind: the
    datasets, processes and seeds})."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sel = [r for r in rows if r.metric == PLOT_METRIC.get(r.kind)]
    panels = sorted({(r.kind, undefended(r.rule)) for r in sel})
    if not panels:
        return None
    defences = sorted({_defence(r.rule) for r in sel}, key=lambda d: (d != "none", d))
    series = sorted({r.series for r in sel})
    colours = {d: f"C{k % 10}" for k, d in enumerate(defences)}
    cols = min(4, len(panels))
    nrow = math.ceil(len(panels) / cols)
    kinds = sorted({k for k, _ in panels})
    what = {"train": f"paired Δ of {metric_label(PLOT_METRIC['train'])} against the same rule "
                     f"without attack ({confidence:.0%} CI)",
            "replay": f"{PLOT_METRIC['replay']}, the weight honest receivers give attackers "
                      "(model-free replay, mean over seeds)"}
    where = where or {}
    place = "; ".join(f"{k}: {where[k]}" if len(kinds) > 1 else where[k]
                      for k in kinds if where.get(k))
    head = title("Forged staleness: " + "; ".join(what[k] for k in kinds), place,
                 width=int(12 * 4.2 * cols))
    height = 3.3 * nrow + 0.8 + 0.2 * head.count("\n")
    fig = Figure(figsize=(4.2 * cols, height))
    FigureCanvasAgg(fig)
    for k, (kind, base) in enumerate(panels):
        ax = fig.add_subplot(nrow, cols, k + 1)
        for rule in sorted({r.rule for r in sel if r.kind == kind and undefended(r.rule) == base}):
            for si, s in enumerate(series):
                pts = sorted((r.frac, r) for r in sel
                             if r.kind == kind and r.rule == rule and r.series == s)
                if not pts:
                    continue
                x = np.array([f for f, _ in pts])
                style = dict(color=colours[_defence(rule)], linestyle=_STYLES[si % len(_STYLES)],
                             marker="o", markersize=3)
                if kind == "train":  # accuracy differences in percentage points
                    y = 100 * np.array([0.0 if f == 0 else r.loss for f, r in pts])
                    lo = 100 * np.array([0.0 if f == 0 else r.low for f, r in pts])
                    hi = 100 * np.array([0.0 if f == 0 else r.high for f, r in pts])
                    err = np.nan_to_num(np.stack([y - lo, hi - y]), nan=0.0)
                    ax.errorbar(x, y, yerr=err, capsize=2, **style)
                else:
                    ax.plot(x, [r.value for _, r in pts], **style)
        ax.set_title(f"{base} ({kind})", fontsize=9)
        ax.set_xlabel("attacker fraction", fontsize=8)
        ax.set_ylabel("Δ honest mean acc vs no attack (pp)" if kind == "train"
                      else "weight to attackers", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[d], label=f"defence: {d}") for d in defences]
    handles += [Line2D([], [], color="k", linestyle=_STYLES[i % len(_STYLES)], label=s)
                for i, s in enumerate(series)]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=7)
    fig.suptitle(head, fontsize=9)
    fig.tight_layout(rect=(0, 0.9 / height, 1, 1))
    from sfg.experiments.report.figures import save_png as _save

    return _save(fig, path)


def write_attack_report(records: Sequence[Mapping[str, Any]], out_dir: Path, *,
                        confidence: float = 0.95) -> tuple[list[AttackRow], dict[str, Path]]:
    """Write ``attack.md``, ``attack.csv`` and ``attack_damage.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = attack_rows(records, confidence=confidence)
    files: dict[str, Path] = {}
    csv_path = out_dir / "attack.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "rule", "attack", "frac", "metric", "runs", "mean", "paired_diff",
                    "low", "high", "units"])
        for r in rows:
            w.writerow([r.kind, r.rule, r.series, r.frac, r.metric, r.runs, r.value, r.loss,
                        r.low, r.high, r.units])
    files["attack.csv"] = csv_path
    where = _where(records)
    lines = ["# Forged staleness: damage per rule, defence and attacker fraction", "",
             *(f"* {kind}: {w}" for kind, w in where.items()), "",
             "Training rows: honest clients' accuracy in %; `Δ` is the paired mean difference "
             "in percentage points against "
             "the same rule without attack (for fraction 0: a defended rule against the "
             f"undefended one, i.e. the defence's cost), with its {confidence:.0%} stratified "
             "t-interval over (dataset, seed) units. Replay rows: damage measures (weights and "
             "shares in [0, 1]), mean over seeds. `attack.csv` keeps the raw fractions.",
             "", f"| kind | rule | attack | frac | metric | runs | mean | {DELTA_COLUMN} |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.kind} | `{r.rule}` | `{r.series}` | {r.frac:g} | {r.metric} | "
                     f"{r.runs} | {_fmt(r.value, metric=r.metric)} | {_delta(r)} |")
    md = out_dir / "attack.md"
    md.write_text("\n".join(lines) + "\n")
    files["attack.md"] = md
    png = _plot(rows, out_dir / "attack_damage.png", where=where, confidence=confidence)
    if png is not None:
        files["attack_damage.png"] = png
    return rows, files


def print_attack_rows(rows: Sequence[AttackRow], *, console: Any) -> None:
    """The attack report's table in the terminal (user-given names printed literally)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Forged staleness: damage per rule, defence and attacker fraction "
                        "(accuracies in %, Δ in percentage points)", title_justify="left")
    for col in ("kind", "rule", "attack", "frac", "metric", "runs", "mean", DELTA_COLUMN):
        table.add_column(col, justify="right" if col in ("frac", "runs", "mean") else "left")
    for r in rows:
        table.add_row(r.kind, Text(r.rule), Text(r.series), f"{r.frac:g}", r.metric, str(r.runs),
                      _fmt(r.value, metric=r.metric), _delta(r))
    console.print(table)
