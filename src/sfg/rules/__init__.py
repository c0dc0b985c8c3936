"""Aggregation rules (SPEC §3): registry, parsing, the shared normalisation kernel, both forms.

Usage::

    rule = parse_rule("sfg-cut:L=2")                 # or "sfg-l:gamma=0.3+ipw", "aoi+ipw"
    w = rule.weights(slots)                          # batched: all receivers of a round
    w = rule.weights_one(ages=[3, 0, 1], lags=[3.0, 0.5, 1.2], counts=[4, 9, 8], t=10)

``weights_one`` is the one-receiver form for real systems: the receiver's candidates' staleness
scalars in (index 0 = the receiver itself), normalised weights out.

Universal parameters and modifiers (composable with every rule):

* ``c`` — base self-weight: the receiver's score is multiplied by c (default 1; ``self-weight``
  defaults to 0.5).
* ``+ipw`` — each neighbour's score is divided by the link-reception estimate q̂_ij (§3.1).
* ``+rounded`` — lags are rounded to integers before scoring ("rounded ties" for ``gamma=0``).
* ``+catchup`` — a returning client runs K·(1 + min(τ_i, 3)) local steps (training only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SfgError
from ..spec import Component, Registry, did_you_mean, parse_component
from . import library as L
from .slots import BatchSlots, ReceiverSlots, Slots

RULES = Registry("rule")
MODIFIERS = ("ipw", "rounded", "catchup")
UNIVERSAL = {"c": 1.0}

_G = {"gamma": 0.5}


def register_rule(name: str, fn: Callable[..., np.ndarray] | None, *, params: dict | None = None,
                  tags: tuple[str, ...] = (), doc: str = "", **flags: Any) -> None:
    """Register a rule. ``tags``: "sfg" (SFG family), "baseline", "control", "model" (reads
    model parameters: only the training simulator can run it), "random" (uses its own stream)."""
    RULES.register(name, fn, params={**UNIVERSAL, **(params or {})}, tags=tags,
                   doc=doc or (fn.__doc__ or "").strip().split("\n")[0] if fn else doc)
    RULES.entry(name).flags = flags  # type: ignore[attr-defined]


register_rule("sfg", L.sfg, params=_G, tags=("sfg",))
register_rule("sfg-l", L.sfg_l, params=_G, tags=("sfg",))
register_rule("sfg-cut", L.sfg_cut, params={"L": 1.0}, tags=("sfg",))
register_rule("sfg-counts", L.sfg_counts, params=_G, tags=("sfg",))
register_rule("dfedavg", L.dfedavg, tags=("baseline",))
register_rule("local", L.local, tags=("baseline",))
register_rule("aoi", L.aoi, params=_G, tags=("baseline",))
register_rule("dfl-aa", L.dfl_aa, params=_G, tags=("baseline",))
register_rule("gl-age", L.gl_age, tags=("baseline",))
register_rule("limited-merging", L.limited_merging, params={"L": 1.0}, tags=("baseline",))
register_rule("local-counts", L.local_counts, params={"L": 1.0}, tags=("baseline",))
register_rule("update-amplification", L.update_amplification, params={"c": 1.0},
              tags=("baseline",), amplify=True)
register_rule("self-weight", L.self_weight, params={"c": 0.5}, tags=("control",))
register_rule("self-only", L.self_only, params={"base": 0.5}, tags=("control",))
register_rule("reset-on-return", L.reset_on_return, tags=("control",))
register_rule("neighbour-only-lags", L.neighbour_only_lags, params=_G, tags=("control",))
register_rule("neighbour-only-counts", L.neighbour_only_counts, params=_G, tags=("control",))
register_rule("pinned-receiver", L.pinned_receiver, params=_G, tags=("control",))
register_rule("copy-random", L.copy_random, tags=("control", "random"))
register_rule("placebo-cut", L.placebo_cut, params={"L": 1.0}, tags=("control", "random"))
register_rule("cut-ages", L.cut_ages, tags=("control",))
register_rule("receiver-kept", L.receiver_kept, params={"L": 1.0}, tags=("control",))
register_rule("oracle-gls", L.oracle_gls, params={"kappa": 1.0}, tags=("oracle",))
register_rule("oracle-qp", L.oracle_qp, params={"kappa": 1.0}, tags=("oracle",))
# Model-reading rules (SPEC §3.2): implemented in sfg.sim.model_rules (training only).
register_rule("model-memory", None, tags=("baseline", "model"),
              doc="MIFA analogue: remembered models of offline neighbours averaged in, undiscounted")
register_rule("model-memory+sfg", None, params={"gamma": 0.5}, tags=("baseline", "model"),
              doc="model memory with SFG weights on ages (age at reception + rounds since)")
register_rule("model-memory+sfg-l", None, params={"gamma": 0.5}, tags=("baseline", "model"),
              doc="model memory with SFG-L weights on lags (lag at reception + rounds since)")
register_rule("relative-variance", None, params={"nu": 0.2}, tags=("baseline", "model"),
              doc="diffusion-adaptation combiner: h_ij = 1/v_ij, EWMA of squared model distances")
register_rule("pwg", None, params={"H": 1.0, "rho": -1.0}, tags=("baseline", "model"),
              doc="precision-weighted gossip on ages: h = 1/(1 + rho*relative age); rho<0 = estimate online")
register_rule("pwg-l", None, params={"H": 1.0, "rho": -1.0}, tags=("baseline", "model"),
              doc="precision-weighted gossip on lags: h = 1/(1 + rho*relative lag); rho<0 = estimate online")



def _validate(name: str, params: dict[str, Any]) -> None:
    for key, value in params.items():
        if key in ("gamma", "L", "c", "base", "kappa") and not isinstance(value, (int, float)):
            raise SfgError(f"rule {name!r}: {key} must be a number, got {value!r}")
    if "gamma" in params and not 0.0 <= params["gamma"] <= 1.0:
        raise SfgError(f"rule {name!r}: gamma={params['gamma']} must lie in [0, 1] "
                       "(0 keeps only the freshest candidates, 1 ignores staleness)")
    if "L" in params and params["L"] < 0:
        raise SfgError(f"rule {name!r}: margin L={params['L']} must be >= 0")
    if "base" in params and not 0.0 <= params["base"] <= 1.0:
        raise SfgError(f"rule {name!r}: base={params['base']} must lie in [0, 1]")
    if "kappa" in params and params["kappa"] < 0:
        raise SfgError(f"rule {name!r}: kappa={params['kappa']} must be >= 0")
    if "c" in params and params["c"] < 0:
        raise SfgError(f"rule {name!r}: self-weight c={params['c']} must be >= 0")


@dataclass(frozen=True)
class Rule:
    """A parsed, validated rule: name, parameters (defaults filled in) and modifiers."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    modifiers: tuple[str, ...] = ()
    text: str = ""

    # ----------------------------------------------------------- properties
    @property
    def tags(self) -> frozenset[str]:
        return RULES.entry(self.name).tags

    @property
    def flags(self) -> dict[str, Any]:
        return getattr(RULES.entry(self.name), "flags", {})

    @property
    def reads_models(self) -> bool:
        return "model" in self.tags

    @property
    def oracle(self) -> bool:
        """Reads the missed-fraction matrix A (global information; analysis only, SPEC §3.4)."""
        return "oracle" in self.tags

    @property
    def random(self) -> bool:
        return "random" in self.tags

    @property
    def ipw(self) -> bool:
        return "ipw" in self.modifiers

    @property
    def catchup(self) -> bool:
        return "catchup" in self.modifiers

    @property
    def amplify(self) -> float | None:
        """Update-amplification cap c, or None."""
        return float(self.params["c"]) if self.flags.get("amplify") else None

    def __str__(self) -> str:
        return self.text or self.name

    # ----------------------------------------------------------- scores and weights
    def scores(self, s: Slots) -> np.ndarray:
        """Unnormalised scores h over the slots, modifiers applied (before masking)."""
        if self.reads_models:
            raise SfgError(f"rule {self.name!r} reads model parameters; run it with `sfg run`, "
                           "not in a model-free replay")
        if "rounded" in self.modifiers:
            s = s.with_lags(np.rint(s.lag))
        fn = RULES.entry(self.name).factory
        kw = {k: v for k, v in self.params.items() if k != "c"}
        if self.flags.get("amplify"):
            kw["c"] = self.params["c"]
        h = np.asarray(fn(s, **kw), dtype=np.float64)
        if self.ipw:
            h = np.where(s.is_self, h, h / s.q)
        c = self.params.get("c", 1.0)
        if c != 1.0 and not self.flags.get("amplify"):
            h = np.where(s.is_self, h * c, h)
        return h

    def weights(self, s: BatchSlots, aggregating: np.ndarray | None = None) -> np.ndarray:
        """Row-stochastic slot weights for every receiver of a round ([E] float64)."""
        return normalise(self.scores(s), s, aggregating)

    def weights_one(self, *, ages, lags=None, counts=None, local_counts=None, q_hat=None,
                    t: int | None = None, u: float = 0.5, keys=None, missed=None) -> np.ndarray:
        """One receiver's weights over its candidates; index 0 is the receiver (SPEC §1 step 2).

        ages [k] int, lags [k] float (default = ages), counts [k] int (default 1),
        local_counts [k] int (default = counts), q_hat [k] float (receiver's estimate per
        candidate; entry 0 ignored, default 1), t = round index (default max lag), u = this
        receiver's uniform draw (copy-random), keys [k] uniform keys (placebo-cut), missed
        [k, T] the candidates' rows of A (oracles).
        """
        s = receiver_slots(ages=ages, lags=lags, counts=counts, local_counts=local_counts,
                           q_hat=q_hat, t=t, u=u, keys=keys, missed=missed)
        return normalise(self.scores(s), s)


