"""Real availability traces (SPEC §5): FLASH, STUNner sessions, tabular user traces.

Every pipeline returns a :class:`Trace` (``available: bool[T, D]`` plus device metadata);
:func:`trace_stats` summarises it and :mod:`sfg.traces.plot` draws it. Importing
:mod:`sfg.traces.process` registers the outage processes ``flash``, ``stunner`` and ``trace``.
"""

from .base import Trace, minutes_to_rounds
from .flash import FlashStates, flash_trace, load_flash, parse_flash
from .process import TraceProcess, clear_cache, load_trace
from .stats import outage_runs, trace_stats
from .stunner import Sessions, load_stunner, parse_sessions, stunner_trace
from .tabular import load_tabular, save_tabular

__all__ = [
    "FlashStates",
    "Sessions",
    "Trace",
    "TraceProcess",
    "clear_cache",
    "flash_trace",
    "load_flash",
    "load_stunner",
    "load_tabular",
    "load_trace",
    "minutes_to_rounds",
    "outage_runs",
    "parse_flash",
    "parse_sessions",
    "save_tabular",
    "stunner_trace",
    "trace_stats",
]
