"""Staleness state (docs/concepts/staleness.md#the-staleness-state): one scalar per model, piggybacked on messages.

The one-round update is part of the compiled round (:func:`sfg.round.kernel.play_round`), written
once for the replay, the simulator and the one-receiver form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sfg.round.slots import RoundGraph
from sfg.util.numba_start import njit

Q_HAT_BETA = 0.1
Q_HAT_FLOOR = 0.05


@dataclass(frozen=True)
class StalenessState:
    """Per-client staleness at the start of round ``t`` (docs/concepts/staleness.md#the-staleness-state).

    t:            round index
    ages:         [N] int64  τ_i, rounds since the model was last trained
    lags:         [N] float64 ℓ_i, effective lag (row sums of ``missed``)
    counts:       [N] int64  n_i, max-inherited update count (gossip learning), starts at 1
    local_counts: [N] int64  per-client update counters that are never inherited, start at 1
    q_hat:        [E] float64 link-reception estimates per slot of the RoundGraph (self slots 1)
    missed:       [N, T] float64 or None, the missed-fraction matrix A (analysis only)
    versions, evidence: the +guard defence's evidence (see the fields), or None
    """

    t: int
    ages: np.ndarray
    lags: np.ndarray
    counts: np.ndarray
    local_counts: np.ndarray
    q_hat: np.ndarray
    missed: np.ndarray | None = None
    # receiver-side evidence of the +guard defence (sfg.round.defences), None until first used:
    # versions [N] int64 content versions; evidence [2, E] int64 per slot: the version last
    # received and the round it was first seen (-1 = never)
    versions: np.ndarray | None = None
    evidence: np.ndarray | None = None

    @property
    def mean_counts(self) -> np.ndarray:
        """Mean-inherited counts n̄_j = 1 + t − ℓ_j (docs/concepts/staleness.md#the-staleness-state)."""
        return 1.0 + self.t - self.lags


def init_state(rg: RoundGraph, *, rounds: int | None = None, track_missed: bool = False) -> StalenessState:
    """The round-0 state: ages 0, lags 0, counts 1, q̂ 1; ``missed`` [N, rounds] when tracked."""
    n = rg.n
    missed = None
    if track_missed:
        if rounds is None:
            raise ValueError("track_missed needs the number of rounds")
        missed = np.zeros((n, rounds))
    return StalenessState(
        t=0,
        ages=np.zeros(n, np.int64),
        lags=np.zeros(n, np.float64),
        counts=np.ones(n, np.int64),
        local_counts=np.ones(n, np.int64),
        q_hat=np.ones(rg.n_slots, np.float64),
        missed=missed,
    )


@njit(inline="always", cache=True)
def waited(age, lag, d):  # pragma: no cover - compiled (inlined into the clock's events)
    """The scalars of a message that waited ``d`` ≥ 0 units since it arrived (docs/concepts/nodes.md#asynchronous-mode,
    docs/concepts/clock.md#staleness-on-the-clock): it counts as older by ⌊d⌋ rounds — age τ + ⌊d⌋ — and its real-valued lag grows by
    d: ℓ + d; counts are unchanged. Written once for the virtual clock's events
    (:func:`sfg.round.kernel._events`) and the networked node (:mod:`sfg.net.node`)."""
    return age + np.int64(np.floor(d)), lag + d


def wake_jitter(seed: int, wakes: int, n: int) -> np.ndarray:
    """[wakes, n] uniforms in [0, 1): the async protocol's wake-up jitter of device i at wake
    r is ``jitter · P · u[r, i]`` (docs/concepts/clock.md#the-three-protocols; stream ``clock-jitter`` keyed by the seed),
    the same for the virtual clock's engine and the networked node."""
    from sfg.util.rng import stream

    key = (int(seed), int(wakes), int(n))
    got = _JITTER.get(key)
    if got is None:
        got = stream(int(seed), "clock-jitter").random((int(wakes), int(n)))
        got.setflags(write=False)
        _JITTER.clear()  # one run's at a time
        _JITTER[key] = got
    return got


_JITTER: dict[tuple[int, int, int], np.ndarray] = {}
