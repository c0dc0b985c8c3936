"""Keyed random streams (SPEC §7: pairing).

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
