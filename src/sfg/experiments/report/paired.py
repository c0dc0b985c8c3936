"""Report of a finished grid: rule table, comparisons CSV and PNG plots (docs/concepts/statistics.md#paired-statistics).

:func:`build_report` reads run records (one dict per finished run, as the results store
hands them out), runs the paired comparisons of :mod:`sfg.experiments.stats` and writes into ``out_dir``:

* ``report.md`` — one row per rule: runs, mean and p10 accuracy (means over runs, in %), gain
  over the baseline with its interval (in percentage points when the metric is an accuracy),
  wins, cells with a positive mean gain, permutation p (raw and Holm), Wilcoxon p (raw and
  Holm), verdict, local steps relative to DFedAvg; then the method;
* ``comparisons.csv`` — :func:`sfg.experiments.stats.comparisons_to_csv` (raw fractions, for scripts);
* ``gains.png``, ``gains_by_process.png``, ``gains_by_quartile.png`` — paired gains with
  stratified intervals, overall / per outage process / per availability quartile
  (``acc_q1`` = least available clients);
* ``accuracy_over_rounds.png`` — ``curves["acc_mean"]`` averaged over seeds per rule, one
  panel per (dataset, process);
* ``sensitivity.png`` and a second Markdown table — design sensitivity (processes with a
  positive mean, the leave-one-process-out range, the mean without i.i.d. outages), the share
  of the outage gap closed (overall and per process, when the grid has a ``none`` process)
  and the per-availability-quartile gains (docs/concepts/statistics.md#report-additions, :func:`sfg.experiments.stats.design_sensitivity`);
* ``diagnostics/`` — tables and plots of the training diagnostics of runs that recorded them
  (docs/concepts/diagnostics.md#training-diagnostics, :mod:`sfg.experiments.report.diagnostics`), linked from a section of ``report.md``;
* for runs on the virtual clock (docs/concepts/clock.md#metrics, :mod:`sfg.experiments.report.clock`): a
  time-to-accuracy table (``time_to_accuracy.csv``), a table of the clock's counts per
  device-hour (``clock_rates.csv``) and ``accuracy_over_time.png`` (accuracy over virtual
  hours, one panel per clock setting); ``accuracy_over_rounds.png`` then shows the
  round-based runs only.

**Settings.** Runs are paired and compared within their setting
(:func:`sfg.experiments.stats.setting_labels`: a clock run's protocol and clock settings, an
override that tells runs of one cell apart such as ``local_steps 3``): every table and plot
then has one row, marker or line per (setting, rule), and the tables a ``setting`` column
(round-based runs without such overrides have none, and the report looks as it always did).

Units and titles (:mod:`sfg.util.units`): tables and plots show accuracies in % and their
differences in percentage points (pp); every plot is titled with what it shows (metric,
baseline) and the data it shows it on (datasets, processes, seeds of the records plotted).

A plot that has nothing to show (no comparisons, no quartile metrics, no curves) is not
written; the reason goes into ``Report.notes`` and the Markdown. :func:`print_report` renders
the same table in the terminal with rich.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from sfg.errors import SfgError, check
from sfg.experiments.report import clock as _clock
from sfg.experiments.report.figures import save_png
from sfg.experiments.stats import (
    Comparison,
    Interval,
    RunValue,
    compare,
    comparisons_to_csv,
    pair_values,
    run_values,
    stratified_interval,
    with_settings,
)
from sfg.util.units import (
    context_of,
    gain_unit,
    metric_label,
    percent,
    points,
    scale,
    title,
    with_unit,
)

QUARTILE_METRICS = ("acc_q1", "acc_q2", "acc_q3", "acc_q4")
GAIN_COLUMN = "gain (pp) [CI]"  # an accuracy metric; other metrics: "gain [CI]"
TABLE_COLUMNS = ("rule", "runs", "mean acc (%)", "p10 acc (%)", GAIN_COLUMN, "wins", "+ cells",
                 "p perm", "p perm Holm", "p Wilcoxon", "p Wilcoxon Holm", "verdict",
                 "local steps ×DFedAvg")
PLOT_FILES = ("gains.png", "gains_by_process.png", "gains_by_quartile.png",
              "accuracy_over_rounds.png", "sensitivity.png")
SENSITIVITY_COLUMNS = ("rule", "processes +", "leave-one-process-out (pp)",
                       "mean w/o iid, pp (p)", "gap closed", "gap closed per process",
                       "gain q1 (pp)", "gain q2 (pp)", "gain q3 (pp)", "gain q4 (pp)")


def gain_column(metric: str) -> str:
    """Header of the gain column: "gain (pp) [CI]" for an accuracy, "gain [CI]" otherwise."""
    return with_unit("gain", gain_unit(metric)) + " [CI]"


def _with_setting(columns: tuple[str, ...], settings: bool) -> tuple[str, ...]:
    return (columns[0], "setting", *columns[1:]) if settings else columns


def table_columns(metric: str, *, settings: bool = False) -> tuple[str, ...]:
    """:data:`TABLE_COLUMNS` with the gain column in the unit of ``metric`` (and a ``setting``
    column after the rule when the runs have settings)."""
    return _with_setting(tuple(gain_column(metric) if c == GAIN_COLUMN else c
                               for c in TABLE_COLUMNS), settings)


def sensitivity_columns(metric: str, *, settings: bool = False) -> tuple[str, ...]:
    """:data:`SENSITIVITY_COLUMNS` with the pooled-gain columns in the unit of ``metric``
    (the quartile gains are accuracies whatever the metric)."""
    if gain_unit(metric):
        return _with_setting(SENSITIVITY_COLUMNS, settings)
    return _with_setting(tuple({"leave-one-process-out (pp)": "leave-one-process-out",
                                "mean w/o iid, pp (p)": "mean w/o iid (p)"}.get(c, c)
                               for c in SENSITIVITY_COLUMNS), settings)


def label(rule: str, setting: str) -> str:
    """A (setting, rule) as plots name it: ``sfg-cut · async, jitter 0.5``; the rule alone
    without a setting."""
    return f"{rule} · {setting}" if setting else rule


def _tick(c: Comparison, extra: str) -> str:
    """A y tick of a per-comparison plot: ``rule (extra)``, the setting wrapped below it."""
    return "\n".join([f"{c.rule} ({extra})", *textwrap.wrap(c.setting, 40)])


def _tick_lines(comps: Sequence[Comparison]) -> int:
    return max([1 + len(textwrap.wrap(c.setting, 40)) for c in comps], default=1)


@dataclass(frozen=True)
class RuleRow:
    """One row of the rule table; ``comparison`` is None for the baseline."""

    rule: str
    runs: int
    acc_mean: float  # mean over runs of metrics["acc_mean"] (NaN if absent), a fraction
    acc_p10: float
    local_steps_rel: float
    comparison: Comparison | None
    setting: str = ""  # what its runs were run under (sfg.experiments.stats.setting_labels)


@dataclass
class Report:
    """What :func:`build_report` computed and wrote."""

    out_dir: Path
    baseline: str
    metric: str
    confidence: float
    rows: list[RuleRow]
    comparisons: list[Comparison]
    markdown: str
    files: dict[str, Path] = field(default_factory=dict)  # file name -> path written
    notes: list[str] = field(default_factory=list)
    # pooled training diagnostics per (dataset, process, rule) (docs/concepts/diagnostics.md#training-diagnostics), when runs have them
    diagnostics: dict = field(default_factory=dict)
    # the data compared, for titles: "dataset digits · processes none, … · seeds 1–8"
    context: str = ""
    # time to accuracy, the clock's counts and accuracy over virtual hours (docs/concepts/clock.md#metrics), when
    # runs are on the virtual clock
    clock: _clock.ClockReport | None = None

    @property
    def settings(self) -> bool:
        """Whether the runs have settings (the tables then show a ``setting`` column)."""
        return any(row.setting for row in self.rows)


# --------------------------------------------------------------------------- formatting


def _num(x: float, digits: int = 4) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _p(x: float) -> str:
    if math.isnan(x):
        return "—"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3g}"


def _gain_text(c: Comparison) -> str:
    """Gain and interval in the shown unit of the metric (pp for accuracies)."""
    if math.isnan(c.mean_gain):
        return "— (no paired runs)"
    g = points(c.mean_gain, metric=c.metric)
    if math.isnan(c.ci_low):
        return f"{g} [undefined, df={c.df}]"
    return f"{g} [{points(c.ci_low, metric=c.metric)}, {points(c.ci_high, metric=c.metric)}]"


def row_cells(row: RuleRow, *, settings: bool = False) -> list[str]:
    """The table cells of ``row`` in :data:`TABLE_COLUMNS` order (Markdown and terminal):
    accuracies in %, the gain in pp when the metric is an accuracy; ``settings``: the
    setting after the rule (:func:`table_columns`)."""
    head = [row.rule, *([row.setting or "rounds"] if settings else []), str(row.runs),
            percent(row.acc_mean), percent(row.acc_p10)]
    c = row.comparison
    if c is None:
        tail = ["baseline", "—", "—", "—", "—", "—", "—", "—"]
    else:
        tail = [_gain_text(c), f"{c.wins}/{c.runs}", f"{c.positive_cells}/{c.cells}",
                _p(c.p_perm), _p(c.p_perm_holm), _p(c.p_wilcoxon), _p(c.p_wilcoxon_holm),
                c.verdict]
    return head + tail + [_num(row.local_steps_rel, 3)]


def sensitivity_cells(c: Comparison, *, settings: bool = False) -> list[str]:
    """The cells of ``c`` in :data:`SENSITIVITY_COLUMNS` order (gains in pp for accuracies;
    ``settings``: the setting after the rule)."""
    m = c.metric
    loo = ("—" if math.isnan(c.loo_min)
           else f"[{points(c.loo_min, metric=m)}, {points(c.loo_max, metric=m)}]")
    shares = json.loads(c.gap_closed_by_process)
    per = "; ".join(f"{p}: {_share(v)}" for p, v in shares.items()) or "— (no none process)"
    return [c.rule, *([c.setting or "rounds"] if settings else []),
            f"{c.positive_processes}/{c.processes}", loo,
            f"{points(c.mean_no_iid, metric=m)} ({_p(c.p_no_iid)})", _share(c.gap_closed), per,
            *(points(g) for g in (c.gain_q1, c.gain_q2, c.gain_q3, c.gain_q4))]


def _share(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:.0f} %"


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table: header, rule, one line per row (``|`` in cells escaped)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for cells in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return lines


# --------------------------------------------------------------------------- summaries


def _mean_metric(records: Sequence[Mapping[str, Any]], key: str) -> float:
    """Mean over runs of ``metrics[key]``, ignoring runs where it is absent or non-finite."""
    vals = []
    for r in records:
        v = r["metrics"].get(key)
        if v is None:
            continue
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise SfgError(f"run {r.get('run_id', '?')} has non-numeric {key!r} = {v!r}; "
                           "metrics must be numbers") from None
        if math.isfinite(v):
            vals.append(v)
    return float(np.mean(vals)) if vals else math.nan


def _gain(values: Sequence[RunValue], *, rule: str, baseline: str, confidence: float,
          weighting: str, setting: str = "") -> Interval:
    pd = pair_values(values, rule=rule, baseline=baseline, setting=setting)
    return stratified_interval(pd.unit_diffs, pd.unit_strata, confidence=confidence,
                               weighting=weighting)


# --------------------------------------------------------------------------- plots


def _errorbars(ivs: Sequence[Interval], factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Means [k] and asymmetric error bars [2, k] (0 where the interval is undefined), times
    ``factor`` (100: accuracy differences in percentage points)."""
    mean = factor * np.array([iv.mean for iv in ivs], dtype=np.float64)
    low = factor * np.array([iv.low for iv in ivs], dtype=np.float64)
    high = factor * np.array([iv.high for iv in ivs], dtype=np.float64)
    err = np.nan_to_num(np.stack([mean - low, high - mean]), nan=0.0)
    return mean, err


