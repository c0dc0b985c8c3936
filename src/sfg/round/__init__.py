"""The round (docs/concepts/round.md#one-round, docs/concepts/staleness.md#the-staleness-state): the centre of sfg, which every engine runs.

* :mod:`~sfg.round.slots` — the graph as receiver slots (:class:`RoundGraph`);
* :mod:`~sfg.round.staleness` — the staleness state carried with every model (docs/concepts/staleness.md#the-staleness-state);
* :mod:`~sfg.round.rules` — the aggregation rules, each one compiled one-receiver function
  (docs/concepts/rules.md#scores-and-weights);
* :mod:`~sfg.round.defences` and :mod:`~sfg.round.attacks` — claim checks and forged claims;
* :mod:`~sfg.round.kernel` — the compiled round itself (:func:`play_round`,
  :func:`one_receiver`), and :mod:`~sfg.round.jit`, its lazy compiler.

Names are loaded on first use, so ``import sfg.round.rules`` loads no compiler.
"""

from sfg.util.lazy import lazy_exports

_EXPORTS = {
    "play_round": "kernel", "one_receiver": "kernel", "RoundResult": "kernel", "FACTS": "kernel",
    "Candidates": "kernel", "run_rounds": "kernel", "candidate_mask": "kernel",
    "RoundGraph": "slots", "StalenessState": "staleness",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
__all__ = sorted(_EXPORTS)
