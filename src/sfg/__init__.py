"""sfg: decentralised learning when devices go offline.

The packages are the architecture: :mod:`sfg.round` (the round: slots, staleness, rules,
defences, the compiled kernel) at the centre; the engines that run it — :mod:`sfg.replay`
(model-free), :mod:`sfg.sim` (training) and :mod:`sfg.net` (networked nodes); the world they
run on, :mod:`sfg.world` (graphs, outages, traces, data, models); the experiment layer above,
:mod:`sfg.experiments` (configs, grids, the store, executors, statistics, reports); and the
command line, :mod:`sfg.cli`. :mod:`sfg.util` holds the plumbing they share.
"""

from sfg import reproducible as _reproducible

_reproducible.apply()  # SFG_REPRODUCIBLE=1: pin the numerical libraries before they load
__version__ = "0.2.0"
