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
}


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
    out = ClockSettings(
        protocol=str(v["protocol"]),
        round_seconds=float(_number("round_seconds", v["round_seconds"], positive=True)),  # type: ignore[arg-type]
        period=_number("period", v["period"], positive=True, allow_none=True),
        jitter=float(_number("jitter", v["jitter"], below=1.0)),  # type: ignore[arg-type]
        window=float(_number("window", v["window"], positive=True)),  # type: ignore[arg-type]
        message_bytes=_number("message_bytes", v["message_bytes"], allow_none=True),
        eval_seconds=_number("eval_seconds", v["eval_seconds"], positive=True, allow_none=True),
        faults=_faults(v["faults"], v["faults_seed"]), faults_seed=int(v["faults_seed"]),
        **{k: str(v[k]) for k in ("compute", "uplink", "latency", "loss")})
    for k in ("compute", "uplink", "latency", "loss"):
        parse_world_component(k, getattr(out, k))
    return out


def _faults(text: Any, seed: Any) -> str:
    """The faults setting checked (:class:`sfg.clock.faults.Faults`), in its canonical text."""
    from sfg.clock.faults import Faults

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SfgError(f"faults_seed must be an integer >= 0, got {seed!r}")
    return Faults.parse(None if text is None else str(text), seed=seed).text
