"""Model-free replay (SPEC §9): the public API (:mod:`.api`), one lane's driver (:mod:`.driver`),
the self-return H (:mod:`.horizon`), the metrics (:mod:`.metrics`) and plots (:mod:`.plot`)."""

from .api import (
    DEFAULT_GRAPH,
    DEFAULT_N,
    DEFAULT_T,
    ENGINES,
    build_scenario,
    replay,
    replay_batch,
    replay_config,
    replay_trace,
    warm_compiled,
)
from .driver import Lane, ReplayResult
from .horizon import EXACT_PAIRS, default_threads, horizon_pairs
from .plot import plot_staleness

__all__ = ["DEFAULT_GRAPH", "DEFAULT_N", "DEFAULT_T", "ENGINES", "EXACT_PAIRS", "Lane",
           "ReplayResult", "build_scenario", "default_threads", "horizon_pairs",
           "plot_staleness", "replay", "replay_batch", "replay_config", "replay_trace",
           "warm_compiled"]
