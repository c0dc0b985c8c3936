"""Outage processes (SPEC §4), anatomy modes (§4.1) and link failures (§4.2)."""

from .anatomy import ANATOMY_MODES, Capabilities, capabilities
from .links import link_failures, live_links_round
from .registry import PROCESSES, OutageProcess, make_process, process_names

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
