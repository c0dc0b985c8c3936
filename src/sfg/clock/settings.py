"""The virtual clock's settings (docs/concepts/clock.md#the-virtual-clock): protocol, the unit Δ, the async timer and the
world's device and network quantities, validated once.

Defaults, chosen so that a clock run with nothing else set is the round-based run
(``--protocol lockstep`` with zero compute time, zero latency, instant transfers and no loss
gives exactly ``sfg run``'s numbers, tested):

* ``round_seconds`` Δ = 600 s (the 10-minute rounds of docs/concepts/traces.md#real-availability-traces): the unit in which staleness is
  counted on the clock (one period P under ``async``), and the length of a lockstep round;
* ``period`` P = Δ, ``jitter`` 0 (a fraction of P in [0, 1)), ``window`` W = 1 (periods under
  ``async``, units of Δ under ``event``);
* ``compute`` ``const:value=0`` seconds per local SGD step, ``uplink`` ``const:value=inf``
  bytes per second, ``latency`` ``const:value=0`` seconds per directed link, ``loss``
  ``const:value=0`` probability per message (:mod:`sfg.world.devices`);
* ``message_bytes``: the size of one message; None = the model's parameters as float32 plus a
  256-byte header when training, 0 (transfers take no time) in the model-free replay;
* ``eval_seconds``: how often accuracy is measured in virtual time; None = every
  ``eval_every`` rounds' worth (eval_every · Δ);
* ``faults`` ``none``, ``faults_seed`` 0: message faults as events of the schedule
  (:mod:`sfg.clock.faults`; async and event protocols), drawn per message from the faults
  seed's own counter-based draws, the same draws the node's network makes under ``sfg swarm
  --clock virtual`` (docs/concepts/clock.md#the-node-on-the-clock).
* ``on_return`` ``none``, or ``pull:timeout=S`` (S > 0 seconds, default 60): a device that
  comes back online asks its neighbours for their latest models and starts its first local
  round when they have answered or S seconds have passed (docs/concepts/clock.md#returns-in-time);
  async and event only, and under async S < P.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from sfg.errors import SfgError

PROTOCOLS = ("lockstep", "async", "event")
CLOCKS = ("rounds", "virtual")
HEADER_BYTES = 256
# the settings a config, grid or command line gives, with their defaults
DEFAULTS: dict[str, Any] = {
    "clock": "rounds", "protocol": "lockstep", "round_seconds": 600.0, "period": None,
    "jitter": 0.0, "window": 1.0, "compute": "const:value=0", "uplink": "const:value=inf",
    "latency": "const:value=0", "loss": "const:value=0", "message_bytes": None,
    "eval_seconds": None, "target_accuracy": 0.8, "faults": "none", "faults_seed": 0,
    "on_return": "none",
}
# the default wait of ``on_return: pull`` (seconds)
PULL_TIMEOUT = 60.0


@dataclass(frozen=True)
class ClockSettings:
    """See the module docstring; ``unit``: the seconds of one staleness unit (P or Δ)."""

    protocol: str = "lockstep"
    round_seconds: float = 600.0
    period: float | None = None
    jitter: float = 0.0
    window: float = 1.0
    compute: str = "const:value=0"
    uplink: str = "const:value=inf"
    latency: str = "const:value=0"
    loss: str = "const:value=0"
    message_bytes: float | None = None
    eval_seconds: float | None = None
    faults: str = "none"
    faults_seed: int = 0
    on_return: str = "none"

    @property
    def pull_timeout(self) -> float | None:
        """S, the longest wait of ``on_return: pull`` in seconds, or None (``none``)."""
        return parse_on_return(self.on_return)

    @property
    def P(self) -> float:
        return float(self.period) if self.period is not None else float(self.round_seconds)

    @property
    def unit(self) -> float:
        return self.P if self.protocol == "async" else float(self.round_seconds)

    def with_bytes(self, default: float) -> ClockSettings:
        return self if self.message_bytes is not None else replace(self, message_bytes=default)


def _number(name: str, v: Any, *, positive: bool = False, allow_none: bool = False,
            below: float | None = None) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise SfgError(f"{name} must be a finite number, got {v!r}")
    x = float(v)
    if positive and not x > 0:
        raise SfgError(f"{name} must be > 0 seconds, got {v!r}")
    if not positive and x < 0:
        raise SfgError(f"{name} must be >= 0, got {v!r} (times and sizes cannot be negative)")
    if below is not None and not x < below:
        raise SfgError(f"{name} must lie in [0, {below:g}), got {v!r}")
    return x


def check_timer(jitter: Any, window: Any) -> tuple[float, float]:
    """An async timer's ``jitter`` (a fraction of the period, in [0, 1)) and ``window`` W (in
    periods, > 0), checked once for the clock, the node and real nodes' settings: one
    :class:`SfgError` line each."""
    j = float(_number("jitter", jitter))  # type: ignore[arg-type]
    if not j < 1:
        raise SfgError(f"jitter must lie in [0, 1) (a fraction of the period), got {jitter!r}")
    w = float(_number("window", window))  # type: ignore[arg-type]
    if not w > 0:
        raise SfgError(f"window must be > 0 periods (W), got {window!r}")
    return j, w


def make_settings(values: dict[str, Any]) -> ClockSettings:
    """Validated :class:`ClockSettings` from a config's keys (the names of :data:`DEFAULTS`;
    ``clock`` is checked and dropped). Bad values raise a one-line :class:`SfgError`."""
    from sfg.world.devices import parse_world_component

    v = {**DEFAULTS, **{k: x for k, x in values.items() if k in DEFAULTS}}
    if v["clock"] not in CLOCKS:
        raise SfgError(f"unknown clock {v['clock']!r}; choose 'rounds' (the default) or 'virtual'")
    if v["protocol"] not in PROTOCOLS:
        from sfg.util.components import did_you_mean

        raise SfgError(f"unknown protocol {v['protocol']!r}{did_you_mean(str(v['protocol']), PROTOCOLS)}; "
                       f"choose one of {', '.join(PROTOCOLS)}")
    jitter, window = check_timer(v["jitter"], v["window"])
    out = ClockSettings(
        protocol=str(v["protocol"]),
        round_seconds=float(_number("round_seconds", v["round_seconds"], positive=True)),  # type: ignore[arg-type]
        period=_number("period", v["period"], positive=True, allow_none=True),
        jitter=jitter, window=window,
        message_bytes=_number("message_bytes", v["message_bytes"], allow_none=True),
        eval_seconds=_number("eval_seconds", v["eval_seconds"], positive=True, allow_none=True),
        faults=_faults(v["faults"], v["faults_seed"]), faults_seed=int(v["faults_seed"]),
        on_return=canonical_on_return(v["on_return"]),
        **{k: str(v[k]) for k in ("compute", "uplink", "latency", "loss")})
    for k in ("compute", "uplink", "latency", "loss"):
        parse_world_component(k, getattr(out, k))
    check_on_return(out)
    return out


def parse_on_return(text: Any) -> float | None:
    """``none`` → None; ``pull`` or ``pull:timeout=S`` → S (seconds, > 0, finite). Anything
    else raises a one-line :class:`SfgError`."""
    from sfg.util.components import did_you_mean, parse_component

    if text is None:
        return None
    c = parse_component(str(text), kind="on_return")
    if c.name == "none" and not c.params and not c.modifiers:
        return None
    if c.name != "pull" or c.modifiers:
        raise SfgError(f"unknown on_return {text!r}{did_you_mean(c.name, ('none', 'pull'))}; "
                       "choose none (the default) or pull:timeout=S (S seconds, e.g. "
                       "pull:timeout=60)")
    extra = sorted(set(c.params) - {"timeout"})
    if extra:
        raise SfgError(f"on_return {text!r}: unknown parameter {extra[0]!r}; pull takes "
                       "timeout=S only (e.g. pull:timeout=60)")
    S = c.params.get("timeout", PULL_TIMEOUT)
    if isinstance(S, bool) or not isinstance(S, (int, float)) or not math.isfinite(float(S)) \
            or not float(S) > 0:
        raise SfgError(f"on_return {text!r}: timeout must be a finite number of seconds > 0, "
                       f"got {S!r} (e.g. pull:timeout=60)")
    return float(S)


def canonical_on_return(text: Any) -> str:
    """The canonical text of an ``on_return`` setting: ``none`` or ``pull:timeout=S``."""
    S = parse_on_return(text)
    return "none" if S is None else f"pull:timeout={S:g}"


def check_on_return(s: ClockSettings) -> None:
    """Refuse a ``pull`` wait S ≥ P under async (it must end before the next period). Under
    lockstep a returning client already aggregates its neighbours' round models: the
    lockstep schedule refuses ``pull`` (:func:`sfg.clock.schedule.lockstep_rounds`, and the
    engines' table, :mod:`sfg.engines`)."""
    S = s.pull_timeout
    if S is not None and s.protocol == "async" and not S < s.P:
        raise SfgError(f"on_return pull:timeout={S:g} waits as long as the period P = {s.P:g} s "
                       "or longer; the wait must end before the next wake: choose a timeout "
                       "below P")


REFUSE_LOCKSTEP_PULL = ("on_return pull runs under the async and event protocols; under "
                        "lockstep a returning client already aggregates its neighbours' round "
                        "models: drop --on-return or choose --protocol async or event")


def _faults(text: Any, seed: Any) -> str:
    """The faults setting checked (:class:`sfg.clock.faults.Faults`), in its canonical text."""
    from sfg.clock.faults import Faults

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SfgError(f"faults_seed must be an integer >= 0, got {seed!r}")
    return Faults.parse(None if text is None else str(text), seed=seed).text