def _plot_gains(comps: Sequence[Comparison], path: Path, *, baseline: str, metric: str,
                confidence: float, where: str) -> Path:
    fig = Figure(figsize=(7.0, 1.9 + 0.45 * len(comps) * _tick_lines(comps)))
    ax = fig.add_subplot()
    y = np.arange(len(comps))[::-1]
    ivs = [Interval(c.mean_gain, c.ci_low, c.ci_high, math.nan, c.df, c.units) for c in comps]
    f = scale(metric)
    mean, err = _errorbars(ivs, f)
    ax.errorbar(mean, y, xerr=err, fmt="o", capsize=4, color="tab:blue")
    for yi, c in zip(y, comps, strict=True):
        if math.isnan(c.ci_low) and not math.isnan(c.mean_gain):
            ax.annotate("interval undefined", (f * c.mean_gain, yi), textcoords="offset points",
                        xytext=(6, 4), fontsize=8, color="gray")
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(y, [_tick(c, c.verdict) for c in comps])
    ax.set_ylim(-0.7, len(comps) - 0.3)
    ax.set_xlabel(with_unit(f"gain in {metric} over {baseline}", gain_unit(metric)))
    ax.set_title(title(f"Paired gain in {metric_label(metric)} over {baseline} "
                       f"({confidence:.0%} stratified interval)", where, width=80), fontsize=9)
    fig.tight_layout()
    return save_png(fig, path)


