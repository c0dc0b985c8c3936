"""sfg: decentralised learning when devices go offline.

The jobs are functions of this package (:mod:`sfg.api`, loaded on first use, so that
``import sfg`` imports neither torch nor numba): ``sfg.run`` (train: the rounds or the
virtual clock), ``sfg.replay`` (model-free replay), ``sfg.swarm`` (networked nodes, on the
virtual clock or real), ``sfg.grid`` (a grid into a results store), ``sfg.parse_rule`` and
``sfg.rules()``, with the settings of one run, ``sfg.RunConfig`` (or ``sfg.config(...)``),
and the results, ``sfg.RunResult`` and ``sfg.GridResult``.

The packages are the architecture: :mod:`sfg.round` (the round: slots, staleness, rules,
defences, the compiled kernel) at the centre; the engines that run it — :mod:`sfg.modelfree`
(model-free replay), :mod:`sfg.sim` (training) and :mod:`sfg.net` (networked nodes); the world they
run on, :mod:`sfg.world` (graphs, outages, traces, data, models); the experiment layer above,
:mod:`sfg.experiments` (configs, grids, the store, executors, statistics, reports); and the
command line, :mod:`sfg.cli`. :mod:`sfg.util` holds the plumbing they share.
"""

from sfg import reproducible as _reproducible

_reproducible.apply()  # SFG_REPRODUCIBLE=1: pin the numerical libraries before they load
__version__ = "0.2.0"

from sfg.util import moved as _moved  # noqa: E402

_moved.install()  # the model-free package's old name, sfg.replay.*, until 0.4

from sfg.util.lazy import lazy_exports as _lazy_exports  # noqa: E402

_EXPORTS = {
    "run": "api", "replay": "api", "swarm": "api", "grid": "api", "config": "api",
    "parse_rule": "api",
    "rules": "api", "GridResult": "api",
    "RunConfig": "experiments.config", "RunResult": "result", "Rule": "round.rules",
    "Store": "experiments.store", "SfgError": "errors",
}
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
__all__ = ["GridResult", "Rule", "RunConfig", "RunResult", "SfgError", "Store", "__version__",
           "config", "grid", "parse_rule", "replay", "rules", "run", "swarm"]
