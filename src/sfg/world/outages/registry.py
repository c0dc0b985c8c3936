"""The outage-process registry (docs/concepts/outages.md#outage-processes): every process, synthetic or a real trace, by name.

An outage process is any object with::

    name: str
    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray   # bool[T, N], True = available

``sample`` must be deterministic in ``seed`` (draw from ``sfg.util.rng.stream(seed, "outage", ...)``)
and raise :class:`sfg.errors.SfgError` with a one-line message on impossible requests.
``positions`` ([N, 2] float64 node positions) is given when the graph has them (``regional``
needs them; other processes ignore them).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from sfg.util.components import Component, Registry, parse_component


class OutageProcess(Protocol):
    name: str

    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray: ...


PROCESSES = Registry("outage process")


def make_process(text: str | Component, **overrides: Any) -> OutageProcess:
    """Build a process from a component string such as ``"bursty:u=0.8"``."""
    comp = text if isinstance(text, Component) else parse_component(text, kind="outage process")
    if comp.modifiers:
        from sfg.errors import SfgError

        raise SfgError(f"outage process {comp.text!r} takes no '+' modifiers")
    return PROCESSES.make(comp, **overrides)


def process_names() -> list[str]:
    return PROCESSES.names()