def _plot_grouped(groups: Sequence[str], series: Mapping[str, Sequence[Interval]], path: Path,
                  *, xlabel: str, ylabel: str, what: str, where: str, connect: bool,
                  factor: float = 1.0) -> Path:
    """Per-group gains with intervals, one marker series per rule, offset within a group;
    values times ``factor`` (100: accuracy differences in percentage points); titled
    ``what`` over ``where`` (the data)."""
    width_in = max(6.5, 1.3 * len(groups) + 2.5)
    fig = Figure(figsize=(width_in, 4.6))
    ax = fig.add_subplot()
    x = np.arange(len(groups), dtype=np.float64)
    width = 0.6 / max(len(series), 1)
    for k, (rule, ivs) in enumerate(series.items()):
        mean, err = _errorbars(ivs, factor)
        offset = (k - (len(series) - 1) / 2) * width
        ax.errorbar(x + offset, mean, yerr=err, fmt="o-" if connect else "o",
                    capsize=3, label=rule)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(x, list(groups), rotation=20 if len(groups) > 4 else 0, ha="right"
                  if len(groups) > 4 else "center")
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title(what, where, width=int(14 * width_in)), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)


def _curve(record: Mapping[str, Any], index: int) -> tuple[np.ndarray, np.ndarray] | None:
    curves = record.get("curves")
    if curves is None:
        return None
    where = f"record {index}" + (f" (run_id {record['run_id']})" if record.get("run_id") else "")
    check(isinstance(curves, Mapping) and "round" in curves and "acc_mean" in curves,
          f"{where} has curves without 'round' and 'acc_mean'; store both lists or neither")
    try:
        rounds = np.asarray(curves["round"], dtype=np.int64)
        acc = np.asarray(curves["acc_mean"], dtype=np.float64)
    except (TypeError, ValueError):
        raise SfgError(f"{where} has non-numeric curves; 'round' and 'acc_mean' must be "
                       "lists of numbers") from None
    check(rounds.ndim == 1 and rounds.shape == acc.shape,
          f"{where} has {rounds.size} rounds but {acc.size} acc_mean values; they must match")
    check(bool(np.all(np.diff(rounds) > 0)),
          f"{where} has curve rounds that are not strictly increasing; store each round once")
    return rounds, acc


