"""The virtual clock in ``sfg report`` (docs/concepts/clock.md#metrics): time-to-accuracy, the clock's counts per
device-hour, and accuracy over virtual hours.

Runs on the clock (config ``clock: virtual``) are compared within their *setting*
(:func:`sfg.experiments.stats.setting_labels`: the protocol and every clock setting away from
its default, ``"async, jitter 0.5, compute lognormal:median=30,sigma=1"``), so an ``async``
run is never paired with a ``lockstep`` one. :func:`clock_report` adds, for the training runs
among them:

* **time to accuracy** — a run's ``time_to_accuracy_h`` (hours of virtual time until the
  mean accuracy first reaches ``target_accuracy``; NaN with ``reached_target`` 0 when it never
  does). A ``lockstep`` run that does not store it gets it from its ``round`` curve: the first
  evaluated round r whose ``acc_mean`` reaches the target, at r·Δ (``round_seconds``) ÷ 3600
  hours — round r ends at rΔ, as an async or event run evaluates at multiples of
  ``eval_seconds``. Paired differences rule − baseline (hours; negative = faster) go through
  :func:`sfg.experiments.stats.compare` (docs/concepts/statistics.md#paired-statistics: stratified interval over (dataset, seed)
  units, exact sign-flip test, Wilcoxon on cells, Holm over the time comparisons of the
  report, verdicts with "better" = faster) over the pairs where *both* runs reached the target;
  the pairs where one or both never did are counted per kind (rule only, baseline only, both),
  never given a number. ``time_to_accuracy.csv`` keeps every figure for scripts.
* **the clock's counts** — per (dataset, process, setting), means over seeds: local rounds,
  messages sent, messages delivered, megabytes sent and compute-seconds per device-hour (the
  run's ``*_per_device_hour``, :mod:`sfg.metrics`; where a run reports the count only — a
  lockstep run, a swarm's nodes — the count per the run's N·T·Δ/3600 device-hours, and
  delivered its ``messages``), and the counts of lost
  messages (``lost`` and every ``lost_*``), late messages (lockstep), skipped wakes (async),
  interrupted local rounds (async, event) and stragglers (lockstep) — "—" where the protocol
  has no such count. Rules share one row when their means are equal (the schedule does not
  depend on the rule, docs/concepts/clock.md#pairing-and-the-schedule-digest); a rule that changes compute (``+catchup``) gets its own.
  ``clock_rates.csv`` keeps the raw means.
* ``accuracy_over_time.png`` — mean accuracy (% , mean over seeds per rule) over virtual
  hours (the ``hours`` curve; lockstep's ``round`` curve at r·Δ), one panel per
  (dataset, process, setting), a row of panels per (dataset, process), the settings in the
  order they first appear, shared axes, the target drawn where a curve reaches it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError, check
from sfg.experiments.stats import Comparison, compare
from sfg.util.units import context_of, title

TTA = "time_to_accuracy_h"
CLOCK_PLOT_FILES = ("accuracy_over_time.png",)
CLOCK_CSV_FILES = ("time_to_accuracy.csv", "clock_rates.csv")
TIME_COLUMNS = ("setting", "rule", "target (%)", "runs", "reached", "time to target (h)",
                "Δ time (h) [CI]", "pairs both reached", "dropped: never reached",
                "wins (faster)", "p perm", "p perm Holm", "p Wilcoxon", "p Wilcoxon Holm",
                "verdict")
RATE_COLUMNS = ("dataset", "process", "setting", "rules", "runs", "local rounds /dev-h",
                "messages sent /dev-h", "delivered /dev-h", "MB sent /dev-h",
                "compute-s /dev-h", "lost", "late", "skipped", "interrupted", "stragglers",
                "returns heard", "pull requests /dev-h", "pull replies /dev-h",
                "pull unreachable /dev-h", "pull MB /dev-h", "pull wait-s /dev-h")
# (name, the run's rate metric, the count it is derived from when the rate is absent)
RATES = (("local_rounds", "local_rounds_per_device_hour", "local_rounds"),
         ("messages_sent", "messages_sent_per_device_hour", "messages_sent"),
         ("delivered", "delivered_per_device_hour", "messages"),
         ("bytes", "bytes_per_device_hour", "bytes"),
         ("compute_seconds", "compute_seconds_per_device_hour", "compute_seconds"),
         # on_return pull (docs/concepts/clock.md#returns-in-time); none: NaN
         ("pull_requests", "pull_requests_per_device_hour", "pull_requests"),
         ("pull_replies", "pull_replies_per_device_hour", "pull_replies"),
         ("pull_unreachable", "pull_unreachable_per_device_hour", "pull_unreachable"),
         ("pull_bytes", "pull_bytes_per_device_hour", "pull_bytes"),
         ("pull_wait_seconds", "pull_wait_seconds_per_device_hour", "pull_wait_seconds"))
# "returns_heard": the share of returns in time whose first aggregation held a neighbour's
# model (returns_heard / returns_aggregated; async and event)
COUNTS = ("lost", "late", "skipped", "interrupted", "stragglers", "returns_heard")
# the clock's lost messages (lockstep: lost; async and event: by cause)
LOST = ("lost", "lost_sender", "lost_receiver", "lost_random", "lost_link")


def is_clock(record: Mapping[str, Any]) -> bool:
    """Whether a run record is a run on the virtual clock (its config, or an ``hours`` curve)."""
    cfg = record.get("config")
    if isinstance(cfg, Mapping) and cfg.get("clock") == "virtual":
        return True
    curves = record.get("curves")
    return isinstance(curves, Mapping) and "hours" in curves


def _config(record: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = record.get("config")
    return cfg if isinstance(cfg, Mapping) else {}


def _where(record: Mapping[str, Any]) -> str:
    rid = record.get("run_id")
    return "run" + (f" {rid}" if rid else f" {record.get('rule')} seed {record.get('seed')}")


def _delta(record: Mapping[str, Any]) -> float:
    return float(_config(record).get("round_seconds", 600.0))


def _target(record: Mapping[str, Any]) -> float:
    return float(_config(record).get("target_accuracy", 0.8))


def hours_curve(record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(hours [S], acc_mean [S])`` of a clock run: its ``hours`` curve, or its ``round``
    curve at r·Δ/3600 (lockstep); None without curves. Malformed curves raise :class:`SfgError`."""
    curves = record.get("curves")
    if not isinstance(curves, Mapping) or not curves:
        return None
    key = "hours" if "hours" in curves else "round"
    check(key in curves and "acc_mean" in curves,
          f"{_where(record)} has curves without 'hours' (or 'round') and 'acc_mean'; a run on "
          "the virtual clock stores both")
    try:
        x = np.asarray(curves[key], dtype=np.float64)
        acc = np.asarray(curves["acc_mean"], dtype=np.float64)
    except (TypeError, ValueError):
        raise SfgError(f"{_where(record)} has non-numeric curves; {key!r} and 'acc_mean' must "
                       "be lists of numbers") from None
    check(x.ndim == 1 and x.shape == acc.shape,
          f"{_where(record)} has {x.size} {key} values but {acc.size} acc_mean values; they "
          "must match")
    check(bool(np.all(np.diff(x) > 0)),
          f"{_where(record)} has a {key} curve that is not strictly increasing")
    return (x if key == "hours" else x * _delta(record) / 3600.0), acc


