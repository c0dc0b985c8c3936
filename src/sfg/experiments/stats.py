"""Paired comparisons of rules against a baseline (docs/concepts/statistics.md#paired-statistics).

Pipeline for one comparison, rule R against baseline B on metric m:

1. **Pairing.** For every (dataset, process, seed) cell that holds a finished run of both R and
   B under the same *setting* (below), the paired difference is ``d = m(R) - m(B)``. Runs
   without a partner (or with a non-finite metric) are dropped and counted in ``dropped``.
2. **Units.** The unit of inference is the (dataset, seed) pair; a unit's difference is the
   mean of its paired differences over the processes present for both rules.
3. **Interval.** Stratified t-interval over units, variance pooled within datasets:
   ``s² = Σ_h Σ_{u∈h} (d_u − d̄_h)² / (U − H)``, ``df = U − H``. The point estimate is a weighted
   mean of unit differences. *Weighting* (left open by docs/concepts/statistics.md#paired-statistics): ``"unit"`` (default) gives every
   unit the same weight ``1/U`` (datasets count in proportion to their units);
   ``"dataset"`` gives every dataset the same total weight (``1/(H·n_h)`` per unit). Either way
   ``SE = s·sqrt(Σ_u w_u²)``. If ``df ≤ 0`` the interval is undefined (NaN).
4. **Primary test.** Two-sided sign-flip permutation test over units with the same weighted
   mean as statistic; exact over all ``2^U`` sign patterns when ``U ≤ exact_max_units`` (20),
   otherwise Monte Carlo with ``draws`` (100 000) random patterns from the keyed stream
   ``sfg.util.rng.stream(seed, "stats", "sign-flip")``. ``p`` is the fraction of patterns with
   ``|stat| ≥ |observed|``, the identity included (Monte Carlo: ``(1 + hits) / (1 + draws)``).
5. **Secondary test.** Wilcoxon signed-rank (``scipy.stats.wilcoxon``, default
   ``zero_method="wilcox"``) on the (dataset × process) cell means of ``d`` (mean over seeds);
   all-zero differences give ``p = 1``.
6. **Holm** correction of each test's p-values over the declared family: the comparisons of
   one :func:`compare` call.
7. **Verdict.** ``"better"`` / ``"worse"`` when the interval excludes 0 *and* the
   Holm-corrected permutation p is below ``alpha``; ``"no difference"`` when neither holds;
   ``"unresolved"`` when they disagree or the interval is undefined.

**Settings.** A run's setting (:func:`setting_labels`) is what it was run under besides the
grid's axes: on the virtual clock (docs/concepts/clock.md#the-virtual-clock) its protocol and every clock setting away from its
default (``"async, jitter 0.5, compute lognormal:median=30,sigma=1"``), and any other setting
that tells apart runs of one (dataset, process, rule, seed) — an override such as
``local_steps 3``; round-based runs of a grid without such overrides have the setting ``""``.
Runs are paired only within one setting (an ``async`` run never with a ``lockstep`` one), and
:func:`compare` makes one comparison per (setting, rule), in the order the settings first
appear in the records; Holm runs over all of them.

``wins`` counts paired runs in which R improved on B and ``positive_cells`` the cells with a
mean improvement; "improved" means a larger metric unless the metric is one where lower is
better (``messages``, ``scalars``, ``local_steps_rel``, ``time_to_accuracy_h``; override with
``higher_is_better``).
``mean_gain`` and the interval are always the raw difference ``m(R) − m(B)``.

**Design sensitivity and the outage gap** (docs/concepts/statistics.md#report-additions), per comparison, every mean pooled like
the gain (unit mean over the processes kept, weighted mean over units):

* ``processes`` / ``positive_processes``: processes present, and those whose pooled mean gain
  is an improvement;
* ``loo_min`` / ``loo_max``: the smallest and largest pooled mean over the designs that leave
  one process out (NaN with fewer than two processes);
* ``mean_no_iid`` / ``p_no_iid``: the pooled mean without the ``iid`` processes and its
  uncorrected sign-flip p (exact up to ``exact_max_units`` units, as the primary test);
* ``gap_closed``: the share of the outage gap closed, pooled gain ÷ pooled gap, where a run's
  gap is ``m(B, none) − m(B, process)`` of the same (dataset, seed) and only runs whose
  (dataset, seed) has a ``none`` run of the baseline count (the ``none`` process itself never);
  ``gap_closed_by_process``: the same per process, as JSON ``{process: share}``; NaN / ``{}``
  without a ``none`` process;
* ``gain_q1`` … ``gain_q4``: pooled mean gains of the per-availability-quartile metrics
  ``acc_q1`` (least available clients) … ``acc_q4``; NaN when a run lacks them.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as _sps

from sfg.errors import SfgError, check
from sfg.util.components import did_you_mean
from sfg.util.rng import stream

LOWER_IS_BETTER = frozenset({"messages", "scalars", "local_steps_rel", "time_to_accuracy_h"})
"""Metrics for which a smaller value is an improvement."""

EXACT_MAX_UNITS = 20
"""Up to this many units the permutation test enumerates all ``2^units`` sign patterns."""

MONTE_CARLO_DRAWS = 100_000
"""Random sign patterns drawn above :data:`EXACT_MAX_UNITS`."""

WEIGHTINGS = ("unit", "dataset")
VERDICTS = ("better", "worse", "no difference", "unresolved")
_MAX_EXACT = 24  # 2^24 float64 statistics = 128 MiB; beyond that use Monte Carlo
_MC_CHUNK = 8192


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RunValue:
    """One finished run's value of one metric (``value`` may be NaN: missing/non-finite)."""

    dataset: str
    process: str
    rule: str
    seed: int
    value: float
    setting: str = ""  # what the run was run under besides the axes (:func:`setting_labels`)