def _mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over runs [R] on the rounds that every run recorded (rounds strictly increasing)."""
    common = curves[0][0]
    for rounds, _ in curves[1:]:
        common = np.intersect1d(common, rounds)
    stacked = np.stack([acc[np.searchsorted(rounds, common)] for rounds, acc in curves])
    return common, stacked.mean(axis=0)


def _plot_curves(records: Sequence[Mapping[str, Any]], rules: Sequence[str],
                 path: Path) -> Path | None:
    grouped: dict[tuple[str, str, str], dict[str, list]] = {}
    plotted = []
    for index, r in enumerate(records):
        if _clock.is_clock(r):  # drawn over virtual hours (accuracy_over_time.png)
            continue
        c = _curve(r, index)
        if c is not None and r["rule"] in rules:
            panel = (r["dataset"], r["process"], str(r.get("setting", "")))
            grouped.setdefault(panel, {}).setdefault(r["rule"], []).append(c)
            plotted.append(r)
    if not grouped:
        return None
    panels = sorted(grouped)
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.4 * nrows + 0.7))
    for k, (dataset, process, setting) in enumerate(panels):
        ax = fig.add_subplot(nrows, cols, k + 1)
        for rule in rules:
            runs = grouped[(dataset, process, setting)].get(rule)
            if runs:
                rounds, acc = _mean_curve(runs)
                ax.plot(rounds, 100 * acc, label=f"{rule} (n={len(runs)})")
        ax.set_title(f"{dataset} · {process}" + (f"\n{setting}" if setting else ""), fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("mean accuracy (%)")
        ax.legend(fontsize=7)
    fig.suptitle(title("Mean accuracy (acc_mean) over rounds, mean over seeds per rule",
                       context_of(plotted), width=40 + 30 * cols), fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def _plot_sensitivity(comps: Sequence[Comparison], path: Path, *, baseline: str,
                      metric: str, where: str) -> Path:
    """Left: pooled gain, leave-one-process-out range and the mean without i.i.d. outages per
    rule. Right: share of the outage gap closed per process (when there is a none process)."""
    fig = Figure(figsize=(11.0, max(4.2, 2.2 + 0.5 * len(comps) * _tick_lines(comps))))
    ax = fig.add_subplot(1, 2, 1)
    y = np.arange(len(comps))[::-1]
    f = scale(metric)
    for yi, c in zip(y, comps, strict=True):
        if not math.isnan(c.loo_min):
            ax.plot([f * c.loo_min, f * c.loo_max], [yi, yi], lw=6, color="tab:blue",
                    alpha=0.35, solid_capstyle="butt",
                    label="leave one process out" if yi == y[0] else None)
        ax.plot([f * c.mean_gain], [yi], "o", color="tab:blue", label="all processes"
                if yi == y[0] else None)
        ax.plot([f * c.mean_no_iid], [yi], "x", color="tab:red", ms=8, label="without i.i.d."
                if yi == y[0] else None)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(y, [_tick(c, f"{c.positive_processes}/{c.processes} +") for c in comps])
    ax.set_ylim(-0.7, len(comps) - 0.3)
    ax.set_xlabel(with_unit(f"pooled gain in {metric} over {baseline}", gain_unit(metric)))
    ax.set_title("design sensitivity", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax2 = fig.add_subplot(1, 2, 2)
    shares = {label(c.rule, c.setting): json.loads(c.gap_closed_by_process) for c in comps}
    procs = sorted({p for d in shares.values() for p in d})
    if procs:
        x = np.arange(len(procs) + 1, dtype=np.float64)
        width = 0.8 / len(comps)
        for k, c in enumerate(comps):
            name = label(c.rule, c.setting)
            vals = [shares[name].get(p, math.nan) for p in procs] + [c.gap_closed]
            ax2.bar(x + (k - (len(comps) - 1) / 2) * width, np.nan_to_num(np.array(
                vals, dtype=np.float64) * 100, nan=0.0), width, label=name)
        ax2.set_xticks(x, [*procs, "overall"], rotation=20, ha="right")
        ax2.axhline(0.0, color="black", lw=0.8)
        ax2.set_ylabel("gap closed (%)")
        ax2.legend(fontsize=7)
    else:
        ax2.text(0.5, 0.5, "share of the outage gap: needs runs\nof the 'none' process",
                 ha="center", va="center", transform=ax2.transAxes, color="gray")
        ax2.set_axis_off()
    ax2.set_title(f"outage gap closed (gap = {baseline} without − with outages)", fontsize=10)
    fig.suptitle(title(f"Design sensitivity and outage gap: {metric_label(metric)} against "
                       f"{baseline}", where), fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


# --------------------------------------------------------------------------- report


def _markdown(report: Report) -> str:
    lines = [f"# sfg report — {report.metric} against {report.baseline}", ""]
    if report.context:
        lines += [f"{report.context}; accuracies in %, gains in percentage points (pp).", ""]
    settings = report.settings
    columns = table_columns(report.metric, settings=settings)
    lines += markdown_table(columns, (row_cells(row, settings=settings) for row in report.rows))
    if settings:
        lines += ["", "Setting: what the runs were run under besides the grid's axes (on the "
                  "virtual clock: the protocol and every clock setting away from its default; "
                  "\"rounds\": synchronous rounds); runs are paired only within one setting."]
    if report.comparisons:
        scolumns = sensitivity_columns(report.metric, settings=settings)
        lines += ["", "## Design sensitivity, outage gap, availability quartiles (docs/concepts/statistics.md#report-additions)",
                  ""]
        lines += markdown_table(scolumns, (sensitivity_cells(c, settings=settings)
                                           for c in report.comparisons))
        lines += ["", "Processes +: processes with a positive pooled mean gain. "
                  "Leave-one-process-out: range of the pooled mean over the designs without one "
                  "process. Mean w/o iid: pooled mean without i.i.d. outages (uncorrected exact "
                  "sign-flip p). Gap closed: pooled gain ÷ pooled (baseline without outages − "
                  "baseline with them), same (dataset, seed). Gain q1…q4: gains of the "
                  "per-availability-quartile mean accuracy (q1 least available)."]
    if report.clock is not None:
        lines += _clock.markdown(report.clock, baseline=report.baseline,
                                 confidence=report.confidence)
    lines += ["", "## Method (docs/concepts/statistics.md#paired-statistics)", ""]
    if report.comparisons:
        c0 = report.comparisons[0]
        lines += [
            f"* Gain = paired difference in `{report.metric}` (rule − {report.baseline}) per "
            "(dataset, process, seed), averaged over processes per (dataset, seed) unit"
            + ("; shown in percentage points (100 × the difference of accuracy fractions; "
               "`comparisons.csv` keeps the fractions)." if gain_unit(report.metric) else "."),
            f"* Interval: stratified t-interval, {report.confidence:.0%}, variance pooled "
            f"within datasets, df = units − datasets; weighting `{c0.weighting}` "
            "(`unit`: every unit weighs the same).",
            f"* Primary test: two-sided sign-flip permutation over units ({c0.permutation}); "
            f"Holm over the {len(report.comparisons)} comparisons of this report.",
            "* Secondary test: Wilcoxon signed-rank on (dataset × process) cell means.",
            f"* Verdict: interval and Holm-corrected permutation test at α = {c0.alpha}; "
            "\"unresolved\" where they disagree or the interval is undefined.",
            "* Wins: paired runs with an improvement; + cells: cells with a mean improvement.",
        ]
        if report.settings:
            lines.append("* One comparison per (setting, rule): runs are paired only within "
                         "one setting; Holm runs over all of them.")
        for c in report.comparisons:
            lines.append(f"* {label(c.rule, c.setting)}: {c.units} units over {c.datasets} "
                         f"dataset(s), {c.runs} paired runs, {c.dropped} unpaired run(s) "
                         "dropped.")
    else:
        lines.append("* No comparisons: the records hold only the baseline.")
    lines += ["", "## Plots", ""]
    for name in (*PLOT_FILES, *_clock.CLOCK_PLOT_FILES):
        if name in report.files:
            lines.append(f"![{name}]({name})")
    if report.diagnostics:
        lines += ["", "## Training diagnostics (docs/concepts/diagnostics.md#training-diagnostics)", "",
                  "Lag law: E d²/E d₀² = 1 + (ρ/2)·x fitted over differences 1–20, pooled over "
                  "seeds; tables in `diagnostics/*.csv`.", "",
                  "| dataset | process | rule | runs | ρ (ages) | ρ (lags) | lag ÷ age |",
                  "|---|---|---|---|---|---|---|"]
        for (dataset, process, rule), g in report.diagnostics.items():
            if "lag" in g:
                lag = g["lag"]
                lines.append(f"| {dataset} | {process} | {rule} | {g['runs']} | "
                             f"{_num(lag['rho_age'])} | {_num(lag['rho_lag'])} | "
                             f"{_num(lag['rho_ratio'], 2)} |")
        lines.append("")
        for name in sorted(report.files):
            if name.startswith("diagnostics/") and name.endswith(".png"):
                lines.append(f"![{name}]({name})")
    for note in report.notes:
        lines.append(f"* Note: {note}")
    return "\n".join(lines) + "\n"


def build_report(records: Iterable[Mapping[str, Any]], *, baseline: str = "dfedavg",
                 out_dir: str | Path, metric: str = "acc_mean",
                 rules: Sequence[str] | None = None, alpha: float = 0.05,
                 confidence: float = 0.95, weighting: str = "unit", seed: int = 0) -> Report:
    """Compare rules with ``baseline`` and write the report files into ``out_dir`` (docs/concepts/statistics.md#paired-statistics).

    ``rules`` default: every rule in the records except the baseline. Raises
    :class:`SfgError` on malformed records, an unknown baseline/rule or an unwritable
    ``out_dir``.
    """
    records = list(records)
    check(len(records) > 0, "no run records to report; run a grid first")
    records = with_settings(records)
    comps = compare(records, rules=rules, baseline=baseline, metric=metric, alpha=alpha,
                    confidence=confidence, weighting=weighting, seed=seed)
    out = report_folder(out_dir)

    comp_of = {(c.setting, c.rule): c for c in comps}
    compared = {c.rule for c in comps}
    rows: list[RuleRow] = []
    for setting in dict.fromkeys(r["setting"] for r in records):
        here = [r for r in records if r["setting"] == setting]
        shown = [baseline] + [c.rule for c in comps if c.setting == setting]
        for rule in shown:
            mine = [r for r in here if r["rule"] == rule]
            if mine:
                rows.append(RuleRow(rule=rule, runs=len(mine),
                                    acc_mean=_mean_metric(mine, "acc_mean"),
                                    acc_p10=_mean_metric(mine, "acc_p10"),
                                    local_steps_rel=_mean_metric(mine, "local_steps_rel"),
                                    comparison=comp_of.get((setting, rule)), setting=setting))
    report = Report(out_dir=out, baseline=baseline, metric=metric, confidence=confidence,
                    rows=rows, comparisons=comps, markdown="",
                    context=context_of(r for r in records
                                       if r["rule"] == baseline or r["rule"] in compared))
    report.files["comparisons.csv"] = comparisons_to_csv(comps, out / "comparisons.csv")
    _write_plots(report, records, weighting=weighting)
    ordered = list(dict.fromkeys(c.rule for c in comps))
    report.clock = _clock.clock_report(records, baseline=baseline, rules=ordered, out_dir=out,
                                       alpha=alpha, confidence=confidence, weighting=weighting,
                                       seed=seed)
    if report.clock is not None:
        report.files.update(report.clock.files)
        report.notes.extend(report.clock.notes)
    if any(isinstance(r.get("diagnostics"), Mapping) for r in records):
        from sfg.experiments.report.diagnostics import pooled, write_diagnostics

        report.diagnostics = pooled(records)
        for name, path in write_diagnostics(records, out / "diagnostics").items():
            report.files[f"diagnostics/{name}"] = path
    report.markdown = _markdown(report)
    report.files["report.md"] = write_markdown(out / "report.md", report.markdown)
    return report


def report_folder(out_dir: str | Path) -> Path:
    """The report's output folder, created if needed; a failure is one :class:`SfgError` line."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SfgError(f"cannot create report folder {out}: {exc.strerror}; choose a "
                       "writable out_dir") from None
    return out


