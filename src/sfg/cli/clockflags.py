"""The virtual clock's flags, shared by ``sfg run``, ``sfg replay`` and ``sfg swarm``.

Each flag is a field of the run settings (:class:`sfg.experiments.config.RunConfig`, the same
keys in grid files); none given keeps everything as it is without the clock. The definitions
are the shared ones of :mod:`sfg.cli.options`.
"""

from __future__ import annotations

from sfg.cli.options import given as clock_values
from sfg.cli.options import opt

CLOCK = opt("clock")
PROTOCOL = opt("protocol")
ROUND_SECONDS = opt("round_seconds")
PERIOD = opt("period")
JITTER = opt("jitter")
WINDOW = opt("window")
DEADLINE = opt("deadline")
COMPUTE = opt("compute")
UPLINK = opt("uplink")
LATENCY = opt("latency")
LOSS = opt("loss")
MESSAGE_BYTES = opt("message_bytes")
EVAL_SECONDS = opt("eval_seconds")
FAULTS = opt("faults")
FAULTS_SEED = opt("faults_seed")
TARGET = opt("target_accuracy")
ON_RETURN = opt("on_return")
CUT = opt("cut", [])
CRASH = opt("crash", [])

__all__ = ["CLOCK", "COMPUTE", "CRASH", "CUT", "DEADLINE", "EVAL_SECONDS", "FAULTS",
           "FAULTS_SEED", "JITTER", "LATENCY", "LOSS", "MESSAGE_BYTES", "ON_RETURN", "PERIOD", "PROTOCOL",
           "ROUND_SECONDS", "TARGET", "UPLINK", "WINDOW", "clock_values"]