def receiver_slots(*, ages, lags=None, counts=None, local_counts=None, q_hat=None,
                   t: int | None = None, u: float = 0.5, keys=None, missed=None) -> ReceiverSlots:
    ages = np.asarray(ages, dtype=np.int64).reshape(-1)
    k = ages.shape[0]
    if k < 1:
        raise SfgError("a receiver needs at least itself as a candidate (index 0)")
    lags = ages.astype(np.float64) if lags is None else np.asarray(lags, np.float64).reshape(-1)
    counts = np.ones(k, np.int64) if counts is None else np.asarray(counts, np.int64).reshape(-1)
    local_counts = counts if local_counts is None else np.asarray(local_counts, np.int64).reshape(-1)
    q = np.ones(k) if q_hat is None else np.asarray(q_hat, np.float64).reshape(-1).copy()
    q[0] = 1.0
    keys = np.linspace(0, 1, k) if keys is None else np.asarray(keys, np.float64).reshape(-1)
    for name, arr in (("lags", lags), ("counts", counts), ("local_counts", local_counts),
                      ("q_hat", q), ("keys", keys)):
        if arr.shape[0] != k:
            raise SfgError(f"{name} has {arr.shape[0]} entries but ages has {k}; give one per candidate")
    if t is None:
        t = int(np.ceil(lags.max())) if k else 0
    is_self = np.zeros(k, bool)
    is_self[0] = True
    return ReceiverSlots(t=int(t), is_self=is_self, cand=np.ones(k, bool), age=ages, lag=lags,
                         count=counts, local_count=local_counts, q=q, u=np.full(k, float(u)),
                         key=keys, missed=None if missed is None else np.asarray(missed, float))


