"""The virtual clock (docs/concepts/clock.md#the-virtual-clock): the same clients, rules and staleness in seconds of virtual
time, so that asynchrony, device speed and the network can be studied deterministically and
paired across rules.

* :mod:`sfg.clock.settings` — protocol, Δ, period, jitter, window, the world's quantities;
* :mod:`sfg.clock.schedule` — the world in time and the rule-independent schedule of each
  protocol (lockstep rounds with deadlines; async and event local rounds with their
  candidates);
* :mod:`sfg.clock.replay` — the model-free replay on the clock (docs/concepts/replay.md#model-free-analyses metrics);
* :mod:`sfg.clock.train` — training on the clock, batched across devices.

Every rule runs through the round's compiled parts (:mod:`sfg.round.kernel`): lockstep through
the round itself, async and event through :func:`sfg.round.kernel.run_events`, which calls the
same rule function, weights, defences and staleness update one receiver at a time.
"""