def _describe(record: Any, index: int) -> str:
    run_id = record.get("run_id") if isinstance(record, Mapping) else None
    return f"record {index}" + (f" (run_id {run_id})" if run_id else "")


def run_values(records: Iterable[Mapping[str, Any]], metric: str) -> list[RunValue]:
    """Validate records and extract ``metric`` from each (docs/concepts/statistics.md#paired-statistics).

    Each record needs ``dataset``, ``process``, ``rule`` (strings), ``seed`` (int) and a
    ``metrics`` mapping holding ``metric``; ``None`` or a non-finite value becomes NaN (the run
    is then dropped from pairing and counted). Raises :class:`SfgError` on malformed records
    and on duplicate (dataset, process, rule, seed) runs of one setting (:func:`setting_labels`,
    kept in :attr:`RunValue.setting`).
    """
    records = list(records)
    labels = setting_labels(records)
    out: list[RunValue] = []
    seen: dict[tuple[str, str, str, int, str], int] = {}
    for index, record in enumerate(records):
        where = _describe(record, index)
        check(isinstance(record, Mapping), f"{where} is {type(record).__name__}, not a mapping; "
              "pass the run records as dicts")
        for key in ("dataset", "process", "rule"):
            check(isinstance(record.get(key), str) and record.get(key) != "",
                  f"{where} has no {key!r} string; every run record needs dataset, process, "
                  "rule, seed and metrics")
        seed = record.get("seed")
        check(isinstance(seed, (int, np.integer)) and not isinstance(seed, bool),
              f"{where} has seed {seed!r}; seeds must be integers")
        metrics = record.get("metrics")
        check(isinstance(metrics, Mapping),
              f"{where} has no 'metrics' mapping; every run record needs metrics")
        if metric not in metrics:
            raise SfgError(f"{where} has no metric {metric!r}"
                           f"{did_you_mean(metric, metrics.keys())}")
        raw = metrics[metric]
        if raw is None:
            value = math.nan
        else:
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise SfgError(f"{where} has non-numeric {metric!r} = {raw!r}; metrics must be "
                               "numbers") from None
        if not math.isfinite(value):
            value = math.nan
        cell = (str(record["dataset"]), str(record["process"]), str(record["rule"]),
                int(seed), labels[index])  # type: ignore[arg-type]
        if cell in seen:
            under = f", setting {cell[4]!r}" if cell[4] else ""
            raise SfgError(f"{where} duplicates record {seen[cell]}: dataset={cell[0]}, "
                           f"process={cell[1]}, rule={cell[2]}, seed={cell[3]}{under}; keep one "
                           "run per cell")
        seen[cell] = index
        out.append(RunValue(*cell[:4], value, cell[4]))
    return out


# --------------------------------------------------------------------------- settings

AXIS_KEYS = ("dataset", "process", "rule", "seed")
"""The grid's axes: they name a run's cell, never its setting."""


def _clock_defaults() -> dict[str, Any]:
    """The virtual clock's settings (docs/concepts/clock.md#the-virtual-clock) with their defaults, protocol first."""
    from sfg.clock.settings import DEFAULTS
    from sfg.experiments.config import RunConfig

    keys = [k for k in DEFAULTS if k != "clock"]
    return {k: RunConfig.model_fields[k].default for k in keys}