def time_to_target(record: Mapping[str, Any]) -> tuple[float, str] | None:
    """``(hours, source)`` until the run's mean accuracy first reaches its target — NaN when it
    never does; source ``"metric"`` (``time_to_accuracy_h``) or ``"round curve"`` (lockstep,
    see the module docstring); None when the run has neither."""
    metrics = record.get("metrics")
    if isinstance(metrics, Mapping) and TTA in metrics:
        raw = metrics[TTA]
        try:
            v = math.nan if raw is None else float(raw)
        except (TypeError, ValueError):
            raise SfgError(f"{_where(record)} has non-numeric {TTA!r} = {raw!r}; metrics must "
                           "be numbers") from None
        if metrics.get("reached_target") == 0:
            v = math.nan
        return (v if math.isfinite(v) else math.nan), "metric"
    curves = record.get("curves")
    if not isinstance(curves, Mapping) or "round" not in curves:
        return None
    got = hours_curve(record)
    if got is None:
        return None
    hours, acc = got
    hit = np.flatnonzero(acc >= _target(record))
    return (float(hours[hit[0]]) if hit.size else math.nan), "round curve"


# ------------------------------------------------------------------------ time to accuracy


@dataclass(frozen=True)
class TimeRow:
    """One (setting, rule) row of the time-to-accuracy table; ``comparison`` None = baseline."""

    setting: str
    rule: str
    target: float  # the target accuracy (a fraction)
    runs: int
    reached: int  # runs that reached the target
    mean_h: float  # mean over the runs that reached it (NaN: none did)
    comparison: Comparison | None
    pairs: int = 0  # (dataset, process, seed) cells with a run of both rules
    both_reached: int = 0
    rule_never: int = 0  # the rule never reached the target, the baseline did
    baseline_never: int = 0  # the baseline never did, the rule did
    neither: int = 0
    unpaired: int = 0  # runs of either rule without a partner
    source: str = "metric"  # "metric", "round curve" or both joined with " + "

    @property
    def dropped_never(self) -> int:
        """Pairs left out because one or both runs never reached the target."""
        return self.rule_never + self.baseline_never + self.neither


