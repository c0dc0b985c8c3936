"""Which examples client i uses at step k of its local round t: the one minibatch stream of
every engine (:class:`Minibatches`, over :func:`minibatch_indices`)."""

from __future__ import annotations

import numpy as np

from sfg.util.rng import stream
from sfg.util.safety import check_cells


def minibatch_indices(sizes: np.ndarray, steps: int, batch: int, *, seed: int, stream_name: str,
                      t: int) -> np.ndarray:
    """[N, steps, batch] int64 local example indices for every client at round t.

    Keyed by (seed, stream_name, t) only. Distinct examples within a batch when the client has
    at least ``batch`` examples (the ``batch`` smallest of uniform keys), else with replacement.
    """
    n = sizes.shape[0]
    maxn = int(sizes.max())
    # uniform draws and int64 picks for [N, steps, batch], keys and their sort for the clients
    # with enough examples [N, steps, maxn]: checked before anything is drawn
    check_cells(n * steps, 16 * batch + 24 * maxn, 1, "a round's minibatch draws",
                rows_name="client-steps", cols_name="bytes each",
                fix="lower --batch-size or --local-steps")
    g = stream(seed, stream_name, t)
    u = g.random((n, steps, batch))
    out = np.minimum((u * sizes[:, None, None]).astype(np.int64), sizes[:, None, None] - 1)
    big = sizes >= batch
    if big.any():
        keys = g.random((int(big.sum()), steps, maxn))
        keys = np.where(np.arange(maxn)[None, None, :] >= sizes[big][:, None, None], np.inf, keys)
        if batch < maxn:
            pick = np.argpartition(keys, batch - 1, axis=2)[..., :batch]
        else:
            pick = np.argsort(keys, axis=2)[..., :batch]
        out[big] = pick
    return out


class Minibatches:
    """Which examples client i uses at step k of its local round keyed ``t`` — the one
    definition every engine trains with.

    Steps 0..K−1 are stream ``minibatch`` keyed by t, drawn for *all* clients at once (so the
    rule, and who trains, never change them); a local round with more than K steps (``+catchup``)
    takes its extra steps from stream ``catchup`` keyed by t. Horizontal flips, when the data
    augments, come from ``augment`` and ``catchup-augment`` alike. The rounds key t by the
    round; the clock's engine and the nodes by the device's local-round count, so device i's
    local round r trains on what ``sfg run`` gives client i in round r.

    ``keep``: how many rounds' draws are cached (the clock's engine reads a round's draws at
    several dependency levels; the rounds read each once)."""

    def __init__(self, sizes: np.ndarray, K: int, B: int, *, seed: int, hflip: bool,
                 keep: int = 1):
        from sfg.round.rules import CATCHUP_CAP

        self.sizes, self.K, self.B, self.seed, self.hflip = sizes, K, B, seed, hflip
        self.n = int(sizes.shape[0])
        self.extra_steps = CATCHUP_CAP * K
        self.keep = max(1, int(keep))
        self._cache: dict[tuple[str, int], tuple[np.ndarray, np.ndarray | None]] = {}

    def _draw(self, name: str, t: int, steps: int, flip_name: str):
        key = (name, int(t))
        got = self._cache.get(key)
        if got is None:
            while len(self._cache) >= 2 * self.keep:
                self._cache.pop(next(iter(self._cache)))
            idx = minibatch_indices(self.sizes, steps, self.B, seed=self.seed,
                                    stream_name=name, t=int(t))
            flips = (stream(self.seed, flip_name, int(t)).random((self.n, steps, self.B)) < 0.5
                     if self.hflip else None)
            got = self._cache[key] = (idx, flips)
        return got

    def round(self, t: int) -> tuple[np.ndarray, np.ndarray | None]:
        """[N, K, B] indices and flips (or None) of every client's first K steps at t."""
        return self._draw("minibatch", t, self.K, "augment")

    def extra(self, t: int) -> tuple[np.ndarray, np.ndarray | None]:
        """[N, CATCHUP_CAP·K, B] indices and flips of the catch-up steps at t."""
        return self._draw("catchup", t, self.extra_steps, "catchup-augment")

    def select(self, devs: np.ndarray, ts: np.ndarray | int, n_steps: int
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """[n, n_steps, B] indices (and flips) of the local rounds (devs[k], ts[k])."""
        devs = np.asarray(devs, np.int64)
        ts = np.broadcast_to(np.asarray(ts, np.int64), devs.shape)
        K = self.K
        idx = np.empty((devs.size, n_steps, self.B), np.int64)
        flips = np.empty((devs.size, n_steps, self.B), bool) if self.hflip else None
        for s in np.unique(ts):
            sel = ts == s
            rows = devs[sel]
            base, fl = self.round(int(s))
            if n_steps > K:
                ext, efl = self.extra(int(s))
                idx[sel] = np.concatenate([base[rows], ext[rows, : n_steps - K]], axis=1)
                if flips is not None:
                    flips[sel] = np.concatenate([fl[rows], efl[rows, : n_steps - K]], axis=1)
            else:
                idx[sel] = base[rows, :n_steps]
                if flips is not None:
                    flips[sel] = fl[rows, :n_steps]
        return idx, flips
