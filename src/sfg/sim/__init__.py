"""Simulation: the flat N×D parameter store, local-training backends and the round loop (docs/concepts/training.md#the-training-protocol).

Import submodules directly (``from sfg.sim.backends import make_backend``); this package
imports nothing heavy by itself.
"""
