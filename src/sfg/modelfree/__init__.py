"""Model-free replay (docs/concepts/replay.md#model-free-analyses): the public API (:mod:`.api`), one lane's driver (:mod:`.driver`),
the self-return H (:mod:`.horizon`), the metrics (:mod:`.metrics`) and plots (:mod:`.plot`).

Names are imported on first use, so that reading :mod:`.metrics` (the command line's table)
does not load numba.
"""

from __future__ import annotations

from sfg.util.lazy import lazy_exports

_WHERE = {
    "DEFAULT_GRAPH": "api", "DEFAULT_N": "api", "DEFAULT_T": "api", "ENGINES": "api",
    "build_scenario": "api", "replay": "api", "replay_batch": "api", "replay_config": "api",
    "replay_trace": "api", "warm_compiled": "api", "Lane": "driver", "ReplayResult": "driver",
    "EXACT_PAIRS": "horizon", "default_threads": "horizon", "horizon_pairs": "horizon",
    "plot_staleness": "plot",
}
__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