def write_markdown(path: Path, text: str) -> Path:
    """Write a report's markdown page; a failure is one :class:`SfgError` line."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise SfgError(f"cannot write {path}: {exc.strerror}") from None
    return path


def _write_plots(report: Report, records: Sequence[Mapping[str, Any]], *,
                 weighting: str) -> None:
    out, comps, conf = report.out_dir, report.comparisons, report.confidence
    rules = list(dict.fromkeys(c.rule for c in comps))
    kw: dict[str, Any] = dict(baseline=report.baseline, confidence=conf, weighting=weighting)
    metric, where = report.metric, report.context
    if comps:
        report.files["gains.png"] = _plot_gains(comps, out / "gains.png",
                                                baseline=report.baseline,
                                                metric=metric, confidence=conf, where=where)
        values = run_values(records, metric)
        processes = sorted({v.process for v in values})
        series = {label(c.rule, c.setting): [
            _gain([v for v in values if v.process == p], rule=c.rule, setting=c.setting, **kw)
            for p in processes] for c in comps}
        report.files["gains_by_process.png"] = _plot_grouped(
            processes, series, out / "gains_by_process.png", xlabel="outage process",
            ylabel=with_unit(f"gain in {metric}", gain_unit(metric)),
            what=f"Paired gain in {metric_label(metric)} over {report.baseline} per outage "
                 f"process, {conf:.0%} CI", where=where,
            connect=False, factor=scale(metric))
        involved = [r for r in records if r["rule"] in (*rules, report.baseline)]
        if all(isinstance(r.get("metrics"), Mapping) and all(q in r["metrics"]
               for q in QUARTILE_METRICS) for r in involved):
            per_q = [run_values(involved, q) for q in QUARTILE_METRICS]
            series = {label(c.rule, c.setting): [_gain(vals, rule=c.rule, setting=c.setting, **kw)
                                                 for vals in per_q] for c in comps}
            report.files["gains_by_quartile.png"] = _plot_grouped(
                ["q1 (least available)", "q2", "q3", "q4 (most available)"], series,
                out / "gains_by_quartile.png", xlabel="availability quartile",
                ylabel="gain in quartile mean accuracy (pp)",
                what=f"Paired gain in quartile mean accuracy (acc_q1…acc_q4) over "
                     f"{report.baseline}, {conf:.0%} CI", where=where,
                connect=True, factor=100.0)
        else:
            report.notes.append("gains_by_quartile.png not written: some runs lack the "
                                "acc_q1..acc_q4 metrics")
    else:
        report.notes.append("gain plots not written: the records hold only the baseline")
    if comps:
        report.files["sensitivity.png"] = _plot_sensitivity(comps, out / "sensitivity.png",
                                                            baseline=report.baseline,
                                                            metric=metric, where=where)
    curves = _plot_curves(records, [report.baseline, *rules], out / "accuracy_over_rounds.png")
    if curves is None and any(_clock.is_clock(r) for r in records):
        if not all(_clock.is_clock(r) for r in records):
            report.notes.append("accuracy_over_rounds.png not written: no round-based run has "
                                "curves (clock runs: accuracy_over_time.png)")
    elif curves is None:
        report.notes.append("accuracy_over_rounds.png not written: no run has curves")
    else:
        report.files["accuracy_over_rounds.png"] = curves


TERMINAL_COLUMNS = ("rule", "runs", "acc (%)", "p10 (%)", GAIN_COLUMN, "wins", "+cells",
                    "p perm (Holm)", "p Wilc. (Holm)", "verdict", "steps ×DFedAvg")


def terminal_cells(row: RuleRow, *, settings: bool = False) -> list[str]:
    """Compact cells of ``row`` in :data:`TERMINAL_COLUMNS` order (one value per line;
    ``settings``: the setting after the rule)."""
    cells = row_cells(row)
    c = row.comparison
    mid = [row.setting or "rounds"] if settings else []
    if c is None:
        return cells[:1] + mid + cells[1:4] + ["baseline", "—", "—", "—", "—", "—", cells[-1]]
    gain = _gain_text(c).replace(" [", "\n[", 1).replace(", ", ",\n")
    return cells[:1] + mid + cells[1:4] + [gain, cells[5], cells[6],
                                           f"{cells[7]}\n({cells[8]})",
                                           f"{cells[9]}\n({cells[10]})", c.verdict, cells[-1]]


def print_report(report: Report, *, console: Any = None) -> None:
    """Render the rule table and notes of ``report`` in the terminal with rich.

    Cells fold rather than being cut off when the terminal is narrow.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    unit = "; gains in percentage points" if gain_unit(report.metric) else ""
    where = f"\n{report.context}" if report.context else ""
    table = Table(title=f"{report.metric} against {report.baseline} "
                        f"({report.confidence:.0%} intervals; Holm-corrected p in brackets"
                        f"{unit}){where}",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    for name in _with_setting(TERMINAL_COLUMNS, report.settings):
        text = name in ("rule", "setting", "verdict", GAIN_COLUMN)
        name = gain_column(report.metric) if name == GAIN_COLUMN else name
        table.add_column(name, justify="left" if text else "right", overflow="fold",
                         no_wrap=name == "rule")
    for row in report.rows:
        table.add_row(*terminal_cells(row, settings=report.settings))
    console.print(table)
    if report.clock is not None:
        _clock.print_clock(report.clock, console=console)
    for c in report.comparisons:
        if c.dropped:
            console.print(f"{label(c.rule, c.setting)}: {c.dropped} unpaired run(s) dropped")
    for note in report.notes:
        console.print(f"note: {note}")
    # which files were written is said once, by the caller (sfg report: "wrote ...")
