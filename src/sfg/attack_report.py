"""Report of a forged-staleness grid (:mod:`sfg.attacks`): damage per rule, defence and attack
fraction, paired against the no-attack runs (SPEC §8 statistics), and a damage-vs-fraction plot.

Runs are told apart by their config's ``attack`` (absent = no attack). For training runs the
damage is the honest clients' accuracy (``acc_honest_mean``, ``acc_honest_p10``), paired per
(dataset, process, seed) with the same rule's no-attack run; units are (dataset, seed), the
interval is the stratified t-interval of :func:`sfg.stats.stratified_interval`. A defence's cost
is its no-attack accuracy paired against the undefended rule's. For replays (no training) the
damage measures of :mod:`sfg.replay.metrics` (weight given to attackers, own model cut, reach)
are averaged over seeds. :func:`sfg.report.build_report` keeps reporting the no-attack runs.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .attacks import parse_attack
from .defences import DEFENCES
from .spec import format_component, parse_component
from .stats import pair_values, run_values, stratified_interval

TRAIN_METRICS = ("acc_honest_mean", "acc_honest_p10")
REPLAY_METRICS = ("attack_weight", "self_cut", "reach")


def has_attacks(records: Sequence[Mapping[str, Any]]) -> bool:
    return any((r.get("config") or {}).get("attack") for r in records)


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


def _fmt(x: float, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def _defence(rule: str) -> str:
    """The defence modifiers of a rule ("none" without)."""
    mods = [m for m in parse_component(rule, kind="rule").modifiers if m in DEFENCES]
    return "+".join(mods) or "none"


PLOT_METRIC = {"train": "acc_honest_mean", "replay": "attack_weight"}
_STYLES = ("-", "--", ":", "-.")


def _plot(rows: Sequence[AttackRow], path: Path) -> Path | None:
    """One panel per (kind, undefended rule): damage against the attacker fraction, one colour
    per defence, one line style per attack. Training: the paired loss of honest mean accuracy
    against the same rule without attack (95 % CI); replay: the weight honest receivers give
    attackers."""
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
    fig = Figure(figsize=(4.2 * cols, 3.3 * nrow + 0.8))
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
                if kind == "train":
                    y = np.array([0.0 if f == 0 else r.loss for f, r in pts])
                    lo = np.array([0.0 if f == 0 else r.low for f, r in pts])
                    hi = np.array([0.0 if f == 0 else r.high for f, r in pts])
                    err = np.nan_to_num(np.stack([y - lo, hi - y]), nan=0.0)
                    ax.errorbar(x, y, yerr=err, capsize=2, **style)
                else:
                    ax.plot(x, [r.value for _, r in pts], **style)
        ax.set_title(f"{base} ({kind})", fontsize=9)
        ax.set_xlabel("attacker fraction", fontsize=8)
        ax.set_ylabel("Δ honest acc vs no attack" if kind == "train" else "weight to attackers",
                      fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[d], label=f"defence: {d}") for d in defences]
    handles += [Line2D([], [], color="k", linestyle=_STYLES[i % len(_STYLES)], label=s)
                for i, s in enumerate(series)]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=7)
    fig.tight_layout(rect=(0, 0.9 / (3.3 * nrow + 0.8), 1, 1))
    from .report import _save  # the report's one PNG writer

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
    lines = ["# Forged staleness: damage per rule, defence and attacker fraction", "",
             "Training rows: honest clients' accuracy; `Δ` is the paired mean difference against "
             "the same rule without attack (for fraction 0: a defended rule against the "
             f"undefended one, i.e. the defence's cost), with its {confidence:.0%} stratified "
             "t-interval over (dataset, seed) units. Replay rows: damage measures, mean over seeds.",
             "", "| kind | rule | attack | frac | metric | runs | mean | Δ [CI] |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = (f"{_fmt(r.loss, True)} [{_fmt(r.low, True)}, {_fmt(r.high, True)}]"
              if math.isfinite(r.loss) else "–")
        lines.append(f"| {r.kind} | `{r.rule}` | `{r.series}` | {r.frac:g} | {r.metric} | "
                     f"{r.runs} | {_fmt(r.value)} | {ci} |")
    md = out_dir / "attack.md"
    md.write_text("\n".join(lines) + "\n")
    files["attack.md"] = md
    png = _plot(rows, out_dir / "attack_damage.png")
    if png is not None:
        files["attack_damage.png"] = png
    return rows, files


def print_attack_rows(rows: Sequence[AttackRow], *, console: Any) -> None:
    """The attack report's table in the terminal (user-given names printed literally)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Forged staleness: damage per rule, defence and attacker fraction",
                  title_justify="left")
    for col in ("kind", "rule", "attack", "frac", "metric", "runs", "mean", "Δ vs no attack [CI]"):
        table.add_column(col, justify="right" if col in ("frac", "runs", "mean") else "left")
    for r in rows:
        ci = (f"{_fmt(r.loss, True)} [{_fmt(r.low, True)}, {_fmt(r.high, True)}]"
              if math.isfinite(r.loss) else "–")
        table.add_row(r.kind, Text(r.rule), Text(r.series), f"{r.frac:g}", r.metric, str(r.runs),
                      _fmt(r.value), ci)
    console.print(table)
