"""Keyed random streams (docs/concepts/training.md#pairing: pairing).

Every random draw in sfg comes from a stream keyed by ``(seed, name, *ints)``, never from
global state and never by the rule, so that runs with different rules share the graph,
partition, initial model, outage trace and minibatch stream for the same seed.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _key(part: str | int) -> int:
    if isinstance(part, (int, np.integer)):
        if part < 0:
            raise ValueError(f"stream keys must be non-negative integers, got {part}")
        return int(part)
    digest = hashlib.blake2b(str(part).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def seed_sequence(seed: int, *keys: str | int) -> np.random.SeedSequence:
    """The SeedSequence of stream ``keys`` under ``seed`` (stable across platforms and runs)."""
    return np.random.SeedSequence(int(seed), spawn_key=tuple(_key(k) for k in keys))


def stream(seed: int, *keys: str | int) -> np.random.Generator:
    """A numpy Generator for stream ``keys`` under ``seed``: ``stream(1, "graph")``."""
    return np.random.default_rng(seed_sequence(seed, *keys))


def torch_seed(seed: int, *keys: str | int) -> int:
    """A 63-bit integer seed for a ``torch.Generator`` keyed like :func:`stream`."""
    return int(seed_sequence(seed, *keys).generate_state(2, np.uint64)[0] >> np.uint64(1))


def as_generator(seed: int | np.random.Generator | None) -> np.random.Generator:
    """Accept an int seed or a Generator (networkx style) and return a Generator."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(seed))


# ----------------------------------------------------------------------------- counters
# Counter-based draws: u = F(key, ids...) in [0, 1), a pure function of a stream key and the
# identity of what is drawn for (say a message: sender, receiver, channel, index on its link),
# with no generator state. The deployable node's network (one message at a time, plain Python
# integers) and the clock's engine (all messages at once, numpy uint64 arrays) then draw the
# same value for the same message by construction, whatever order either makes them in
# (docs/concepts/clock.md#the-node-on-the-clock: faults are events of the schedule). One definition serves both: every step below
# is written so that Python ints (masked to 64 bits) and numpy uint64 arrays give the same bits.
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def counter_key(seed: int, *names: str | int) -> int:
    """A 64-bit key for the counter-based draws of stream ``(seed, *names)``."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(int(seed)).encode())
    for k in names:
        h.update(b"\x00" + str(_key(k)).encode())
    return int.from_bytes(h.digest(), "little")


def _mix(z):
    """SplitMix64's finaliser (Steele, Lea and Flood 2014) on a Python int or uint64 array."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def counter_uniform(key: int, *ids):
    """A uniform draw in [0, 1) (53 bits) for ``ids`` under ``key`` (:func:`counter_key`):
    Python ints give a float, any numpy array among the ids gives a float64 array
    (broadcast), with the same value for the same ids either way (tested)."""
    if any(isinstance(v, np.ndarray) for v in ids):
        with np.errstate(over="ignore"):
            z = np.uint64(key)
            for v in ids:
                z = _mix((z + np.asarray(v).astype(np.uint64) * np.uint64(_GOLDEN)) & _M64)
            return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    z = int(key)
    for v in ids:
        z = _mix((z + int(v) * _GOLDEN) & _M64)
    return (z >> 11) * (1.0 / (1 << 53))
