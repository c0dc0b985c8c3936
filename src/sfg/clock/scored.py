"""The scores of the rules that read models (docs/concepts/rules.md#baselines) and of the oracles on the async and
event protocols, computed from the candidates' models (or the missed-fraction rows) one
dependency level at a time (:func:`sfg.clock.train.simulate_events`); they enter the
events' compiled weights as given scores (:func:`sfg.round.kernel.run_events`), which apply
the rule's modifiers and defences and update the staleness state like any rule's.

The model-reading rules are defined once, for rounds and the clock alike, in
:mod:`sfg.sim.model_rules` (their registered objects, ``scores`` and ``adopted`` here)."""

from __future__ import annotations

import torch

from sfg.errors import SfgError
from sfg.round.rules import Rule
from sfg.sim.model_rules import MODEL_RULES


def make_scorer(rule: Rule, *, n: int, n_slots: int, X0: torch.Tensor, sched=None,
                prev=None):
    """The scores of a model-reading rule (its registered object of
    :data:`sfg.sim.model_rules.MODEL_RULES`, started for ``n`` devices, ``n_slots`` slots and
    initial models ``X0``) or an oracle (:class:`sfg.clock.missed.MissedRows`, which needs
    the schedule and its levels' ``prev``) on the clock."""
    if rule.oracle:
        from sfg.clock.missed import MissedRows

        return None if sched is None else MissedRows(rule, sched, prev, n)
    cls = MODEL_RULES.get(rule.name)
    if cls is None or not cls.on_clock:
        scored = ", ".join(name for name, c in MODEL_RULES.items() if c.on_clock)
        raise SfgError(f"rule {rule.name!r} reads models; on the async and event protocols the "
                       f"model-reading rules are {scored} and model-memory*")
    return cls(rule).start(n, n_slots, X0)