def setting_value(v: Any) -> str:
    """A setting's value as a label shows it: ``0.5``, ``600``, ``const:value=60``, ``none``."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (int, str)):
        return str(v)
    return json.dumps(v, sort_keys=True)


def clock_setting(config: Any) -> str:
    """The clock part of a run's setting: ``""`` for a round-based run (docs/concepts/round.md#one-round), else its
    protocol and each clock setting away from its default, ``"async, jitter 0.5"``."""
    if not isinstance(config, Mapping) or config.get("clock", "rounds") != "virtual":
        return ""
    defaults = _clock_defaults()
    parts = [setting_value(config.get("protocol", defaults["protocol"]))]
    for key, default in defaults.items():
        v = config.get(key, default)
        if key != "protocol" and v != default:
            parts.append(f"{key} {setting_value(v)}")
    return ", ".join(parts)


def setting_labels(records: Sequence[Any]) -> list[str]:
    """Every record's setting (module docstring), in order: an explicit ``record["setting"]``
    string as it is; otherwise :func:`clock_setting` of its ``config`` followed by
    ``key value`` for each other setting (sorted) that differs between records of one
    (dataset, process, rule, seed) and clock setting. Records without a config get ``""``."""
    configs: list[Mapping[str, Any] | None] = []
    clocks: list[str] = []
    for r in records:
        explicit = isinstance(r, Mapping) and isinstance(r.get("setting"), str)
        cfg = r.get("config") if isinstance(r, Mapping) and not explicit else None
        configs.append(cfg if isinstance(cfg, Mapping) else None)
        clocks.append(clock_setting(configs[-1]))
    skip = set(AXIS_KEYS) | set(_clock_defaults()) | {"clock"}
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (r, cfg) in enumerate(zip(records, configs, strict=True)):
        if cfg is not None:
            key = tuple(str(r.get(k)) for k in AXIS_KEYS) + (clocks[i],)
            groups.setdefault(key, []).append(i)
    from sfg.experiments.config import RunConfig

    fields = RunConfig.model_fields

    def value(cfg: Mapping[str, Any] | None, name: str) -> str:
        # a setting a stored config leaves out (at its default, e.g. peers fixed) is its default
        cfg = cfg or {}
        return setting_value(cfg[name] if name in cfg else
                             fields[name].default if name in fields else None)

    varying: set[str] = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        names = set().union(*(configs[i] or {} for i in members)) - skip - varying
        for name in names:
            if len({value(configs[i], name) for i in members}) > 1:
                varying.add(name)
    out = []
    for r, cfg, clock in zip(records, configs, clocks, strict=True):
        if isinstance(r, Mapping) and isinstance(r.get("setting"), str):
            out.append(r["setting"])
            continue
        parts = [clock] if clock else []
        if cfg is not None:
            parts += [f"{k} {value(cfg, k)}" for k in sorted(varying)]
        out.append(", ".join(parts))
    return out


def with_settings(records: Iterable[Any]) -> list[Any]:
    """The records with their setting written into each (``record["setting"]``, copies), so
    that every later step labels them alike; what is not a mapping is passed on as it is."""
    records = list(records)
    return [{**r, "setting": label} if isinstance(r, Mapping) else r
            for r, label in zip(records, setting_labels(records), strict=True)]


def settings_in_order(values: Iterable[RunValue]) -> list[str]:
    """The distinct settings of ``values`` in the order they first appear."""
    return list(dict.fromkeys(v.setting for v in values))


# --------------------------------------------------------------------------- pairing


@dataclass(frozen=True)
class PairedDifferences:
    """Paired differences ``m(rule) − m(baseline)`` of one comparison (docs/concepts/statistics.md#paired-statistics).

    ``P`` paired runs, ``U`` units (dataset, seed), ``C`` cells (dataset, process).
    """

    rule: str
    baseline: str
    metric: str
    run_keys: tuple[tuple[str, str, int], ...]  # [P] (dataset, process, seed), sorted
    run_diffs: np.ndarray  # [P] float64
    unit_keys: tuple[tuple[str, int], ...]  # [U] (dataset, seed), sorted
    unit_diffs: np.ndarray  # [U] float64, mean over the unit's processes
    unit_strata: np.ndarray  # [U] int64, index into ``datasets``
    datasets: tuple[str, ...]  # [H]
    cell_keys: tuple[tuple[str, str], ...]  # [C] (dataset, process), sorted
    cell_means: np.ndarray  # [C] float64, mean over seeds
    dropped: int  # runs of rule or baseline without a finite partner
    setting: str = ""  # the one setting paired within


def _group_mean(keys: Sequence[tuple], values: np.ndarray) -> tuple[list[tuple], np.ndarray]:
    """Sorted distinct keys and the mean of ``values`` [P] per key."""
    distinct = sorted(set(keys))
    index = {k: i for i, k in enumerate(distinct)}
    inverse = np.fromiter((index[k] for k in keys), dtype=np.int64, count=len(keys))
    sums = np.bincount(inverse, weights=values, minlength=len(distinct))
    counts = np.bincount(inverse, minlength=len(distinct))
    return distinct, sums / np.maximum(counts, 1)


def pair_values(values: Sequence[RunValue], *, rule: str, baseline: str,
                metric: str = "", setting: str | None = None) -> PairedDifferences:
    """Pair ``rule`` with ``baseline`` per (dataset, process, seed) and aggregate (docs/concepts/statistics.md#paired-statistics).

    Pairs form within one setting: ``setting`` (the values of other settings are left out),
    or, when None, the one setting the two rules' values have (several raise
    :class:`SfgError`: pair within each, as :func:`compare` does).
    """
    if setting is None:
        present = settings_in_order(v for v in values if v.rule in (rule, baseline))
        check(len(present) <= 1,
              f"the runs of {rule} and {baseline} were made under {len(present)} settings "
              f"({'; '.join(repr(p) for p in present)}); pair within one setting "
              "(sfg.experiments.stats.compare does)")
        setting = present[0] if present else ""
    values = [v for v in values if v.setting == setting]
    by_rule: dict[tuple[str, str, int], float] = {}
    by_base: dict[tuple[str, str, int], float] = {}
    for v in values:
        if v.rule == rule:
            by_rule[(v.dataset, v.process, v.seed)] = v.value
        elif v.rule == baseline:
            by_base[(v.dataset, v.process, v.seed)] = v.value
    paired = sorted(k for k in by_rule.keys() & by_base.keys()
                    if math.isfinite(by_rule[k]) and math.isfinite(by_base[k]))
    dropped = len(by_rule) + len(by_base) - 2 * len(paired)
    diffs = np.array([by_rule[k] - by_base[k] for k in paired], dtype=np.float64)
    unit_keys, unit_diffs = _group_mean([(d, s) for d, _, s in paired], diffs)
    cell_keys, cell_means = _group_mean([(d, p) for d, p, _ in paired], diffs)
    datasets = tuple(sorted({d for d, _ in unit_keys}))
    strata = np.array([datasets.index(d) for d, _ in unit_keys], dtype=np.int64)
    return PairedDifferences(
        rule=rule, baseline=baseline, metric=metric, run_keys=tuple(paired), run_diffs=diffs,
        unit_keys=tuple(unit_keys), unit_diffs=unit_diffs, unit_strata=strata,
        datasets=datasets, cell_keys=tuple(cell_keys), cell_means=cell_means, dropped=dropped,
        setting=setting)


def paired_differences(records: Iterable[Mapping[str, Any]], *, rule: str,
                       baseline: str = "dfedavg", metric: str = "acc_mean",
                       setting: str | None = None) -> PairedDifferences:
    """Validate ``records`` and pair ``rule`` against ``baseline`` on ``metric`` (docs/concepts/statistics.md#paired-statistics)
    within ``setting`` (see :func:`pair_values`)."""
    return pair_values(run_values(records, metric), rule=rule, baseline=baseline, metric=metric,
                       setting=setting)


# --------------------------------------------------------------------------- interval


def unit_weights(strata: np.ndarray, *, weighting: str = "unit") -> np.ndarray:
    """Weights [U] (summing to 1) of the units in the overall mean; see module docstring."""
    check(weighting in WEIGHTINGS,
          f"unknown weighting {weighting!r}{did_you_mean(weighting, WEIGHTINGS)}")
    strata = np.asarray(strata, dtype=np.int64)
    if strata.size == 0:
        return np.zeros(0)
    if weighting == "unit":
        return np.full(strata.size, 1.0 / strata.size)
    _, inverse, counts = np.unique(strata, return_inverse=True, return_counts=True)
    return 1.0 / (counts.size * counts[inverse])


@dataclass(frozen=True)
class Interval:
    """A stratified t-interval for the mean unit difference (docs/concepts/statistics.md#paired-statistics)."""

    mean: float
    low: float  # NaN when df ≤ 0
    high: float  # NaN when df ≤ 0
    se: float  # NaN when df ≤ 0
    df: int
    units: int


def stratified_interval(diffs: np.ndarray, strata: np.ndarray, *, confidence: float = 0.95,
                        weighting: str = "unit") -> Interval:
    """Stratified t-interval with variance pooled within strata (datasets), docs/concepts/statistics.md#paired-statistics.

    ``diffs``: [U] float64 unit differences; ``strata``: [U] int dataset label per unit.
    ``df = U − H``; ``s² = Σ_h Σ_{u∈h} (d_u − d̄_h)² / df``; ``SE = s·sqrt(Σ w_u²)``.
    """
    check(0.0 < confidence < 1.0, f"confidence must be in (0, 1), got {confidence}")
    diffs = np.asarray(diffs, dtype=np.float64)
    strata = np.asarray(strata, dtype=np.int64)
    check(diffs.shape == strata.shape and diffs.ndim == 1,
          f"diffs {diffs.shape} and strata {strata.shape} must be matching 1-D arrays")
    weights = unit_weights(strata, weighting=weighting)
    units = int(diffs.size)
    if units == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0, 0)
    mean = float(weights @ diffs)
    _, inverse, counts = np.unique(strata, return_inverse=True, return_counts=True)
    df = units - int(counts.size)
    if df <= 0:
        return Interval(mean, math.nan, math.nan, math.nan, df, units)
    stratum_means = np.bincount(inverse, weights=diffs) / counts
    pooled_var = float(np.sum((diffs - stratum_means[inverse]) ** 2)) / df
    se = math.sqrt(pooled_var * float(weights @ weights))
    half = float(_sps.t.ppf(0.5 + confidence / 2.0, df)) * se
    return Interval(mean, mean - half, mean + half, se, df, units)


# --------------------------------------------------------------------------- tests


def _sign_flip_sums(values: np.ndarray) -> np.ndarray:
    """All ``2^U`` signed sums ``Σ ±values_u`` [2^U] float64 (pattern order: binary)."""
    sums = np.zeros(1)
    for v in values:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def sign_flip_pvalue(diffs: np.ndarray, *, weights: np.ndarray | None = None,
                     exact_max_units: int = EXACT_MAX_UNITS, draws: int = MONTE_CARLO_DRAWS,
                     seed: int = 0) -> tuple[float, str]:
    """Two-sided sign-flip permutation p-value of the weighted mean of ``diffs`` (docs/concepts/statistics.md#paired-statistics).

    ``diffs``: [U] unit differences; ``weights``: [U] (default ``1/U``, the plain mean).
    Exact over all ``2^U`` patterns when ``U ≤ exact_max_units``; otherwise ``draws`` random
    patterns from ``stream(seed, "stats", "sign-flip")`` and ``p = (1 + hits) / (1 + draws)``.
    Ties within a relative tolerance of 1e-9 count as ``≥``. Returns ``(p, method)`` where
    method is e.g. ``"exact(16)"`` or ``"monte-carlo(100000, seed=0)"``; ``(nan, "none")``
    without units.
    """
    check(isinstance(exact_max_units, (int, np.integer)) and 0 <= exact_max_units <= _MAX_EXACT,
          f"exact_max_units must be an integer in [0, {_MAX_EXACT}], got {exact_max_units!r}")
    check(isinstance(draws, (int, np.integer)) and draws >= 1,
          f"draws must be a positive integer, got {draws!r}")
    diffs = np.asarray(diffs, dtype=np.float64)
    check(diffs.ndim == 1, f"diffs must be 1-D, got shape {diffs.shape}")
    units = diffs.size
    if units == 0:
        return math.nan, "none"
    w = np.full(units, 1.0 / units) if weights is None else np.asarray(weights, np.float64)
    check(w.shape == diffs.shape, f"weights {w.shape} must match diffs {diffs.shape}")
    terms = w * diffs
    observed = abs(float(terms.sum()))
    threshold = observed - 1e-9 * float(np.abs(terms).sum())
    if units <= exact_max_units:
        hits = int(np.count_nonzero(np.abs(_sign_flip_sums(terms)) >= threshold))
        return hits / 2.0**units, f"exact({2**units})"
    rng = stream(int(seed), "stats", "sign-flip")
    hits = 0
    for start in range(0, int(draws), _MC_CHUNK):
        n = min(_MC_CHUNK, int(draws) - start)
        signs = rng.integers(0, 2, size=(n, units), dtype=np.int8) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ terms) >= threshold))
    return (1 + hits) / (1 + int(draws)), f"monte-carlo({int(draws)}, seed={int(seed)})"