CSV_TIME_COLUMNS = (
    "setting", "rule", "baseline", "target", "runs", "reached", "mean_h", "pairs",
    "both_reached", "rule_never", "baseline_never", "neither", "unpaired", "mean_diff_h",
    "ci_low_h", "ci_high_h", "df", "units", "wins", "p_perm", "p_perm_holm", "p_wilcoxon",
    "p_wilcoxon_holm", "verdict", "source")


def time_records(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The clock training runs that have a time to target, as records whose metrics hold
    ``time_to_accuracy_h`` (NaN: never reached) and ``_tta_source``."""
    out = []
    for r in records:
        if not is_clock(r) or _config(r).get("kind", "train") != "train":
            continue
        got = time_to_target(r)
        if got is None:
            continue
        out.append({**r, "metrics": {**(r.get("metrics") or {}), TTA: got[0]},
                    "_tta_source": got[1]})
    return out


def time_rows(records: Sequence[Mapping[str, Any]], *, baseline: str, rules: Sequence[str],
              alpha: float = 0.05, confidence: float = 0.95, weighting: str = "unit",
              seed: int = 0) -> tuple[list[TimeRow], list[Comparison]]:
    """Rows (per setting: the baseline, then each rule) and the paired time comparisons of the
    clock training runs in ``records`` (which carry their ``setting``); ``([], [])`` when the
    baseline has no such run."""
    recs = time_records(records)
    present = {r["rule"] for r in recs}
    if baseline not in present:
        return [], []
    wanted = [rule for rule in rules if rule in present and rule != baseline]
    comps = compare(recs, rules=wanted, baseline=baseline, metric=TTA, alpha=alpha,
                    confidence=confidence, weighting=weighting, seed=seed) if wanted else []
    comp_of = {(c.setting, c.rule): c for c in comps}
    rows = []
    for setting in dict.fromkeys(r["setting"] for r in recs):
        here = [r for r in recs if r["setting"] == setting]
        for rule in [baseline, *wanted]:
            mine = [r for r in here if r["rule"] == rule]
            if not mine or (rule != baseline and (setting, rule) not in comp_of):
                continue
            times = np.array([r["metrics"][TTA] for r in mine], dtype=np.float64)
            ok = np.isfinite(times)
            counts = pair_counts(here, rule, baseline) if rule != baseline else {}
            rows.append(TimeRow(
                setting=setting, rule=rule, target=_target(mine[0]), runs=len(mine),
                reached=int(ok.sum()), mean_h=float(times[ok].mean()) if ok.any() else math.nan,
                comparison=comp_of.get((setting, rule)),
                source=" + ".join(dict.fromkeys(r["_tta_source"] for r in mine)), **counts))
    return rows, comps


def pair_counts(recs: Sequence[Mapping[str, Any]], rule: str, baseline: str) -> dict[str, int]:
    def times(name: str) -> dict[tuple, float]:
        return {(r["dataset"], r["process"], r["seed"]): r["metrics"][TTA]
                for r in recs if r["rule"] == name}

    a, b = times(rule), times(baseline)
    both = a.keys() & b.keys()
    reached = {k: (math.isfinite(a[k]), math.isfinite(b[k])) for k in both}
    return {"pairs": len(both),
            "both_reached": sum(1 for x in reached.values() if x == (True, True)),
            "rule_never": sum(1 for x in reached.values() if x == (False, True)),
            "baseline_never": sum(1 for x in reached.values() if x == (True, False)),
            "neither": sum(1 for x in reached.values() if x == (False, False)),
            "unpaired": len(a) + len(b) - 2 * len(both)}


def fmt_hours(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:+.3f}"


def fmt_p(x: float) -> str:
    if math.isnan(x):
        return "—"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3g}"


def time_cells(row: TimeRow) -> list[str]:
    """The cells of ``row`` in :data:`TIME_COLUMNS` order: hours with three decimals, a run or
    a pair that never reached the target reported as such."""
    if row.reached == 0:
        when = f"never reached (0/{row.runs} runs)"
    else:
        when = f"{row.mean_h:.3f} ({row.reached}/{row.runs} reached)"
    head = [row.setting or "rounds", row.rule, f"{100 * row.target:.4g}", str(row.runs),
            f"{row.reached}/{row.runs}", when]
    c = row.comparison
    if c is None:
        return head + ["baseline"] + ["—"] * 8
    if c.runs == 0:
        diff = "— (no pair where both reached the target)"
    elif math.isnan(c.ci_low):
        diff = f"{fmt_hours(c.mean_gain)} [undefined, df={c.df}]"
    else:
        diff = f"{fmt_hours(c.mean_gain)} [{fmt_hours(c.ci_low)}, {fmt_hours(c.ci_high)}]"
    never = (f"{row.dropped_never} (rule only {row.rule_never}, baseline only "
             f"{row.baseline_never}, both {row.neither})")
    if row.unpaired:
        never += f"; {row.unpaired} unpaired run(s)"
    return head + [diff, f"{row.both_reached}/{row.pairs}", never, f"{c.wins}/{c.runs}",
                   fmt_p(c.p_perm), fmt_p(c.p_perm_holm), fmt_p(c.p_wilcoxon), fmt_p(c.p_wilcoxon_holm),
                   c.verdict]


def _time_csv(rows: Sequence[TimeRow], baseline: str, path: Path) -> Path:
    nan = math.nan
    try:
        with path.open("w", newline="") as handle:
            w = csv.DictWriter(handle, fieldnames=CSV_TIME_COLUMNS)
            w.writeheader()
            for row in rows:
                c = row.comparison
                w.writerow({
                    "setting": row.setting, "rule": row.rule, "baseline": baseline,
                    "target": row.target, "runs": row.runs, "reached": row.reached,
                    "mean_h": row.mean_h, "pairs": row.pairs, "both_reached": row.both_reached,
                    "rule_never": row.rule_never, "baseline_never": row.baseline_never,
                    "neither": row.neither, "unpaired": row.unpaired,
                    "mean_diff_h": c.mean_gain if c else nan, "ci_low_h": c.ci_low if c else nan,
                    "ci_high_h": c.ci_high if c else nan, "df": c.df if c else "",
                    "units": c.units if c else "", "wins": c.wins if c else "",
                    "p_perm": c.p_perm if c else nan,
                    "p_perm_holm": c.p_perm_holm if c else nan,
                    "p_wilcoxon": c.p_wilcoxon if c else nan,
                    "p_wilcoxon_holm": c.p_wilcoxon_holm if c else nan,
                    "verdict": c.verdict if c else "baseline", "source": row.source})
    except OSError as exc:
        raise SfgError(f"cannot write {path}: {exc.strerror}; choose a writable out_dir") from None
    return path


# ------------------------------------------------------------------------ counts and rates


@dataclass(frozen=True)
class RateRow:
    """Means over seeds of one (dataset, process, setting) cell's clock counts (one rule, or
    every rule when they agree)."""

    dataset: str
    process: str
    setting: str
    rules: tuple[str, ...]
    runs: int
    rates: dict[str, float] = field(default_factory=dict)  # per device-hour (RATES names)
    counts: dict[str, float] = field(default_factory=dict)  # per run (COUNTS), NaN: none


def _device_hours(record: Mapping[str, Any]) -> float:
    cfg = _config(record)
    try:
        return (float(cfg["n_clients"]) * float(cfg["rounds"])
                * float(cfg.get("round_seconds", 600.0)) / 3600.0)
    except (KeyError, TypeError, ValueError):
        return math.nan


def _num(metrics: Mapping[str, Any], key: str) -> float:
    v = metrics.get(key)
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def run_rates(record: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """One clock run's rates per device-hour and counts (module docstring; NaN: none)."""
    m = record.get("metrics") or {}
    rates = {}
    for name, rate, count in RATES:
        v = _num(m, rate)
        if math.isnan(v) and count in m:
            v = _num(m, count) / _device_hours(record)
        rates[name] = v
    lost = [_num(m, k) for k in LOST if k in m]
    agg = _num(m, "returns_aggregated")
    counts = {"lost": float(np.sum(lost)) if lost else math.nan,
              **{k: _num(m, k) for k in COUNTS if k not in ("lost", "returns_heard")},
              "returns_heard": _num(m, "returns_heard") / agg if agg else math.nan}
    return rates, counts


