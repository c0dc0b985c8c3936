"""Outage processes (SPEC §4), anatomy modes (§4.1) and link failures (§4.2)."""

from .registry import PROCESSES, OutageProcess, make_process, process_names

__all__ = ["PROCESSES", "OutageProcess", "make_process", "process_names"]
