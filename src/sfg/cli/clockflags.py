"""The virtual clock's flags (SPEC §12), shared by ``sfg run`` and ``sfg replay``.

Each flag is a field of the run settings (:class:`sfg.experiments.config.RunConfig`, the same
keys in grid files); none given keeps everything as it is without the clock.
"""

from __future__ import annotations

from typing import Any

import typer

CLOCK = typer.Option(None, "--clock", help="rounds (default: synchronous rounds, SPEC §1) or virtual (SPEC §12: time in seconds)", rich_help_panel="Virtual clock")
PROTOCOL = typer.Option(None, "--protocol", help="With --clock virtual: lockstep (rounds with a deadline), async (own timers), event (train-send-repeat)", rich_help_panel="Virtual clock")
ROUND_SECONDS = typer.Option(None, "--round-seconds", help="Δ, the seconds of one round and of one staleness unit (default 600)", rich_help_panel="Virtual clock")
PERIOD = typer.Option(None, "--period", help="async: wake period P in seconds (default Δ)", rich_help_panel="Virtual clock")
JITTER = typer.Option(None, "--jitter", help="async: wake jitter as a fraction of P, in [0, 1)", rich_help_panel="Virtual clock")
WINDOW = typer.Option(None, "--window", help="W: a neighbour's latest message counts if it arrived within W periods (default 1)", rich_help_panel="Virtual clock")
COMPUTE = typer.Option(None, "--compute", help="Seconds per local step per device: const:value=2, lognormal:median=2,sigma=1, trace:path=FILE.csv", rich_help_panel="Virtual clock")
UPLINK = typer.Option(None, "--uplink", help="Uplink bytes/s per device (default const:value=inf: instant)", rich_help_panel="Virtual clock")
LATENCY = typer.Option(None, "--latency", help="Seconds per directed link, e.g. lognormal:median=0.1,sigma=0.5", rich_help_panel="Virtual clock")
LOSS = typer.Option(None, "--loss", help="Probability that a message is lost, e.g. const:value=0.1", rich_help_panel="Virtual clock")
MESSAGE_BYTES = typer.Option(None, "--message-bytes", help="Bytes per message (default: the model's float32 parameters + 256 when training, 0 in replay)", rich_help_panel="Virtual clock")
EVAL_SECONDS = typer.Option(None, "--eval-seconds", help="Evaluate every this many seconds of virtual time (default eval_every·Δ)", rich_help_panel="Virtual clock")
FAULTS = typer.Option(None, "--faults", help="async/event: message faults as events of the schedule, e.g. faults:loss=0.1,delay=2,reorder=0.1,corrupt=0.01,partition=0-3|4-7@1200-3600 (the same messages as under `sfg swarm --clock virtual --faults`; crashes and drift are the node's)", rich_help_panel="Virtual clock")
FAULTS_SEED = typer.Option(None, "--faults-seed", help="Seed of the faults' own draws (default 0), independent of --seed", rich_help_panel="Virtual clock")
TARGET = typer.Option(None, "--target-accuracy", help="Mean accuracy whose first time is reported as time-to-accuracy (default 0.8)", rich_help_panel="Virtual clock")


def clock_values(**given: Any) -> dict[str, Any]:
    """The flags given, by their settings' names (None = not given)."""
    return {k: v for k, v in given.items() if v is not None}
