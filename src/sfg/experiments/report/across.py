"""Paired comparisons *across* one setting: ``sfg report --across FIELD=A,B`` (docs/concepts/statistics.md#across-one-setting).

The ordinary report pairs rules within a setting. :func:`across_report` pairs each run whose
config has ``FIELD = A`` with the run that differs from it *only* in that field (``FIELD = B``;
same rule, dataset, process, seed and every other setting), for every rule — DFedAvg
included — and reports per (rule, remaining setting) the paired difference B − A:

* of the final accuracy ``acc_mean``, and, for runs on the virtual clock, of the time to the
  target accuracy (:func:`sfg.experiments.report.clock.time_to_target`, hours; negative =
  B is faster) over the pairs where both runs reached the target — the pairs where one or both
  never did are counted per kind, never given a number, as in the report's time table;
* with the method of :func:`sfg.experiments.stats.compare` (docs/concepts/statistics.md#paired-statistics): the
  stratified interval over (dataset, seed) units, the exact sign-flip test (smallest p
  ``2^(1−U)`` with U units), Wilcoxon on cells, and Holm over the declared family — the
  comparisons of one table (one per rule and remaining setting) — with the verdict at the
  report's family-wise error rate.

Values are matched as the run config stores them, written as a setting label writes them
(:func:`sfg.experiments.stats.setting_value`: ``none``, ``pull:timeout=60``, ``0.5``); a
number given as ``0.50`` matches ``0.5``. A run whose config predates the field counts at
the field's default. The remaining setting of a run is its setting label
(:func:`sfg.experiments.stats.setting_labels`) computed as if the field were not there.

Files: ``across.csv`` (:func:`sfg.experiments.stats.comparisons_to_csv`, one row per
comparison: ``rule`` the rule, ``baseline`` ``FIELD=A``, ``setting`` the remaining setting,
``mean_gain`` = B − A) and ``across.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import field as _field
from pathlib import Path
from typing import Any

from sfg.errors import SfgError, check
from sfg.experiments.report import clock as _clock
from sfg.experiments.stats import (
    AXIS_KEYS,
    Comparison,
    compare,
    comparisons_to_csv,
    holm,
    setting_labels,
    setting_value,
    verdict,
)
from sfg.util.components import did_you_mean

ACROSS_FILES = ("across.csv", "across.md")
ACROSS_COLUMNS = ("rule", "setting", "metric", "B − A [CI]", "pairs", "units", "wins (B)",
                  "never reached (B only, A only, both)", "p perm", "p perm Holm", "p Wilcoxon",
                  "p Wilcoxon Holm", "verdict")


@dataclass(frozen=True)
class AcrossRow:
    """One comparison B − A of one rule in one remaining setting on one metric."""

    comparison: Comparison  # rule = the rule, baseline = "FIELD=A", mean_gain = B − A
    b_never: int = 0  # time to accuracy: pairs where B never reached the target, A did
    a_never: int = 0  # A never did, B did
    neither: int = 0

    @property
    def pairs(self) -> int:
        """Paired runs with a finite value on both sides (B − A was taken over these)."""
        return self.comparison.runs


@dataclass
class AcrossReport:
    """What :func:`across_report` computed and wrote."""

    field: str
    a: str
    b: str
    rows: list[AcrossRow]
    alpha: float
    confidence: float
    families: dict[str, int] = _field(default_factory=dict)  # metric -> m (Holm)
    files: dict[str, Path] = _field(default_factory=dict)
    notes: list[str] = _field(default_factory=list)
    markdown: str = ""


def parse_across(spec: str) -> tuple[str, list[str]]:
    """``"FIELD=A,B"`` → ``(FIELD, ["A", "B"])`` split at every comma (a value with commas,
    such as ``lognormal:median=30,sigma=1``, is put back together by :func:`across_report`
    from the values the runs have)."""
    name, eq, rest = str(spec).partition("=")
    name = name.strip()
    check(bool(eq) and name != "" and rest.strip() != "",
          f"--across {spec!r} is not FIELD=A,B; give a config field and two of its values, "
          "e.g. --across on_return=none,pull:timeout=60")
    return name, [p.strip() for p in rest.split(",")]


def _config(record: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = record.get("config")
    return cfg if isinstance(cfg, Mapping) else {}


def _defaults() -> dict[str, Any]:
    from sfg.experiments.config import RunConfig

    return {k: f.default for k, f in RunConfig.model_fields.items()}


def _same(given: str, stored: str) -> bool:
    if given == stored:
        return True
    try:
        return float(given) == float(stored)
    except ValueError:
        return False


def _join(pieces: Sequence[str], present: Sequence[str]) -> list[str] | None:
    """Split ``pieces`` (the spec cut at commas) into values present in the runs, each the
    shortest join that lets the rest match; None when no split matches."""
    if not pieces:
        return []
    for k in range(1, len(pieces) + 1):
        head = ",".join(pieces[:k])
        match = next((p for p in present if _same(head, p)), None)
        if match is not None:
            rest = _join(pieces[k:], present)
            if rest is not None:
                return [match, *rest]
    return None


def _values(records: Sequence[Mapping[str, Any]], name: str) -> list[str]:
    """Every record's value of ``name`` as a label writes it (the default when absent)."""
    defaults = _defaults()
    out = []
    for r in records:
        cfg = _config(r)
        out.append(setting_value(cfg[name] if name in cfg else defaults.get(name)))
    return out


