"""The units reports show and the titles their plots carry (no third-party imports).

Tables and plots give accuracies in per cent and differences of accuracies (gains, paired
differences, their intervals) in percentage points ("pp"): a gain of 0.0123 in ``acc_mean`` is
shown as +1.23 pp. Metrics that are not accuracies (ages, lags, weights, shares, losses) keep
their own units. Machine-readable outputs (``comparisons.csv``, ``attack.csv``, the diagnostics
CSVs, every ``--json``) keep the raw fractions, which scripts read.

A plot stands alone in a paper draft or a slide: :func:`context` names its dataset(s),
outage process(es) and seeds, taken from the rows the plot is made from.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

PP = "pp"  # percentage points

METRIC_NAMES = {
    "acc_mean": "mean accuracy",
    "acc_p10": "10th-percentile accuracy",
    "acc_time_avg": "time-averaged mean accuracy",
    "acc_honest_mean": "honest clients' mean accuracy",
    "acc_honest_p10": "honest clients' 10th-percentile accuracy",
    **{f"acc_q{q}": f"mean accuracy of availability quartile {q}" for q in range(1, 5)},
}


def is_accuracy(metric: str) -> bool:
    """Whether ``metric`` is an accuracy in [0, 1] (shown in %, its differences in pp)."""
    return metric.startswith("acc")


def scale(metric: str) -> float:
    """Factor from a stored value of ``metric`` to the shown one (100 for accuracies)."""
    return 100.0 if is_accuracy(metric) else 1.0


def metric_label(metric: str) -> str:
    """"mean accuracy (acc_mean)"; an unknown key as itself."""
    name = METRIC_NAMES.get(metric)
    return f"{name} ({metric})" if name else metric


def gain_unit(metric: str) -> str:
    """Unit of a difference of ``metric``: "pp" for accuracies, "" otherwise."""
    return PP if is_accuracy(metric) else ""


def with_unit(text: str, unit: str) -> str:
    """``text (unit)``, or ``text`` without a unit."""
    return f"{text} ({unit})" if unit else text


def percent(x: float | None, digits: int = 2) -> str:
    """An accuracy fraction in per cent ("86.13"); "—" when undefined."""
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}"


def points(x: float | None, digits: int = 2, *, metric: str = "acc_mean") -> str:
    """A difference, signed, in the shown unit of ``metric`` (pp for accuracies:
    0.0123 -> "+1.23"; others with four decimals); "—" when undefined."""
    if x is None or not math.isfinite(x):
        return "—"
    if is_accuracy(metric):
        return f"{100 * x:+.{digits}f}"
    return f"{x:+.4f}"


def seeds_text(seeds: Iterable[int]) -> str:
    """"seed 3", "seeds 1–5", "seeds 1–3, 7" (runs of consecutive seeds as ranges)."""
    s = sorted({int(x) for x in seeds})
    if not s:
        return "no seeds"
    parts, start, prev = [], s[0], s[0]
    for x in [*s[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(str(start) if start == prev else
                     f"{start}, {prev}" if prev == start + 1 else f"{start}–{prev}")
        if x is not None:
            start = prev = x
    return ("seed " if len(s) == 1 else "seeds ") + ", ".join(parts)


def _names(kind: str, values: Iterable[Any]) -> str:
    v = list(dict.fromkeys(str(x) for x in values))
    if not v:
        return ""
    return (f"{kind} " if len(v) == 1 else f"{kind}es " if kind.endswith("s") else
            f"{kind}s ") + ", ".join(v)


def context(*, datasets: Iterable[Any] = (), processes: Iterable[Any] = (),
            seeds: Iterable[int] = (), extra: Iterable[str] = ()) -> str:
    """"dataset digits · processes none, bursty:u=0.8 · seeds 1–8" (empty parts left out)."""
    ds = list(dict.fromkeys(str(d) for d in datasets))  # in order of appearance
    procs = list(dict.fromkeys(str(p) for p in processes))
    seeds = list(seeds)
    parts = [_names("dataset", ds), _names("process", procs),
             seeds_text(seeds) if seeds else "", *extra]
    return " · ".join(p for p in parts if p)


def context_of(records: Iterable[Mapping[str, Any]], *, extra: Iterable[str] = ()) -> str:
    """:func:`context` of run records (``dataset``, ``process``, ``seed`` keys)."""
    records = list(records)
    return context(datasets=(r["dataset"] for r in records if r.get("dataset") is not None),
                   processes=(r["process"] for r in records if r.get("process") is not None),
                   seeds=(r["seed"] for r in records if isinstance(r.get("seed"), int)),
                   extra=extra)


def title(what: str, where: str, *, width: int = 110) -> str:
    """A plot title: what it shows, then the data it shows it on (wrapped to ``width``)."""
    lines = textwrap.wrap(what, width) + textwrap.wrap(where, width)
    return "\n".join(lines)
