"""The model-free replay in rounds with peers chosen per exchange (docs/concepts/peers.md): the
sends of :func:`sfg.world.peers.round_sends` as the round's deliveries. Every pair of devices
that ever exchanged a message is a link of the run's graph (its union), and round t delivers
over a link in one direction exactly when the sender sent to the receiver in round t and the
receiver was available; the round (docs/concepts/round.md#one-round) then runs unchanged, so
every rule of a seed sees the same messages (they come from the seed's own streams, never from
the rule) and the staleness scalars act on them as they are."""

from __future__ import annotations

from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.world.peers import Peers, round_sends

# rules whose state is kept per neighbour, refused when peers change from one exchange to the
# next (docs/concepts/peers.md#rules-that-keep-state-per-neighbour)
PER_NEIGHBOUR_RULES = ("dfl-aa", "metropolis-hastings")


def check_rule(rule, peers: Peers) -> None:
    """Refuse (one line) a rule that keeps state per neighbour under ``peers`` ≠ fixed: link
    estimates q̂ (``dfl-aa``, ``+ipw``), degrees (``metropolis-hastings``), certified
    evidence (``+certified``) and ``+guard``'s evidence per link."""
    from sfg.round.defences import GUARD

    if peers.fixed:
        return
    why = None
    if rule.name in PER_NEIGHBOUR_RULES:
        why = "its weights read per-neighbour state (link estimates or degrees)"
    elif rule.ipw:
        why = "+ipw divides by a per-link estimate q̂"
    elif rule.certified:
        why = "+certified keeps evidence per neighbour"
    elif rule.defence_flags & GUARD:
        why = "+guard keeps evidence per link"
    if why is not None:
        raise SfgError(f"rule {str(rule)!r} cannot run with peers {str(peers)!r}: {why}, and "
                       "the peers change from one exchange to the next; use peers fixed, or a "
                       "rule without it")


def sampled_deliveries(peers: Peers, seed: int, available: np.ndarray, graph,
                       round_seconds: float, fates=None
                       ) -> tuple[Any, np.ndarray, dict[str, float]]:
    """(the union graph, its deliveries per slot bool[T, E], the counts) of a run in rounds
    under ``peers``; the counts are the messages, those sent to an unavailable target and the
    membership bytes, per device-hour of the run (N · T · Δ). ``fates``: a function of the
    sends (:func:`sfg.world.peers.round_sends`) giving which arrive (default: those whose
    target is available), e.g. the clock's lockstep deadlines."""
    from sfg.util.safety import check_memory
    from sfg.world.peers import union_links

    T, n = available.shape
    got = round_sends(peers, seed, available, graph, round_seconds)
    ok = got["reached"] if fates is None else fates(got)
    s, r, t = got["send"][ok], got["recv"][ok], got["round"][ok]
    union, rg, slot = union_links(n, s, r, f"peers {peers}")
    check_memory(T * rg.n_slots, f"the deliveries of peers {str(peers)!r} ({T} rounds × "
                 f"{rg.n_slots} links)", fix="use fewer clients or rounds")
    live = np.zeros((T, rg.n_slots), bool)
    live[t, slot] = True
    hours = n * T * round_seconds / 3600.0
    counts = {"peer_messages_per_device_hour": got["messages"] / hours,
              "messages_to_offline_per_device_hour": got["to_offline"] / hours,
              "membership_bytes_per_device_hour": got["membership_bytes"] / hours}
    return union, live, counts


def lockstep_sampled(world, settings, peers: Peers, *, local_steps: int, rounds: int,
                     seed: int):
    """The virtual clock's lockstep protocol under ``peers``: a device takes part in round r
    when it is online from rΔ until its S transfers and K steps are done, by (r+1)Δ
    (:func:`sfg.clock.schedule.participation`); round r's participants send to their drawn
    targets (the rounds' sampler on the participants), and a message arrives when its target
    takes part, it is there early enough for the target's K steps (transfer k of the sender
    ends at rΔ + (k+1)·dt, plus the latency) while the target is online, and the loss (the
    pair's message r) spares it. Returns (participants [T, N], the union graph, deliveries per
    slot [T, E], the counts, the digest)."""
    import hashlib

    from sfg.clock.links import loss_key, transfer_lost
    from sfg.clock.peersim import pair_world
    from sfg.clock.schedule import participation

    if settings.pull_timeout is not None:
        from sfg.clock.settings import REFUSE_LOCKSTEP_PULL

        raise SfgError(REFUSE_LOCKSTEP_PULL)
    n, delta = world.n, float(settings.round_seconds)
    start, part, online0, train, dt = participation(
        world, settings, local_steps=local_steps, rounds=rounds, sends=np.full(n, peers.s))
    lat, loss = pair_world(settings)
    stats: dict[str, float] = {}

    def fates(got):
        i, j, t = got["send"], got["recv"], got["round"]
        k = np.arange(i.size) % peers.s  # a sender's targets in the order drawn
        arrival = t * delta + (k + 1) * dt[i] + lat
        in_time = arrival <= t * delta + delta - train[j]
        rx = world.online.online_at(j, arrival)
        dropped = transfer_lost(loss_key(seed, "message"), i, j, t, loss) if loss else \
            np.zeros(i.size, bool)
        both = got["reached"]
        stats.update(late=float((both & ~in_time).sum()),
                     lost=float((both & in_time & ~(rx & ~dropped)).sum()))
        return both & in_time & rx & ~dropped

    union, live, counts = sampled_deliveries(peers, seed, part, world.graph, delta, fates)
    stats.update(participations=float(part.sum()), stragglers=float((online0 & ~part).sum()),
                 messages_sent=float(part.sum() * peers.s),
                 compute_seconds=float((part * train[None, :]).sum()))
    h = hashlib.blake2b(digest_size=16)
    h.update(f"lockstep peers {peers}".encode())
    h.update(np.ascontiguousarray(part).tobytes())
    h.update(np.ascontiguousarray(live).tobytes())
    return part, union, live, {**stats, **counts}, h.hexdigest()
