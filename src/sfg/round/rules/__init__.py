"""Aggregation rules (docs/concepts/rules.md#scores-and-weights): the registry, parsing and the rule object.

A model-free rule is one compiled function over ONE receiver's candidates (index 0 = the
receiver) that returns non-negative scores; its parameters, defaults and valid ranges are its
signature's keyword defaults and their :class:`Range` annotations (``Annotated[float, R]``,
which type checkers read, or ``R`` alone), and ``@rule`` registers it
(see :mod:`sfg.round.rules.library`)::

    @rule("sfg", tags=("sfg",))
    @njit(cache=True)
    def sfg(x, gamma: Annotated[float, Unit] = 0.5):
        return gamma ** relative(x.age)

The shared round (:mod:`sfg.round.kernel`) masks, normalises and applies the modifiers, for the
replay, the training simulator and the one-receiver form alike::

    rule = parse_rule("sfg-cut:L=2")                 # or "sfg-l:gamma=0.3+ipw", "aoi+ipw"
    w = rule.weights_one(ages=[3, 0, 1], lags=[3.0, 0.5, 1.2], counts=[4, 9, 8], t=10)

Universal parameter and modifiers (written once, in :mod:`sfg.round.kernel`; compose with every rule):

* ``c`` — base self-weight: the receiver's score is multiplied by c (default 1). A rule that
  declares its own ``c`` owns it (``self-weight``: the self-weight itself, default 0.5;
  ``update-amplification``: the amplification cap).
* ``+ipw`` — each neighbour's score is divided by the link-reception estimate q̂_ij (docs/concepts/rules.md#the-sfg-family).
* ``+rounded`` — lags are rounded to integers before scoring ("rounded ties" for ``gamma=0``).
* ``+catchup`` — a returning client runs K·(1 + min(τ_i, 3)) local steps (training only).

Defences against forged staleness claims (:mod:`sfg.round.defences`; compose with every rule):
``+guard`` (receiver-side evidence), ``+relative`` (robust relative claims, parameter
``margin``), ``+cap`` (per-neighbour weight cap κ/|S_i|, parameter ``kappa``), ``+clip``
(model-reading clipping, training only), e.g. ``sfg-cut:L=2,kappa=3+guard+cap``.

Robust aggregators (model-reading, training only; :mod:`sfg.sim.robust`): the rule picks the
candidates and their weights, the defence replaces the weighted mean — ``+median``
(coordinate-wise weighted median), ``+trim`` (coordinate-wise weighted trimmed mean, ``beta``),
``+scclip`` (self-centred clipping with the adaptive radius, ``delta``), ``+balance``
(BALANCE's distance filter, ``balance_gamma``, ``balance_kappa``, ``balance_alpha``). At most
one model-reading defence (``+clip`` or one of these) per rule.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from sfg.errors import SfgError
from sfg.util.components import Component, Entry, Registry, did_you_mean, parse_component

MODIFIERS = ("ipw", "rounded", "catchup", "guard", "refute", "certified", "relative", "cap", "clip",
             "median", "trim", "scclip", "balance")
CATCHUP_CAP = 3
# the robust aggregators (sfg.sim.robust): model-reading, they replace the weighted mean
ROBUST = ("median", "trim", "scclip", "balance")


def catchup_steps(K: int, ages: np.ndarray) -> np.ndarray:
    """``+catchup``'s local steps for clients of own age τ = ``ages`` that train: K·(1 +
    min(τ, 3)) for a returning client (τ ≥ 1), else K — written once, for the rounds
    (:meth:`Rule.local_steps`), the clock's simulation and the node."""
    ages = np.asarray(ages, np.int64)
    return np.where(ages >= 1, K * (1 + np.minimum(ages, CATCHUP_CAP)), K).astype(np.int64)
