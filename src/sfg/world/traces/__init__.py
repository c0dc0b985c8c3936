"""Real availability traces (docs/concepts/traces.md#real-availability-traces): FLASH, STUNner sessions, tabular user traces.

Every pipeline returns a :class:`Trace` (``available: bool[T, D]`` plus device metadata);
:func:`trace_stats` summarises it and :mod:`sfg.world.traces.plot` draws it. Importing
:mod:`sfg.world.traces.process` registers the outage processes ``flash``, ``stunner`` and ``trace``.
"""

from sfg.util.lazy import lazy_exports

# name -> submodule; loaded on first access (PEP 562) so that `sfg --help` and commands that
# never read a trace do not pay for the readers
_EXPORTS = {
    "Trace": "base", "minutes_to_rounds": "base",
    "FlashStates": "flash", "flash_trace": "flash", "load_flash": "flash", "parse_flash": "flash",
    "TraceProcess": "process", "clear_cache": "process", "load_trace": "process",
    "outage_runs": "stats", "trace_stats": "stats",
    "Sessions": "stunner", "load_stunner": "stunner", "parse_sessions": "stunner",
    "stunner_trace": "stunner",
    "load_tabular": "tabular", "save_tabular": "tabular",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

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