def normalise(h: np.ndarray, s: Slots, aggregating: np.ndarray | None = None) -> np.ndarray:
    """The shared kernel (SPEC §1): mask to candidates, normalise rows, identity rows for
    receivers that do not aggregate, w_ii = 1 for all-zero (or non-finite) rows."""
    h = np.where(s.cand & np.isfinite(h), np.maximum(h, 0.0), 0.0)
    row = s.sum(h)
    ok = row > 0
    if aggregating is not None:
        ok &= aggregating[s.rg.recv]  # type: ignore[attr-defined]
    w = np.where(ok, h / np.where(ok, row, 1.0), 0.0)
    return np.where(ok, w, s.is_self.astype(np.float64))


def parse_rule(text: str | Component) -> Rule:
    """Parse and validate ``"name:key=value,...+modifier"``; did-you-mean on unknown names."""
    comp = text if isinstance(text, Component) else parse_component(text, kind="rule")
    name = comp.name
    modifiers = list(comp.modifiers)
    # model-memory+sfg style variants are registered under their full name
    if modifiers and f"{name}+{modifiers[0]}" in RULES:
        name = f"{name}+{modifiers.pop(0)}"
    if name not in RULES:
        RULES.entry(name)  # raises with did-you-mean
    for m in modifiers:
        if m not in MODIFIERS:
            raise SfgError(f"unknown rule modifier '+{m}' in {comp.text!r}"
                           f"{did_you_mean(m, MODIFIERS)}")
    params = RULES.check_params(name, comp.params)
    _validate(name, params)
    if "model" in RULES.entry(name).tags:
        unsupported = [f"+{m}" for m in modifiers if m != "catchup"]
        if params.get("c", 1.0) != 1.0:
            unsupported.append("c")
        if unsupported:
            raise SfgError(f"rule {name!r} reads model parameters and does not support "
                           f"{', '.join(unsupported)}; only +catchup composes with it")
    return Rule(name=name, params=params, modifiers=tuple(modifiers), text=comp.text or name)


def rule_names(tag: str | None = None) -> list[str]:
    return RULES.names(tag)


__all__ = ["RULES", "Rule", "parse_rule", "rule_names", "normalise", "register_rule",
           "BatchSlots", "ReceiverSlots", "Slots", "receiver_slots"]
