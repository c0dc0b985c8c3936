"""Outage processes (docs/concepts/outages.md#outage-processes), anatomy modes (docs/concepts/outages.md#anatomy-modes) and link failures (docs/concepts/outages.md#link-failures)."""

from sfg.world.outages.anatomy import ANATOMY_MODES, Capabilities, capabilities
from sfg.world.outages.links import link_failures, live_links_round
from sfg.world.outages.registry import PROCESSES, OutageProcess, make_process, process_names

__all__ = [
    "ANATOMY_MODES",
    "PROCESSES",
    "Capabilities",
    "OutageProcess",
    "capabilities",
    "link_failures",
    "live_links_round",
    "make_process",
    "process_names",
]

# the processes register when their modules are imported; importing any module of this package
# runs this face first, so PROCESSES is complete wherever it is read
from sfg.world.outages import synthetic  # noqa: E402, F401
from sfg.world.traces import process as _trace_processes  # noqa: E402, F401