def _nanmean(xs: Sequence[float]) -> float:
    a = np.array(xs, dtype=np.float64)
    return float(a[np.isfinite(a)].mean()) if np.isfinite(a).any() else math.nan


def rate_rows(records: Sequence[Mapping[str, Any]]) -> list[RateRow]:
    """Per (dataset, process, setting) of the clock runs in ``records`` (which carry their
    ``setting``), in the order they first appear: one row, or one per rule where the rules'
    means differ."""
    cells: dict[tuple[str, str, str], dict[str, list]] = {}
    for r in records:
        if is_clock(r):
            key = (str(r["dataset"]), str(r["process"]), str(r.get("setting", "")))
            cells.setdefault(key, {}).setdefault(str(r["rule"]), []).append(run_rates(r))
    out = []
    for (dataset, process, setting), by_rule in cells.items():
        means = {}
        for rule, runs in by_rule.items():
            means[rule] = ({k: _nanmean([x[0][k] for x in runs]) for k, *_ in RATES},
                           {k: _nanmean([x[1][k] for x in runs]) for k in COUNTS}, len(runs))
        first = next(iter(means.values()))
        same = all(_close(v[0], first[0]) and _close(v[1], first[1]) for v in means.values())
        if same:
            out.append(RateRow(dataset, process, setting, tuple(means),
                               sum(v[2] for v in means.values()), first[0], first[1]))
        else:
            out.extend(RateRow(dataset, process, setting, (rule,), v[2], v[0], v[1])
                       for rule, v in means.items())
    return out