MODEL_DEFENCES = ("clip",) + ROBUST  # read the models: training only, at most one per rule
# a defence parameter's valid range: (low, high, high included, what it is)
_DEFENCE_RANGES = {
    "margin": (0.0, math.inf, True, "the +relative defence"),
    "kappa": (1.0, math.inf, True, "the +cap defence"),
    "beta": (0.0, 0.5, False, "the +trim defence: the weight share trimmed from each tail"),
    "delta": (0.0, 0.5, False, "the +scclip defence: the assumed attackers' weight share"),
    "scclip_tau": (0.0, math.inf, True, "the +scclip defence: a fixed radius (0: adaptive)"),
    "scclip_rank": (0.0, 1024.0, True, "the +scclip defence: the k-th largest neighbour "
                    "distance as the radius (0: the delta rule)"),
    "balance_gamma": (0.0, math.inf, True, "the +balance defence: the acceptance radius"),
    "balance_kappa": (0.0, math.inf, True, "the +balance defence: the radius's decay"),
    "balance_alpha": (0.0, 1.0, True, "the +balance defence: the receiver's own share"),
}


@dataclass(frozen=True)
class Range:
    """A parameter's valid closed range, used as its annotation in a rule's signature."""

    lo: float = -math.inf
    hi: float = math.inf
    why: str = ""

    def check(self, rule: str, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SfgError(f"rule {rule!r}: {key} must be a number, got {value!r}")
        if not (self.lo <= value <= self.hi):  # NaN fails too
            where = (f"must lie in [{self.lo:g}, {self.hi:g}]" if math.isfinite(self.hi)
                     else f"must be >= {self.lo:g}")
            why = f" ({self.why})" if self.why else ""
            raise SfgError(f"rule {rule!r}: {key}={value} {where}{why}")


Unit = Range(0.0, 1.0)
Discount = Range(0.0, 1.0, "0 keeps only the freshest candidates, 1 ignores staleness")
NonNegative = Range(0.0)
SELF_WEIGHT = Range(0.0, why="the receiver's score is multiplied by c")


@dataclass
class RuleEntry(Entry):
    """A registered rule: its compiled function (``factory``; None for model-reading rules),
    parameters with defaults, tags, and what the round needs to know about it."""

    ranges: dict[str, Range] = field(default_factory=dict)
    own_c: bool = False  # the rule declares its own ``c`` (the self-weight modifier is off)
    amplify: str | None = None  # the parameter capping update amplification in training
    scalars: bool = True  # its weights read staleness scalars that messages must carry


RULES = Registry("rule", RuleEntry)


def _entry(name: str) -> RuleEntry:
    entry = RULES.entry(name)
    assert isinstance(entry, RuleEntry)
    return entry


def _range_of(annotation: Any) -> Range:
    """A parameter's range: ``Annotated[float, R]`` (what type checkers read) or ``R`` itself."""
    if isinstance(annotation, Range):
        return annotation
    for meta in getattr(annotation, "__metadata__", ()):  # typing.Annotated
        if isinstance(meta, Range):
            return meta
    return Range()


def _signature_params(fn: Callable[..., Any] | None) -> dict[str, tuple[float, Range]]:
    """{name: (default, range)} from a compiled rule's keyword parameters (after ``x``)."""
    if fn is None:  # model-reading rules: no compiled function
        return {}
    py = getattr(fn, "py_func", fn)
    out = {}
    for k, p in list(inspect.signature(py).parameters.items())[1:]:
        if p.default is inspect.Parameter.empty:
            raise TypeError(f"rule parameter {k!r} of {py.__name__} needs a default")
        out[k] = (float(p.default), _range_of(p.annotation))
    return out


@functools.cache
def _arg_names(fn: Callable[..., Any] | None) -> tuple[str, ...]:
    """The keyword parameters' names of :func:`_signature_params`, read once per function
    (``Rule.args`` is asked at every one-receiver call: a networked node's every round)."""
    return tuple(_signature_params(fn))


def rule(name: str, *, tags: tuple[str, ...] = (), amplify: str | None = None,
         scalars: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a compiled one-receiver rule ``fn(x, **params) -> scores [k]``.

    tags: "sfg", "baseline", "control"; "random" when it reads the draws ``x.u``/``x.key``.
    amplify: name of the parameter that caps FedAWE-style update amplification in training.
    scalars: False when its weights read no staleness scalar (messages carry none)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = _signature_params(fn)
        params = {k: d for k, (d, _) in sig.items()}
        if "c" not in params:
            params["c"] = 1.0
        py = getattr(fn, "py_func", fn)
        RULES.register(name, fn, params=params, tags=tags,
                       doc=(py.__doc__ or "").strip().split("\n")[0],
                       ranges={"c": SELF_WEIGHT, **{k: r for k, (_, r) in sig.items()}},
                       own_c="c" in sig, amplify=amplify, scalars=scalars)
        return fn

    return deco


def register_rule(name: str, fn: Callable[..., Any] | None, *,
                  params: dict[str, Any] | None = None, tags: tuple[str, ...] = (), doc: str = "",
                  ranges: dict[str, Range] | None = None) -> None:
    """Register a rule that is not a compiled one-receiver function: model-reading rules
    (``fn`` None, tag "model"; run by :mod:`sfg.sim.model_rules`) and oracles (tag "oracle";
    :mod:`sfg.round.rules.oracles`)."""
    RULES.register(name, fn, params={"c": 1.0, **(params or {})}, tags=tags, doc=doc,
                   ranges={"c": SELF_WEIGHT, **(ranges or {})})


@dataclass(frozen=True)
class Rule:
    """A parsed, validated rule: name, parameters (defaults filled in) and modifiers.

    The simulator and the replay ask it what they need (``reads_models``, ``oracle``,
    ``random``, ``catchup``, ``amplify``, ``scalars_per_message``)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    modifiers: tuple[str, ...] = ()
    text: str = ""

    @property
    def entry(self) -> RuleEntry:
        return _entry(self.name)

    @property
    def tags(self) -> frozenset[str]:
        return self.entry.tags

    @property
    def fn(self) -> Callable[..., Any] | None:
        """The compiled one-receiver function (None for model-reading rules)."""
        return self.entry.factory

    @property
    def scorer(self) -> Callable[..., Any]:
        """The compiled function (a one-receiver rule's or an oracle's); an error for a rule
        that reads models."""
        fn = self.fn
        if fn is None:
            raise SfgError(f"rule {self.name!r} reads model parameters; run it with `sfg run`, "
                           "not in a model-free replay")
        return fn

    @property
    def compiled(self) -> bool:
        """Runs in the compiled round (every model-free rule but the oracles)."""
        return self.fn is not None and not self.oracle

    @property
    def reads_models(self) -> bool:
        return "model" in self.tags

    @property
    def oracle(self) -> bool:
        """Reads the missed-fraction matrix A (global information; analysis only, docs/concepts/rules.md#oracles)."""
        return "oracle" in self.tags

    @property
    def random(self) -> bool:
        """Reads its own draws (stream ``rule-draws`` keyed by the seed and the round)."""
        return "random" in self.tags

    @property
    def ipw(self) -> bool:
        return "ipw" in self.modifiers

    @property
    def rounded(self) -> bool:
        return "rounded" in self.modifiers

    @property
    def catchup(self) -> bool:
        return "catchup" in self.modifiers

    @property
    def self_weight(self) -> float:
        """The base self-weight modifier c (1 where the rule owns its ``c``)."""
        return 1.0 if self.entry.own_c else float(self.params.get("c", 1.0))

    @property
    def amplify(self) -> float | None:
        """Update-amplification cap, or None."""
        key = self.entry.amplify
        return None if key is None else float(self.params[key])

    @property
    def scalars_per_message(self) -> int:
        return 1 if self.entry.scalars else 0

    def amplified(self, start: Any, trained: Any, ages: np.ndarray) -> Any:
        """FedAWE-style update amplification (the rule's :attr:`amplify` cap c), for every
        engine: the rows of ``trained`` [m, D] (torch) whose client returns (age τ ≥ 1 in
        ``ages`` [m]) become start + (1 + min(τ, c))·(trained − start), ``start`` [m, D] the
        models the local steps began from, the factor computed in float64 and rounded once to
        the models' dtype. In place; returns ``trained`` (as it was where the rule does not
        amplify or nobody returns)."""
        cap = self.amplify
        ret = np.flatnonzero(np.asarray(ages) >= 1)
        if cap is None or ret.size == 0:
            return trained
        import torch

        r = torch.from_numpy(ret).to(trained.device)
        f = torch.from_numpy(1.0 + np.minimum(np.asarray(ages)[ret], cap))
        f = f.to(device=trained.device, dtype=trained.dtype)
        trained[r] = start[r] + f[:, None] * (trained[r] - start[r])
        return trained

    def local_steps(self, K: int, trains: np.ndarray, ages: np.ndarray) -> np.ndarray:
        """Local steps per client this round ([N] int): K where it trains, 0 elsewhere;
        K·(1 + min(τ_i, 3)) for a returning client under ``+catchup`` (training only)."""
        if self.catchup:
            return np.where(trains, catchup_steps(K, ages), 0)
        return np.where(trains, K, 0)

    @property
    def defence_flags(self) -> int:
        """Bit flags of the model-free defences in the round (:mod:`sfg.round.defences`)."""
        from sfg.round.defences import CLIP, DEFENCES

        flags = 0
        for m in self.modifiers:
            flags |= DEFENCES.get(m, 0)
        return flags & ~CLIP

    @property
    def clip(self) -> bool:
        """``+clip``: ClippedGossip-style model screening (training only)."""
        return "clip" in self.modifiers

    @property
    def certified(self) -> bool:
        """``+certified``: the certified protocol's checks (:mod:`sfg.round.certified`)."""
        return "certified" in self.modifiers

    @property
    def robust(self) -> str | None:
        """The robust aggregator replacing the weighted mean (:data:`ROBUST`,
        :mod:`sfg.sim.robust`; training only), or None."""
        got = [m for m in self.modifiers if m in ROBUST]
        return got[0] if got else None

    def defence_param(self, key: str) -> float:
        """A defence parameter's value (:data:`sfg.round.defences.DEFENCE_PARAMS` default)."""
        from sfg.round.defences import DEFENCE_PARAMS

        return float(self.params.get(key, DEFENCE_PARAMS[key][0]))

    @property
    def margin(self) -> float:
        return float(self.params.get("margin", 1.0))

    @property
    def kappa(self) -> float:
        return float(self.params.get("kappa", 2.0))

    @property
    def args(self) -> tuple[float, ...]:
        """The compiled function's parameters, in signature order."""
        return tuple(float(self.params[k]) for k in _arg_names(self.fn))

    def __str__(self) -> str:
        return self.text or self.name

    def weights_one(self, *, ages: ArrayLike, lags: ArrayLike | None = None,
                    counts: ArrayLike | None = None, local_counts: ArrayLike | None = None,
                    q_hat: ArrayLike | None = None, t: int | None = None, u: float = 0.5,
                    keys: ArrayLike | None = None, degrees: ArrayLike | None = None,
                    missed: ArrayLike | None = None) -> np.ndarray:
        """One receiver's weights over its candidates; index 0 is the receiver (docs/concepts/round.md#one-round step 2).

        ages [k] int, lags [k] float (default = ages), counts [k] int (default 1),
        local_counts [k] int (default = counts), q_hat [k] float (receiver's estimate per
        candidate; entry 0 ignored, default 1), t = round index (default ⌈max lag⌉), u = this
        receiver's uniform draw, keys [k] uniform keys (random rules), degrees [k] live-neighbour
        counts (default: k − 1 for the receiver, 1 for each neighbour), missed [k, T] the
        candidates' rows of A (oracles). Runs the same compiled weights as the round.
        """
        from sfg.round.kernel import one_receiver

        if self.reads_models:
            raise SfgError(f"rule {self.name!r} reads model parameters; run it with `sfg run`, "
                           "not in a model-free replay")
        return one_receiver(self, ages=ages, lags=lags, counts=counts,
                            local_counts=local_counts, q_hat=q_hat, t=t, u=u, keys=keys,
                            degrees=degrees, missed=missed)


def parse_rule(text: str | Component) -> Rule:
    """Parse and validate ``"name:key=value,...+modifier"``; did-you-mean on unknown names."""
    _load_library()
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
    # a defence's own parameters (sfg.round.defences), allowed only with that defence
    from sfg.round.defences import DEFENCE_PARAMS

    rule_params = dict(comp.params)
    defence_params: dict[str, float] = {}
    for key, (_, owner) in DEFENCE_PARAMS.items():
        if key in rule_params and key not in RULES.entry(name).params:
            value = rule_params.pop(key)
            if owner not in modifiers:
                raise SfgError(f"rule {comp.text!r}: {key} is a parameter of the +{owner} "
                               f"defence; add +{owner} or drop {key}")
            _check_defence_param(name, key, value)
            defence_params[key] = float(value)
    if defence_params.get("scclip_rank", 0) != int(defence_params.get("scclip_rank", 0)):
        raise SfgError(f"rule {comp.text!r}: scclip_rank must be a whole number k >= 1 (the "
                       "k-th largest neighbour distance) or 0, got "
                       f"{defence_params['scclip_rank']:g}")
    if sum(1 for k in ("scclip_tau", "scclip_rank", "delta") if k in defence_params) > 1:
        raise SfgError(f"rule {comp.text!r}: give one of delta (the adaptive radius), "
                       "scclip_tau (a fixed radius) and scclip_rank (the k-th largest "
                       "distance) for +scclip")
    params = {**RULES.check_params(name, rule_params), **defence_params}
    ranges = _entry(name).ranges
    for key, value in params.items():
        if key in ranges:
            ranges[key].check(name, key, value)
    reading = [f"+{m}" for m in modifiers if m in MODEL_DEFENCES]
    if len(reading) > 1:
        raise SfgError(f"rule {comp.text!r}: {' and '.join(reading)} both replace the weighted "
                       "mean; give at most one model-reading defence (+clip, +median, +trim, "
                       "+scclip or +balance)")
    defences = [f"+{m}" for m in modifiers
                if m in ("guard", "refute", "certified", "relative", "cap") + MODEL_DEFENCES]
    clamps = [f"+{m}" for m in modifiers if m in ("guard", "refute", "relative")]
    if "certified" in modifiers and clamps:
        raise SfgError(f"rule {comp.text!r}: +certified checks claims against their signed "
                       f"provenance, which {', '.join(clamps)} would change first; give "
                       "+certified alone (with +cap if wanted)")
    if defences and "oracle" in RULES.entry(name).tags:
        raise SfgError(f"rule {name!r} is an oracle (global information); the defences "
                       f"{', '.join(defences)} do not apply to it")
    if "model" in RULES.entry(name).tags:
        unsupported = [f"+{m}" for m in modifiers if m != "catchup"]
        if params.get("c", 1.0) != 1.0:
            unsupported.append("c")
        if unsupported:
            raise SfgError(f"rule {name!r} reads model parameters and does not support "
                           f"{', '.join(unsupported)}; only +catchup composes with it")
    return Rule(name=name, params=params, modifiers=tuple(modifiers), text=comp.text or name)


def _check_defence_param(rule: str, key: str, value: Any) -> None:
    """A defence parameter's value against :data:`_DEFENCE_RANGES` (one error line)."""
    lo, hi, closed, what = _DEFENCE_RANGES[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SfgError(f"rule {rule!r}: {key} must be a number, got {value!r}")
    if closed:
        Range(lo, hi, what).check(rule, key, value)
    elif not lo <= value < hi:  # NaN fails too
        raise SfgError(f"rule {rule!r}: {key}={value} must lie in [{lo:g}, {hi:g}) ({what})")


def check_model_defences(rule: Rule, where: str) -> None:
    """Refuse, with one line, a rule whose model-reading defence (``+clip``, ``+median``,
    ``+trim``, ``+scclip``, ``+balance``) does not run in ``where`` (a model-free replay, the
    virtual clock's async and event protocols, the networked nodes)."""
    got = [f"+{m}" for m in rule.modifiers if m in MODEL_DEFENCES]
    if got:
        raise SfgError(f"rule {str(rule)!r}: {got[0]} reads model parameters (training only: "
                       f"sfg run in rounds or on the lockstep clock); {where} cannot run it — "
                       f"drop {got[0]} there")


def robust_modifiers(text: str) -> list[str]:
    """The robust aggregators (:data:`ROBUST`) named in a rule string, read without loading
    the rule library (for the run schema's checks)."""
    comp = parse_component(text, kind="rule")
    return [m for m in comp.modifiers if m in ROBUST]


def rule_names(tag: str | None = None) -> list[str]:
    _load_library()
    return RULES.names(tag)


def _load_library() -> None:
    from sfg.plugins import load
    from sfg.round.rules import library, oracles  # noqa: F401  (registers the rules on first use)

    # the plugins' rules (entry points, SFG_PLUGINS; sfg.plugins): once per process; a broken
    # one is noted, and named by an unknown-name error (sfg.plugins.broken_note)
    load(strict=False)


__all__ = ["RULES", "ROBUST", "MODEL_DEFENCES", "Range", "Rule", "Unit", "Discount",
           "NonNegative", "parse_rule", "rule", "register_rule", "rule_names",
           "check_model_defences", "robust_modifiers"]
