"""Replay metrics (docs/concepts/replay.md#model-free-analyses), each defined once: name, table label, legend, accumulation, summary.

The round (:mod:`sfg.round.kernel`) records per-receiver facts (:data:`sfg.round.kernel.FACTS`) on the state
before each round; a metric here says how its total accumulates over (round, receiver) facts
and how it is summarised (a sum, a ratio of two totals, or a value of the finished run), and
the replay rows (JSON), the command line's table and legend and the staleness plot all read
this list. Adding a metric = one entry in :data:`METRICS` (plus a fact in the round when it
needs one the round does not record yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# names of the round's per-receiver facts (kept equal to sfg.round.kernel.FACTS, tested; repeated
# here so that the command line can build its table without importing numba)
FACT_NAMES = ("adopt", "age", "lag", "neighbours", "max_neighbour_age", "spread_age",
              "spread_lag", "kept", "self_weight", "attacker_weight", "honest", "clamped")


class Facts:
    """Facts [..., receivers, F] with one attribute per fact, plus the derived events."""

    def __init__(self, a: np.ndarray):
        self.a = a
        for k, name in enumerate(FACT_NAMES):
            setattr(self, name, a[..., k])
        self.adopted = self.adopt > 0
        self.aggregation = self.adopted & (self.neighbours >= 1)  # adopted with ≥ 1 live neighbour
        self.returning = self.adopted & (self.age >= 1)
        self.return_with_neighbours = self.returning & self.aggregation
        self.honest_aggregation = self.aggregation & (self.honest > 0)  # by a non-attacker


@dataclass(frozen=True)
class RunEnd:
    """What a finished replay gives the run-level metrics."""

    available: np.ndarray   # [T, N] bool
    H: np.ndarray           # H of every (start, receiver) pair followed
    sampled: bool           # H on a sample of the pairs
    final_lags: np.ndarray  # [N]
    reach: float = 0.0      # attackers' reach (sfg.round.attacks.Reach); 0 without attackers


@dataclass(frozen=True)
class Metric:
    """A replay metric. Exactly one of ``total`` (with ``per`` for a ratio), ``value`` or
    ``curve`` is set. ``label``/``legend``: the table column and its explanation (None: JSON
    only)."""

    name: str
    label: str | None = None
    legend: str | None = None
    total: Callable[[Facts], np.ndarray] | None = None
    per: Callable[[Facts], np.ndarray] | None = None
    value: Callable[[RunEnd], float] | None = None
    curve: Callable[[Facts], np.ndarray] | None = None  # [rounds] from [rounds, N] facts
    attack: bool = False  # a damage measure of forged claims: reported only under an attack
    defence: bool = False  # reported only when the rule has a defence (sfg.round.defences)


def _H_se(r: RunEnd) -> float:
    return float(r.H.std(ddof=1) / np.sqrt(r.H.size)) if (r.sampled and r.H.size > 1) else 0.0


METRICS: tuple[Metric, ...] = (
    Metric("unavailability", "unavail", "realised offline fraction",
           value=lambda r: float(1.0 - r.available.mean())),
    # aggregations at age >= 1 (not returns in time: the clock's ``returns``, sfg.metrics)
    Metric("returning_aggregations", "returns", "aggregations by a returning client (τ≥1)",
           total=lambda f: f.returning),
    Metric("returning_aggregations_heard", "ret heard", "share of returns that hold a live "
           "neighbour's model "
           "(on the virtual clock, a device can wake before it hears anyone)",
           total=lambda f: f.return_with_neighbours, per=lambda f: f.returning),
    Metric("premise", "stalest",
           "share of returns where the receiver is strictly the stalest candidate",
           total=lambda f: f.return_with_neighbours & (f.age > f.max_neighbour_age),
           per=lambda f: f.return_with_neighbours),
    Metric("spread_age", "Δage", "mean largest relative age/lag among candidates",
           total=lambda f: np.where(f.aggregation, f.spread_age, 0.0),
           per=lambda f: f.aggregation),
    Metric("spread_lag", "Δlag", None,
           total=lambda f: np.where(f.aggregation, f.spread_lag, 0.0),
           per=lambda f: f.aggregation),
    Metric("kept", "kept", "candidates with weight > 0",
           total=lambda f: np.where(f.aggregation, f.kept, 0.0), per=lambda f: f.aggregation),
    Metric("self_weight_return", "w_ii ret", "receiver self-weight on return",
           total=lambda f: np.where(f.return_with_neighbours, f.self_weight, 0.0),
           per=lambda f: f.return_with_neighbours),
    Metric("H", "H", "receiver self-return over 50 rounds",
           value=lambda r: float(r.H.mean()) if r.H.size else float("nan")),
    Metric("H_se", value=_H_se),
    Metric("H_pairs", value=lambda r: float(r.H.size)),
    Metric("messages", total=lambda f: f.neighbours),
    # damage of forged claims (sfg.round.attacks), over aggregations by honest receivers
    Metric("attack_weight", "w→att", "mean weight honest receivers give attackers",
           total=lambda f: np.where(f.honest_aggregation, f.attacker_weight, 0.0),
           per=lambda f: f.honest_aggregation, attack=True),
    Metric("self_cut", "self cut", "share of honest aggregations whose own model is cut (w_ii=0)",
           total=lambda f: f.honest_aggregation & (f.self_weight == 0.0),
           per=lambda f: f.honest_aggregation, attack=True),
    Metric("reach", "reach", "share of honest clients whose model carries >= 10% attacker "
           "weight at the end of each horizon window", value=lambda r: r.reach, attack=True),
    Metric("clamped", total=lambda f: f.clamped, defence=True),
    Metric("final_mean_lag", value=lambda r: float(r.final_lags.mean())),
    Metric("mean_age", "mean age τ", curve=lambda f: f.age.mean(axis=-1)),
    Metric("mean_lag", "mean effective lag ℓ", curve=lambda f: f.lag.mean(axis=-1)),
)


def columns(attack: bool = False) -> list[tuple[str, str]]:
    """(name, label) of the metrics a table shows, in order (with the damage measures of
    forged claims when ``attack``)."""
    return [(m.name, m.label) for m in METRICS if m.label and m.curve is None
            and (attack or not m.attack)]


def legend(attack: bool = False) -> str:
    """The table's legend; a metric without a legend shares the previous one's ("Δage/Δlag")."""
    parts: list[list[str]] = []
    for m in METRICS:
        if not m.label or m.curve is not None or (m.attack and not attack):
            continue
        if m.legend is None and parts:
            parts[-1][0] += f"/{m.label}"
        else:
            parts.append([m.label, m.legend or ""])
    return " · ".join(f"{label}: {text}" for label, text in parts)


def curves() -> list[Metric]:
    return [m for m in METRICS if m.curve is not None]


class Accumulator:
    """Totals of every accumulated metric over blocks of rounds, and the per-round curves."""

    def __init__(self) -> None:
        self.num = {m.name: 0.0 for m in METRICS if m.total is not None}
        self.den = {m.name: 0.0 for m in METRICS if m.per is not None}
        self.curves: dict[str, list[np.ndarray]] = {m.name: [] for m in curves()}

    def add(self, facts: np.ndarray) -> None:
        """Facts of a block of rounds, [rounds, N, F]."""
        f = Facts(facts)
        for m in METRICS:
            if m.total is not None:
                self.num[m.name] += float(np.sum(m.total(f)))
            if m.per is not None:
                self.den[m.name] += float(np.sum(m.per(f)))
            if m.curve is not None:
                self.curves[m.name].append(m.curve(f))

    def summary(self, end: RunEnd, *, attack: bool = True, defence: bool = True
                ) -> tuple[dict[str, float], dict[str, list[Any]]]:
        """(metrics in :data:`METRICS` order, curves with their ``round`` axis); the damage
        measures only with ``attack``, the defences' counts only with ``defence``."""
        out: dict[str, float] = {}
        for m in METRICS:
            if (m.attack and not attack) or (m.defence and not defence):
                continue
            if m.value is not None:
                out[m.name] = m.value(end)
            elif m.per is not None:
                d = self.den[m.name]
                out[m.name] = float(self.num[m.name] / d) if d else float("nan")
            elif m.total is not None:
                out[m.name] = float(self.num[m.name])
        T = end.available.shape[0]
        cur: dict[str, list[Any]] = {"round": list(range(T))}
        for name, parts in self.curves.items():
            cur[name] = np.concatenate(parts).tolist() if parts else []
        return out, cur