def _close(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return all((math.isnan(a[k]) and math.isnan(b[k])) or math.isclose(a[k], b[k], rel_tol=1e-9)
               for k in a)


def _g(x: float, scale: float = 1.0) -> str:
    return "—" if not math.isfinite(x) else f"{x / scale:.4g}"


def rate_cells(row: RateRow) -> list[str]:
    """The cells of ``row`` in :data:`RATE_COLUMNS` order (bytes in megabytes)."""
    rules = row.rules[0] if len(row.rules) == 1 else f"all {len(row.rules)}: " + ", ".join(row.rules)
    r, c = row.rates, row.counts
    return [row.dataset, row.process, row.setting or "rounds", rules, str(row.runs),
            _g(r["local_rounds"]), _g(r["messages_sent"]), _g(r["delivered"]),
            _g(r["bytes"], 1e6), _g(r["compute_seconds"]),
            *(_g(c[k]) for k in COUNTS), _g(r["pull_requests"]), _g(r["pull_replies"]),
            _g(r["pull_unreachable"]), _g(r["pull_bytes"], 1e6), _g(r["pull_wait_seconds"])]


def _rates_csv(rows: Sequence[RateRow], path: Path) -> Path:
    names = ["dataset", "process", "setting", "rules", "runs",
             *(f"{k}_per_device_hour" for k, *_ in RATES), *COUNTS]
    try:
        with path.open("w", newline="") as handle:
            w = csv.writer(handle)
            w.writerow(names)
            for row in rows:
                w.writerow([row.dataset, row.process, row.setting, ";".join(row.rules), row.runs,
                            *(row.rates[k] for k, *_ in RATES), *(row.counts[k] for k in COUNTS)])
    except OSError as exc:
        raise SfgError(f"cannot write {path}: {exc.strerror}; choose a writable out_dir") from None
    return path


# ------------------------------------------------------------------------ accuracy over time


def _mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over runs on the times every run evaluated at (to the nanosecond of an hour)."""
    keyed = [(np.round(h, 9), a) for h, a in curves]
    common = keyed[0][0]
    for h, _ in keyed[1:]:
        common = np.intersect1d(common, h)
    return common, np.stack([a[np.searchsorted(h, common)] for h, a in keyed]).mean(axis=0)


def figure_over_time(records: Sequence[Mapping[str, Any]], rules: Sequence[str]) -> Any:
    """The figure of ``accuracy_over_time.png`` (module docstring) over the clock runs of
    ``records`` (carrying their ``setting``) of ``rules``; None when none has curves."""
    from matplotlib.figure import Figure

    grouped: dict[tuple[str, str], dict[str, dict[str, list]]] = {}
    targets: dict[tuple[str, str, str], float] = {}
    plotted = []
    for r in records:
        if not is_clock(r) or r["rule"] not in rules:
            continue
        c = hours_curve(r)
        if c is None:
            continue
        setting = str(r.get("setting", ""))
        grouped.setdefault((r["dataset"], r["process"]), {}).setdefault(
            setting, {}).setdefault(r["rule"], []).append(c)
        targets[(r["dataset"], r["process"], setting)] = _target(r)
        plotted.append(r)
    if not grouped:
        return None
    settings = list(dict.fromkeys(s for block in grouped.values() for s in block))
    cols = len(settings) if len(settings) <= 4 else 3
    per_block = math.ceil(len(settings) / cols)
    nrows = per_block * len(grouped)
    fig = Figure(figsize=(4.4 * cols, 3.3 * nrows + 0.9))
    axes = fig.subplots(nrows, cols, sharex=True, sharey=True, squeeze=False)
    colour = {rule: f"C{k % 10}" for k, rule in enumerate(rules)}
    for b, (dataset, process) in enumerate(grouped):
        for j, setting in enumerate(settings):
            ax = axes[b * per_block + j // cols][j % cols]
            runs_of = grouped[(dataset, process)].get(setting)
            if not runs_of:
                ax.set_axis_off()
                continue
            top = -math.inf
            for rule in rules:
                runs = runs_of.get(rule)
                if runs:
                    hours, acc = _mean_curve(runs)
                    ax.plot(hours, 100 * acc, color=colour[rule], marker="." if hours.size < 12
                            else None, label=f"{rule} (n={len(runs)})")
                    top = max(top, float(np.max(acc)) if acc.size else top)
            target = targets[(dataset, process, setting)]
            if target <= top:
                ax.axhline(100 * target, color="gray", lw=0.8, ls=":",
                           label=f"target {100 * target:.4g} %")
            ax.set_title(title(f"{dataset} · {process}", setting or "rounds", width=48),
                         fontsize=8)
            ax.set_xlabel("virtual time (h)")
            ax.set_ylabel("mean accuracy (%)")
            ax.legend(fontsize=7)
        for k in range(len(settings), per_block * cols):
            axes[b * per_block + k // cols][k % cols].set_axis_off()
    fig.suptitle(title("Mean accuracy (acc_mean) over virtual time, mean over seeds per rule, "
                       "one panel per clock setting", context_of(plotted), width=40 + 30 * cols),
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_over_time(records: Sequence[Mapping[str, Any]], rules: Sequence[str],
                   path: Path) -> Path | None:
    """Write :func:`figure_over_time` to ``path``; None (nothing written) without curves."""
    from sfg.experiments.report.figures import save_png

    fig = figure_over_time(records, rules)
    return None if fig is None else save_png(fig, path)


# ------------------------------------------------------------------------ the section


@dataclass
class ClockReport:
    """What :func:`clock_report` computed and wrote."""

    time_rows: list[TimeRow]
    time_comparisons: list[Comparison]
    rate_rows: list[RateRow]
    files: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def clock_report(records: Sequence[Mapping[str, Any]], *, baseline: str, rules: Sequence[str],
                 out_dir: Path, alpha: float = 0.05, confidence: float = 0.95,
                 weighting: str = "unit", seed: int = 0) -> ClockReport | None:
    """The clock sections of a report over ``records`` (carrying their ``setting``; module
    docstring); None when no record is a clock run."""
    clock = [r for r in records if is_clock(r)]
    if not clock:
        return None
    t_rows, t_comps = time_rows(clock, baseline=baseline, rules=rules, alpha=alpha,
                                confidence=confidence, weighting=weighting, seed=seed)
    rep = ClockReport(t_rows, t_comps, rate_rows(clock))
    if t_rows:
        rep.files["time_to_accuracy.csv"] = _time_csv(t_rows, baseline,
                                                      out_dir / "time_to_accuracy.csv")
    else:
        rep.notes.append(f"no time-to-accuracy table: {baseline} has no clock training run "
                         "with a time to target (time_to_accuracy_h or a lockstep round curve)")
    if rep.rate_rows:
        rep.files["clock_rates.csv"] = _rates_csv(rep.rate_rows, out_dir / "clock_rates.csv")
    png = plot_over_time(clock, [baseline, *[r for r in rules if r != baseline]],
                         out_dir / "accuracy_over_time.png")
    if png is None:
        rep.notes.append("accuracy_over_time.png not written: no clock run has curves")
    else:
        rep.files["accuracy_over_time.png"] = png
    return rep


def markdown(rep: ClockReport, *, baseline: str, confidence: float) -> list[str]:
    """The clock sections of ``report.md``: time to accuracy, then the counts."""
    lines: list[str] = []
    if rep.time_rows:
        lines += ["", "## Time to accuracy on the virtual clock (docs/concepts/clock.md#metrics)", "",
                  f"Hours of virtual time until the mean accuracy first reaches the target; "
                  f"Δ = paired difference rule − {baseline} in hours (negative = faster), "
                  f"{confidence:.0%} stratified interval, over the pairs where both runs "
                  "reached the target. A run that never reached it is counted, not timed.", "",
                  "| " + " | ".join(TIME_COLUMNS) + " |",
                  "|" + "|".join("---" for _ in TIME_COLUMNS) + "|"]
        for row in rep.time_rows:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in time_cells(row)) + " |")
        derived = sorted({r.setting or "rounds" for r in rep.time_rows
                          if "round curve" in r.source})
        lines += ["", "Units (dataset, seed), one comparison per (setting, rule), Holm over the "
                  f"{len(rep.time_comparisons)} time comparisons; wins = pairs where the rule "
                  "reached the target sooner. Dropped: pairs left out because the rule only, "
                  "the baseline only, or both never reached the target. `time_to_accuracy.csv` "
                  "keeps the figures for scripts."]
        if derived:
            lines.append("Lockstep times come from the runs' round curves (round r ends at "
                         f"r·Δ): {'; '.join(derived)}.")
    if rep.rate_rows:
        lines += ["", "## The clock's counts (docs/concepts/clock.md#metrics)", "",
                  "Means over seeds; rates per device-hour (N · T · Δ / 3600 device-hours per "
                  "run), counts per run; — where the protocol has no such count; raw means in "
                  "`clock_rates.csv`.", "",
                  "| " + " | ".join(RATE_COLUMNS) + " |",
                  "|" + "|".join("---" for _ in RATE_COLUMNS) + "|"]
        for rrow in rep.rate_rows:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in rate_cells(rrow)) + " |")
    return lines


def print_clock(rep: ClockReport, *, console: Any) -> None:
    """The time-to-accuracy table in the terminal (rich)."""
    if not rep.time_rows:
        return
    from rich import box
    from rich.table import Table

    table = Table(title="Time to accuracy on the virtual clock (hours; Δ = rule − baseline, "
                        "negative = faster; pairs where both reached the target)",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    shown = ("setting", "rule", "reached", "time to target (h)", "Δ time (h) [CI]",
             "dropped: never reached", "p perm Holm", "verdict")
    index = [TIME_COLUMNS.index(c) for c in shown]
    for name in shown:
        table.add_column(name, overflow="fold", justify="left")
    for row in rep.time_rows:
        cells = time_cells(row)
        table.add_row(*(cells[i] for i in index))
    console.print(table)