def wilcoxon_pvalue(cell_means: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of ``cell_means`` [C] (docs/concepts/statistics.md#paired-statistics).

    ``scipy.stats.wilcoxon`` with its defaults; all-zero differences give 1.0, no cells NaN.
    Values are first rounded to 12 significant digits of the largest ``|x|`` so that ties and
    zeros blurred by floating-point subtraction (``0.53 − 0.5`` vs ``0.5 − 0.53``) stay ties.
    """
    x = np.asarray(cell_means, dtype=np.float64)
    if x.size == 0:
        return math.nan
    scale = float(np.max(np.abs(x)))
    if scale > 0:
        x = np.round(x / scale, 12) * scale
    if np.all(x == 0.0):
        return 1.0
    return float(_sps.wilcoxon(x).pvalue)


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values [M] over one family (docs/concepts/statistics.md#paired-statistics).

    Sort ascending, ``adj_(k) = max_{j≤k} min(1, (m − j + 1)·p_(j))`` (1-based), returned in
    the input order. NaN entries stay NaN and do not count towards ``m``.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    check(p.ndim == 1, f"p-values must be 1-D, got shape {p.shape}")
    finite = ~np.isnan(p)
    check(bool(np.all((p[finite] >= 0) & (p[finite] <= 1))),
          "p-values must lie in [0, 1]")
    out = np.full(p.shape, math.nan)
    q = p[finite]
    m = q.size
    if m == 0:
        return out
    order = np.argsort(q, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * q[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    out[finite] = adjusted
    return out


def verdict(*, mean: float, low: float, high: float, p_adjusted: float, alpha: float,
            higher_is_better: bool = True) -> str:
    """``better``/``worse``/``no difference``/``unresolved`` (docs/concepts/statistics.md#paired-statistics).

    The interval "rejects" when it excludes 0, the test when ``p_adjusted < alpha``; agreement
    on rejection gives the direction of ``mean``, agreement on no rejection "no difference",
    disagreement (or an undefined interval or p-value) "unresolved".
    """
    if any(math.isnan(x) for x in (mean, low, high, p_adjusted)):
        return "unresolved"
    interval_rejects = low > 0.0 or high < 0.0
    test_rejects = p_adjusted < alpha
    if interval_rejects != test_rejects:
        return "unresolved"
    if not interval_rejects:
        return "no difference"
    return "better" if (mean > 0) == higher_is_better else "worse"


# --------------------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class Comparison:
    """One rule-versus-baseline comparison on one metric (docs/concepts/statistics.md#paired-statistics); a row of the CSV."""

    rule: str
    baseline: str
    metric: str
    setting: str  # what both rules' runs were run under ("" round-based; module docstring)
    mean_gain: float  # weighted mean over units of m(rule) − m(baseline)
    ci_low: float
    ci_high: float
    df: int
    units: int
    datasets: int
    p_perm: float
    p_perm_holm: float
    p_wilcoxon: float
    p_wilcoxon_holm: float
    verdict: str
    wins: int  # paired runs where the rule improved on the baseline
    runs: int  # paired runs
    positive_cells: int  # (dataset, process) cells with a mean improvement
    cells: int
    dropped: int  # runs of either rule without a partner
    confidence: float
    alpha: float
    weighting: str
    permutation: str  # "exact(2^U)" or "monte-carlo(draws, seed=...)"
    higher_is_better: bool
    # design sensitivity and the outage gap (docs/concepts/statistics.md#report-additions; module docstring)
    processes: int = 0
    positive_processes: int = 0
    loo_min: float = math.nan
    loo_max: float = math.nan
    mean_no_iid: float = math.nan
    p_no_iid: float = math.nan
    gap_closed: float = math.nan
    gap_closed_by_process: str = "{}"
    gain_q1: float = math.nan
    gain_q2: float = math.nan
    gain_q3: float = math.nan
    gain_q4: float = math.nan


CSV_COLUMNS = tuple(f.name for f in fields(Comparison))


def _improves(x: np.ndarray, higher_is_better: bool) -> np.ndarray:
    return x > 0 if higher_is_better else x < 0


def pooled_mean(run_keys: Sequence[tuple[str, str, int]], run_values_: np.ndarray, *,
                weighting: str = "unit") -> tuple[float, np.ndarray, np.ndarray]:
    """Pool per-run values like the gain: ``(mean, unit_values [U], unit_weights [U])``.

    ``run_keys``: [P] (dataset, process, seed); a unit's value is the mean over its processes,
    the pooled mean the weighted mean over units (:func:`unit_weights`). NaN without runs.
    """
    if len(run_keys) == 0:
        return math.nan, np.zeros(0), np.zeros(0)
    units, unit_vals = _group_mean([(d, s) for d, _, s in run_keys],
                                   np.asarray(run_values_, np.float64))
    datasets = sorted({d for d, _ in units})
    strata = np.array([datasets.index(d) for d, _ in units], np.int64)
    w = unit_weights(strata, weighting=weighting)
    return float(w @ unit_vals), unit_vals, w


def _is_iid(process: str) -> bool:
    return process.split(":", 1)[0].split("+", 1)[0].strip().lower() == "iid"


@dataclass(frozen=True)
class Sensitivity:
    """Design sensitivity and outage-gap figures of one comparison (docs/concepts/statistics.md#report-additions)."""

    processes: int
    positive_processes: int
    loo_min: float
    loo_max: float
    mean_no_iid: float
    p_no_iid: float
    gap_closed: float
    gap_closed_by_process: dict[str, float]


def design_sensitivity(pd: PairedDifferences, values: Sequence[RunValue], *,
                       weighting: str = "unit", higher_is_better: bool = True,
                       exact_max_units: int = EXACT_MAX_UNITS, draws: int = MONTE_CARLO_DRAWS,
                       seed: int = 0) -> Sensitivity:
    """Processes with a positive mean, leave-one-process-out range, the mean without i.i.d.
    outages with its uncorrected sign-flip p, and the share of the outage gap closed
    (docs/concepts/statistics.md#report-additions; module docstring). ``values``: every run's value of the compared metric."""
    keys, diffs = list(pd.run_keys), pd.run_diffs
    procs = np.array([p for _, p, _ in keys], dtype=object)
    distinct = sorted(set(procs.tolist()))

    def pooled(mask: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        return pooled_mean([k for k, m in zip(keys, mask, strict=True) if m], diffs[mask],
                           weighting=weighting)

    per_proc = [pooled(procs == p)[0] for p in distinct]
    positive = int(np.count_nonzero(_improves(np.array(per_proc), higher_is_better)))
    loo = [pooled(procs != p)[0] for p in distinct] if len(distinct) >= 2 else []
    no_iid = np.array([not _is_iid(p) for p in procs.tolist()], bool)
    mean_ni, units_ni, w_ni = pooled(no_iid)
    p_ni = (sign_flip_pvalue(units_ni, weights=w_ni, exact_max_units=exact_max_units,
                             draws=draws, seed=seed)[0] if units_ni.size else math.nan)
    # the outage gap: m(B, none) - m(B, process) for the same (dataset, seed)
    base = {(v.dataset, v.process, v.seed): v.value for v in values if v.rule == pd.baseline}
    gap = np.array([base.get((d, "none", s), math.nan) - base[(d, p, s)] for d, p, s in keys])
    has_gap = np.isfinite(gap) & (procs != "none")

    def share(mask: np.ndarray) -> float:
        sel = [k for k, m in zip(keys, mask, strict=True) if m]
        if not sel:
            return math.nan
        g = pooled_mean(sel, diffs[mask], weighting=weighting)[0]
        o = pooled_mean(sel, gap[mask], weighting=weighting)[0]
        return g / o if o != 0 else math.nan

    by_proc = {p: share(has_gap & (procs == p)) for p in distinct if p != "none"
               and bool((has_gap & (procs == p)).any())}
    return Sensitivity(
        processes=len(distinct), positive_processes=positive,
        loo_min=float(min(loo)) if loo else math.nan,
        loo_max=float(max(loo)) if loo else math.nan,
        mean_no_iid=mean_ni, p_no_iid=float(p_ni), gap_closed=share(has_gap),
        gap_closed_by_process=by_proc)


def quartile_gains(records: Sequence[Mapping[str, Any]], *, rule: str, baseline: str,
                   weighting: str = "unit", setting: str | None = None) -> list[float]:
    """Pooled mean gains of ``acc_q1`` … ``acc_q4`` (docs/concepts/statistics.md#paired-statistics, docs/concepts/statistics.md#report-additions) within ``setting`` (see
    :func:`pair_values`); NaNs when a run of ``rule`` or ``baseline`` there lacks a quartile
    metric."""
    records = with_settings(records)
    involved = [r for r in records if r.get("rule") in (rule, baseline)
                and (setting is None or r.get("setting") == setting)]
    if not all(isinstance(r.get("metrics"), Mapping)
               and all(f"acc_q{q}" in r["metrics"] for q in range(1, 5)) for r in involved):
        return [math.nan] * 4
    out = []
    for q in range(1, 5):
        pd = pair_values(run_values(involved, f"acc_q{q}"), rule=rule, baseline=baseline,
                         setting=setting)
        out.append(pooled_mean(pd.run_keys, pd.run_diffs, weighting=weighting)[0])
    return out


def compare(records: Iterable[Mapping[str, Any]], *, rules: Sequence[str] | None = None,
            baseline: str = "dfedavg", metric: str = "acc_mean", alpha: float = 0.05,
            confidence: float = 0.95, weighting: str = "unit",
            higher_is_better: bool | None = None, exact_max_units: int = EXACT_MAX_UNITS,
            draws: int = MONTE_CARLO_DRAWS, seed: int = 0) -> list[Comparison]:
    """Compare every rule in ``rules`` with ``baseline`` on ``metric`` (docs/concepts/statistics.md#paired-statistics).

    ``rules`` default: every rule in the records except the baseline (sorted). One
    comparison per setting (module docstring) in which the rule has runs, settings in the
    order they first appear, rules in ``rules`` order within each; the declared family for Holm
    is exactly these comparisons. ``higher_is_better`` default: False for
    :data:`LOWER_IS_BETTER` metrics, True otherwise. See the module docstring for the method.
    """
    check(0.0 < alpha < 1.0, f"alpha must be in (0, 1), got {alpha}")
    check(0.0 < confidence < 1.0, f"confidence must be in (0, 1), got {confidence}")
    check(weighting in WEIGHTINGS,
          f"unknown weighting {weighting!r}{did_you_mean(weighting, WEIGHTINGS)}")
    records = with_settings(records)
    values = run_values(records, metric)
    present = sorted({v.rule for v in values})
    check(baseline in present, f"baseline {baseline!r} has no runs"
          f"{did_you_mean(baseline, present) if present else '; the record set is empty'}")
    if rules is None:
        rules = [r for r in present if r != baseline]
    rules = list(rules)
    for rule in rules:
        check(rule in present, f"rule {rule!r} has no runs{did_you_mean(rule, present)}")
        check(rule != baseline, f"rule {rule!r} is the baseline; leave it out of rules")
    check(len(set(rules)) == len(rules), f"rules {rules} repeat a rule; list each once")
    hib = (metric not in LOWER_IS_BETTER) if higher_is_better is None else bool(higher_is_better)

    partial = []
    for setting in settings_in_order(values):
        here = [v for v in values if v.setting == setting]
        recs = [r for r in records if r.get("setting") == setting]
        for rule in rules:
            if any(v.rule == rule for v in here):
                partial.append(_partial(here, recs, rule=rule, baseline=baseline,
                                        metric=metric, setting=setting,
                                        confidence=confidence, weighting=weighting, hib=hib,
                                        exact_max_units=exact_max_units, draws=draws,
                                        seed=seed))

    perm_holm = holm([p[3] for p in partial])
    wil_holm = holm([p[5] for p in partial])
    out = []
    for (rule, pd, iv, p_perm, method, p_wil, sens, quart), ph, wh in zip(
            partial, perm_holm, wil_holm, strict=True):
        out.append(Comparison(
            rule=rule, baseline=baseline, metric=metric, setting=pd.setting,
            mean_gain=iv.mean, ci_low=iv.low, ci_high=iv.high, df=iv.df, units=iv.units, datasets=len(pd.datasets),
            p_perm=p_perm, p_perm_holm=float(ph), p_wilcoxon=p_wil,
            p_wilcoxon_holm=float(wh),
            verdict=verdict(mean=iv.mean, low=iv.low, high=iv.high, p_adjusted=float(ph),
                            alpha=alpha, higher_is_better=hib),
            wins=int(np.count_nonzero(_improves(pd.run_diffs, hib))), runs=len(pd.run_keys),
            positive_cells=int(np.count_nonzero(_improves(pd.cell_means, hib))),
            cells=len(pd.cell_keys), dropped=pd.dropped, confidence=confidence, alpha=alpha,
            weighting=weighting, permutation=method, higher_is_better=hib,
            processes=sens.processes, positive_processes=sens.positive_processes,
            loo_min=sens.loo_min, loo_max=sens.loo_max, mean_no_iid=sens.mean_no_iid,
            p_no_iid=sens.p_no_iid, gap_closed=sens.gap_closed,
            gap_closed_by_process=json.dumps(sens.gap_closed_by_process, sort_keys=True),
            gain_q1=quart[0], gain_q2=quart[1], gain_q3=quart[2], gain_q4=quart[3]))
    return out


def _partial(values: Sequence[RunValue], records: Sequence[Mapping[str, Any]], *, rule: str,
             baseline: str, metric: str, setting: str, confidence: float, weighting: str,
             hib: bool, exact_max_units: int, draws: int, seed: int) -> tuple:
    """One comparison before Holm: the values and records of one setting."""
    pd = pair_values(values, rule=rule, baseline=baseline, metric=metric, setting=setting)
    interval = stratified_interval(pd.unit_diffs, pd.unit_strata, confidence=confidence,
                                   weighting=weighting)
    weights = unit_weights(pd.unit_strata, weighting=weighting)
    p_perm, method = sign_flip_pvalue(pd.unit_diffs, weights=weights,
                                      exact_max_units=exact_max_units, draws=draws, seed=seed)
    sens = design_sensitivity(pd, values, weighting=weighting, higher_is_better=hib,
                              exact_max_units=exact_max_units, draws=draws, seed=seed)
    quart = quartile_gains(records, rule=rule, baseline=baseline, weighting=weighting,
                           setting=setting)
    return (rule, pd, interval, p_perm, method, wilcoxon_pvalue(pd.cell_means), sens, quart)


def comparisons_to_csv(comparisons: Sequence[Comparison], path: str | Path) -> Path:
    """Write one CSV row per comparison with columns :data:`CSV_COLUMNS` (docs/concepts/statistics.md#paired-statistics).

    Floats are written with ``repr`` precision; undefined values as ``nan``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            for comp in comparisons:
                writer.writerow(asdict(comp))
    except OSError as exc:
        raise SfgError(f"cannot write comparisons CSV {path}: {exc.strerror}; choose a "
                       "writable path") from None
    return path
