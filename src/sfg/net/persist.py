"""A node's files: its checkpoint, its saved outbox, and how a restarted node resumes.

After every round, if ``checkpoint_dir`` is set, the model and state are written atomically
(``node-<id>.safetensors``, :func:`sfg.net.checkpoints.save_checkpoint`), in lockstep with the
node's own messages that a neighbour may still need (``node-<id>-out-<round>.msgpack``,
:meth:`NodeFiles.save_outbox`), and with the evidence +certified and claim=certified keep
(:meth:`sfg.net.evidence.CertifiedEvidence.record`), and under ``peers`` other than fixed with
the setting and the membership table as durations relative to the checkpoint
(:meth:`sfg.net.membership.Membership.snapshot`; on restart the downtime is added, and a
checkpoint of another ``peers`` setting is refused). A node started with ``resume=True``
continues from it (:func:`restore`); in async mode the rounds it missed while down (by its own
clock) are applied as unavailable rounds (:func:`catch_up_missed`), so its age and lag grow by
the missed rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from sfg.errors import SfgError
from sfg.net.checkpoints import load_checkpoint, save_checkpoint, write_atomic
from sfg.net.wire import Chunked


class NodeFiles:
    """Node ``i``'s files in ``folder`` (None: no checkpoints)."""

    def __init__(self, folder: Path | str | None, i: int):
        self.folder = None if folder is None else Path(folder)
        self.i = int(i)
        self.saved_out: set[int] = set()  # outbox rounds on disk

    @property
    def path(self) -> Path | None:
        """The checkpoint (None without a folder)."""
        return None if self.folder is None else self.folder / f"node-{self.i}.safetensors"

    def _outbox_path(self, r: int) -> Path:
        if self.folder is None:  # callers run only with checkpoints on
            raise SfgError(f"node {self.i}: no checkpoint folder configured")
        return self.folder / f"node-{self.i}-out-{r}.msgpack"

    def save_outbox(self, outbox: dict[int, Any], expected: dict[int, list[int]]) -> None:
        """Lockstep: own messages a neighbour may still need are part of the checkpoint (one
        msgpack file per round, written atomically once, removed when pruned). A neighbour
        that was offline in the node's next round can still be waiting for an older message
        when the node crashes; the restarted node must serve it (``Fetch``) or that
        neighbour, and the swarm, would wait forever."""
        if self.folder is None:
            return
        for r, (header, payload) in outbox.items():
            if r not in self.saved_out:
                body = payload.join() if isinstance(payload, Chunked) else payload
                write_atomic(self._outbox_path(r), msgpack.packb(
                    {"round": r, "header": header, "payload": body,
                     "expected": list(expected.get(r, ()))}, use_bin_type=True))
                self.saved_out.add(r)
        for r in sorted(self.saved_out - set(outbox)):
            self._outbox_path(r).unlink(missing_ok=True)
            self.saved_out.discard(r)

    def restore_outbox(self, before: int) -> tuple[dict[int, Any], dict[int, list[int]]]:
        """The saved own messages of rounds before ``before`` (the checkpoint's round; later
        ones are made again, their files removed): (outbox, who expects each)."""
        outbox: dict[int, Any] = {}
        expected: dict[int, list[int]] = {}
        if self.folder is None:
            raise SfgError(f"node {self.i}: no checkpoint folder configured")
        for f in self.folder.glob(f"node-{self.i}-out-*.msgpack"):
            d = msgpack.unpackb(f.read_bytes(), raw=False, strict_map_key=False)
            r = int(d["round"])
            if r < before:
                h = d["header"]  # one header, or one per neighbour (a liar's claims)
                header = {int(j): bytes(v) for j, v in h.items()} if isinstance(h, dict) \
                    else bytes(h)
                outbox[r] = (header, bytes(d["payload"]))
                expected[r] = [int(j) for j in d["expected"]]
                self.saved_out.add(r)
            else:
                f.unlink(missing_ok=True)
        return outbox, expected


def save(node: Any) -> None:
    """Checkpoint ``node`` (a :class:`sfg.net.node.Node`) after a round: its outbox
    (lockstep), then its model, state, clock origin, counts and (if it keeps them) its
    certified evidence."""
    path = node.files.path
    if path is None:
        return
    if node.cfg.mode == "lockstep":
        node.files.save_outbox(node.outbox, node.expected)
    s = node.stats
    extra = {"t0": node.t0, "stats": {k: getattr(s, k) for k in s.__dataclass_fields__}}
    if node.keeps_prev:
        extra["evidence"] = node.evidence.record(node.rounds_done)
    if not node.membership.fixed:  # peers: the setting and the table, as durations now
        extra["membership"] = node.membership.snapshot(node.clock.monotonic(),
                                                       node.clock.time())
    save_checkpoint(path, node.x, node.layout, node.state, extra)


def restore(node: Any) -> None:
    """``node`` as its checkpoint left it (nothing to resume from: it starts fresh)."""
    path = node.files.path
    if path is None or not path.is_file():
        return
    node.x, node.state, extra = load_checkpoint(path, node.layout)
    if not node.membership.fixed or extra.get("membership") is not None:
        # the table, older by the downtime; a checkpoint of another peers setting is refused
        saved = extra.get("membership")
        node.membership.restore(saved, node.clock.monotonic(), node.clock.time(), str(path))
    node.loaded = (node.x.copy(), node.state)  # what the checkpoint held (for checks)
    for k, v in extra.get("stats", {}).items():
        setattr(node.stats, k, [tuple(e) for e in v] if k == "curve" else v)
    if extra.get("t0") is not None:
        node.t0 = float(extra["t0"])
    node.round = node.state.t
    node.restored = {"round": node.state.t, "age": node.state.age, "lag": node.state.lag,
                     "missed": 0}
    if node.cfg.mode == "lockstep":
        outbox, expected = node.files.restore_outbox(node.state.t)
        node.outbox.update(outbox)
        node.expected.update(expected)
    if node.keeps_prev and extra.get("evidence") is not None:
        node.evidence.restore(extra["evidence"], path)


def catch_up_missed(node: Any) -> None:
    """Async resume: the own rounds whose wake-up passed while the node was down count as
    unavailable rounds (age and lag + 1 each), as an offline wake does (docs/concepts/clock.md#the-three-protocols); the node
    goes on with the first round whose wake-up is still ahead. A node restarted before its
    first checkpoint starts from the initial state, and its missed rounds count all the
    same."""
    if (node.restored is None and not node.cfg.resume) or node.t0 is None:
        return
    now = node.clock.time()
    missed = int(np.sum(node.wake_times()[node.state.t:] < now))
    if node.restored is None:
        if missed == 0:
            return
        node.restored = {"round": node.state.t, "age": node.state.age,
                         "lag": node.state.lag, "missed": 0, "checkpoint": False}
    for _ in range(missed):
        node.offline_round()
    if missed:
        save(node)  # a second crash before the next round resumes from here
    node.restored.update(missed=missed, age_after=node.state.age, lag_after=node.state.lag,
                         at=now)