def _resolve(records: Sequence[Mapping[str, Any]], name: str,
             pieces: Sequence[str]) -> tuple[list[str], list[str]]:
    """The records' values of ``name`` and the two values compared (checked: one line each)."""
    check(name not in AXIS_KEYS,
          f"--across {name}: {name} is an axis of the grid, not a setting; runs are already "
          "paired across it by the report")
    known = set(_defaults()) | {k for r in records for k in _config(r)}
    check(name in known, f"--across: unknown config field {name!r}"
          f"{did_you_mean(name, known - set(AXIS_KEYS))}")
    values = _values(records, name)
    present = list(dict.fromkeys(values))
    chosen = _join(pieces, present)
    if chosen is None:
        missing = [p for p in pieces if not any(_same(p, v) for v in present)]
        what = f"value {missing[0]!r}" if missing else f"values {','.join(pieces)!r}"
        raise SfgError(f"--across {name}: {what} is not in the store; its runs have "
                       f"{name} = {', '.join(sorted(present))}")
    check(len(chosen) == 2,
          f"--across {name}: give exactly two values A,B to compare (got "
          f"{len(chosen)}: {', '.join(chosen)}); e.g. --across {name}={','.join(present[:2])}")
    check(chosen[0] != chosen[1], f"--across {name}: A and B are both {chosen[0]!r}; give two "
          "different values")
    return values, chosen


def _relabelled(records: Sequence[Mapping[str, Any]], name: str, values: Sequence[str],
                a: str, b: str) -> list[dict[str, Any]]:
    """The runs with ``name`` = a or b, each with ``rule`` = its value of ``name``,
    ``_rule`` = its rule and ``setting`` = its setting without ``name``."""
    kept = [(r, v) for r, v in zip(records, values, strict=True) if v in (a, b)]
    stripped = [{**{k: x for k, x in r.items() if k != "setting"},
                 "config": {k: x for k, x in _config(r).items() if k != name}} for r, _ in kept]
    labels = setting_labels(stripped)
    return [{**{k: x for k, x in r.items() if k != "setting"}, "_rule": r["rule"], "rule": v,
             "setting": lab} for (r, v), lab in zip(kept, labels, strict=True)]


