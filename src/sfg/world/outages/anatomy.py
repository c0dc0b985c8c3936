"""What an outage disables: the anatomy modes (docs/concepts/outages.md#anatomy-modes).

An outage need not cut a client off completely. Each mode says which of four capabilities an
*offline* client keeps; available clients always have all four:

===================== ===== ==== ========= =====
mode (offline client) train send aggregate adopt
===================== ===== ==== ========= =====
full (default)        no    no   no        no
cannot-communicate    yes   no   no        no
cannot-train-shares   no    yes  no        no
cannot-train-adopts   no    yes  yes       yes
===================== ===== ==== ========= =====

* ``cannot-communicate``: keeps training on its own data, neither sends nor aggregates (its age
  stays 0).
* ``cannot-train-shares``: keeps sending its frozen model, whose age grows; it does not adopt an
  aggregate.
* ``cannot-train-adopts``: communicates and adopts the aggregate but cannot train.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sfg.errors import SfgError
from sfg.util.components import did_you_mean

__all__ = ["ANATOMY_MODES", "Capabilities", "capabilities"]

ANATOMY_MODES = ("full", "cannot-communicate", "cannot-train-shares", "cannot-train-adopts")

# What an offline client keeps: (train, send, aggregate, adopt).
_OFFLINE_KEEPS = {
    "full": (False, False, False, False),
    "cannot-communicate": (True, False, False, False),
    "cannot-train-shares": (False, True, False, False),
    "cannot-train-adopts": (False, True, True, True),
}


@dataclass(frozen=True)
class Capabilities:
    """Per-client capabilities, each ``bool[N]`` (or ``bool[T, N]`` for a whole trace).

    ``train``: runs local SGD steps; ``send``: its model is a candidate for its neighbours;
    ``aggregate``: forms an aggregate over its candidates; ``adopt``: replaces its model by that
    aggregate.
    """

    train: np.ndarray
    send: np.ndarray
    aggregate: np.ndarray
    adopt: np.ndarray


def capabilities(available: np.ndarray, mode: str = "full") -> Capabilities:
    """Capabilities of every client from availability ``bool[N]`` or ``bool[T, N]`` (docs/concepts/outages.md#anatomy-modes)."""
    if not isinstance(mode, str) or mode.strip().lower() not in _OFFLINE_KEEPS:
        raise SfgError(f"unknown anatomy mode {mode!r}{did_you_mean(str(mode), ANATOMY_MODES)}")
    keeps = _OFFLINE_KEEPS[mode.strip().lower()]
    available = np.asarray(available)
    if available.dtype != bool:
        if available.size and not np.isin(available, (0, 1)).all():
            raise SfgError("availability must be boolean (or 0/1); got other values")
        available = available.astype(bool)
    out = [available | keep if keep else available.copy() for keep in keeps]
    return Capabilities(*out)
