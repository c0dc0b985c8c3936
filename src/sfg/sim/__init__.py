"""Simulation: the flat N×D parameter store, local-training backends and the round loop (SPEC §6).

Import submodules directly (``from sfg.sim.backends import make_backend``); this package
imports nothing heavy by itself.
"""