def _compare_per_rule(recs: Sequence[Mapping[str, Any]], *, metric: str, name: str, a: str,
                      b: str, alpha: float, confidence: float, weighting: str,
                      seed: int) -> tuple[list[AcrossRow], list[str]]:
    """One comparison B − A per (rule, remaining setting), Holm over all of them."""
    rows: list[AcrossRow] = []
    notes: list[str] = []
    for rule in dict.fromkeys(r["_rule"] for r in recs):
        mine = [r for r in recs if r["_rule"] == rule]
        sides = {r["rule"] for r in mine}
        if sides != {a, b}:
            notes.append(f"{rule}: no run with {name} = {b if a in sides else a} "
                         f"({metric}); not compared")
            continue
        for c in compare(mine, rules=[b], baseline=a, metric=metric, alpha=alpha,
                         confidence=confidence, weighting=weighting, seed=seed):
            here = [r for r in mine if r["setting"] == c.setting]
            if {r["rule"] for r in here} != {a, b}:
                notes.append(f"{rule} · {c.setting or 'rounds'}: {len(here)} run(s) only at "
                             f"{name} = {here[0]['rule']}, no partner ({metric}); not compared")
                continue
            counts = {}
            if metric == _clock.TTA:
                got = _clock.pair_counts(here, b, a)
                counts = {"b_never": got["rule_never"], "a_never": got["baseline_never"],
                          "neither": got["neither"]}
            rows.append(AcrossRow(replace(c, rule=rule, baseline=f"{name}={a}"), **counts))
    perm = holm([row.comparison.p_perm for row in rows])
    wil = holm([row.comparison.p_wilcoxon for row in rows])
    out = []
    for row, ph, wh in zip(rows, perm, wil, strict=True):
        c = row.comparison
        v = verdict(mean=c.mean_gain, low=c.ci_low, high=c.ci_high, p_adjusted=float(ph),
                    alpha=alpha, higher_is_better=c.higher_is_better)
        out.append(replace(row, comparison=replace(c, p_perm_holm=float(ph),
                                                   p_wilcoxon_holm=float(wh), verdict=v)))
    return out, notes


def resolution_note(rows: Sequence[AcrossRow], *, metric: str, alpha: float) -> str | None:
    """A line when no comparison of ``rows`` can be resolved: with U the most units of any
    comparison, the smallest exact sign-flip p is 2^(1−U), and Holm over the family of m
    comparisons needs 2^(1−U)·m < alpha; None when it can be (or there are no rows)."""
    if not rows:
        return None
    units = max(row.comparison.units for row in rows)
    m = len(rows)
    smallest = 2.0 ** (1 - units) if units > 0 else 1.0
    if smallest * m < alpha:
        return None
    return (f"{metric}: no comparison can be resolved: with U = {units} seeds (units) the "
            f"smallest exact sign-flip p is 2^(1−U) = {smallest:.3g}, and 2^(1−U)·m = "
            f"{smallest * m:.3g} ≥ {alpha:g} over the family of m = {m} comparisons; "
            f"{math.ceil(1 + math.log2(m / alpha)) if m else 1} seeds or more would be needed")


def across_report(records: Iterable[Mapping[str, Any]], *, across: str, out_dir: str | Path,
                  alpha: float = 0.05, confidence: float = 0.95, weighting: str = "unit",
                  seed: int = 0) -> AcrossReport:
    """Pair every run at ``FIELD = A`` with its run at ``FIELD = B`` (``across`` =
    ``"FIELD=A,B"``), compare B − A per rule and remaining setting (module docstring) and
    write ``across.csv`` and ``across.md`` into ``out_dir``. ``alpha``: the family-wise error
    rate of each table (Holm). Raises :class:`SfgError` on an unknown field, a value no run
    has, other than two values, or no pair."""
    records = [r for r in records if isinstance(r, Mapping)]
    check(len(records) > 0, "no run records to report; run a grid first")
    name, pieces = parse_across(across)
    check(len(pieces) >= 2, f"--across {across!r} names fewer than 2 values; give FIELD=A,B")
    values, (a, b) = _resolve(records, name, pieces)
    recs = _relabelled(records, name, values, a, b)
    rep = AcrossReport(field=name, a=a, b=b, rows=[], alpha=alpha, confidence=confidence)
    kw: dict[str, Any] = dict(name=name, a=a, b=b, alpha=alpha, confidence=confidence,
                              weighting=weighting, seed=seed)
    acc_rows, notes = _compare_per_rule(recs, metric="acc_mean", **kw)
    rep.notes += notes
    rep.rows += acc_rows
    rep.families["acc_mean"] = len(acc_rows)
    timed = _clock.time_records(recs)
    if timed:
        tta_rows, notes = _compare_per_rule(timed, metric=_clock.TTA, **kw)
        rep.notes += notes
        rep.rows += tta_rows
        rep.families[_clock.TTA] = len(tta_rows)
    check(any(row.pairs for row in rep.rows),
          f"--across {name}={a},{b}: no run at {name} = {a} has a run at {name} = {b} that "
          "differs from it only in that field; nothing to pair")
    for metric in rep.families:
        note = resolution_note([row for row in rep.rows if row.comparison.metric == metric],
                               metric=metric, alpha=alpha)
        if note:
            rep.notes.append(note)
    from sfg.experiments.report.paired import report_folder, write_markdown

    out = report_folder(out_dir)
    rep.files["across.csv"] = comparisons_to_csv([row.comparison for row in rep.rows],
                                                 out / "across.csv")
    rep.markdown = _markdown(rep)
    rep.files["across.md"] = write_markdown(out / "across.md", rep.markdown)
    return rep


# --------------------------------------------------------------------------- rendering


def _diff(c: Comparison) -> str:
    from sfg.util.units import points

    if c.runs == 0:
        return "— (no pair)"
    if c.metric == _clock.TTA:
        fmt = _clock.fmt_hours
    else:
        def fmt(x: float) -> str:
            return points(x, metric=c.metric)
    if math.isnan(c.ci_low):
        return f"{fmt(c.mean_gain)} [undefined, df={c.df}]"
    return f"{fmt(c.mean_gain)} [{fmt(c.ci_low)}, {fmt(c.ci_high)}]"


def across_cells(row: AcrossRow) -> list[str]:
    """The cells of ``row`` in :data:`ACROSS_COLUMNS` order (accuracy differences in pp, time
    differences in hours)."""
    c = row.comparison
    p = _clock.fmt_p
    tta = c.metric == _clock.TTA
    never = (f"{row.b_never + row.a_never + row.neither} ({row.b_never}, {row.a_never}, "
             f"{row.neither})") if tta else "—"
    metric = "time to target (h)" if tta else "acc_mean (pp)"
    return [c.rule, c.setting or "rounds", metric, _diff(c), str(c.runs), str(c.units),
            f"{c.wins}/{c.runs}", never, p(c.p_perm), p(c.p_perm_holm), p(c.p_wilcoxon),
            p(c.p_wilcoxon_holm), c.verdict]


def _markdown(rep: AcrossReport) -> str:
    from sfg.experiments.report.paired import markdown_table

    lines = [f"# sfg report — across {rep.field}: {rep.b} − {rep.a}", "",
             f"Each run at {rep.field} = {rep.a} paired with the run that differs from it only "
             f"in {rep.field} ({rep.field} = {rep.b}): same rule, dataset, process, seed and "
             "every other setting. Differences B − A: final accuracy in percentage points; "
             "time to the target accuracy in hours (negative = B faster), over the pairs "
             "where both runs reached the target (the others counted as never reached). "
             f"{rep.confidence:.0%} stratified interval over (dataset, seed) units, exact "
             "sign-flip test, Wilcoxon on (dataset × process) cells; Holm over the "
             + " and ".join(f"{m} comparisons of {metric}" for metric, m in rep.families.items())
             + f" (family-wise error rate {rep.alpha:g}). `across.csv` keeps the raw figures "
             f"(baseline = {rep.field}={rep.a}, mean_gain = B − A).", ""]
    lines += markdown_table(ACROSS_COLUMNS, [across_cells(row) for row in rep.rows])
    for note in rep.notes:
        lines.append(f"* Note: {note}")
    return "\n".join(lines) + "\n"


def print_across(rep: AcrossReport, *, console: Any) -> None:
    """The across table and its notes in the terminal (rich)."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"Across {rep.field}: {rep.b} − {rep.a} (paired; "
                        f"{rep.confidence:.0%} intervals; Holm over each metric's family)",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    shown = ("rule", "setting", "metric", "B − A [CI]", "pairs",
             "never reached (B only, A only, both)", "p perm", "p perm Holm", "verdict")
    index = [ACROSS_COLUMNS.index(c) for c in shown]
    for name in shown:
        table.add_column(name, overflow="fold", justify="left")
    for row in rep.rows:
        cells = across_cells(row)
        table.add_row(*(cells[i] for i in index))
    console.print(table)
    for note in rep.notes:
        console.print(f"note: {note}")
