"""The model-free replay in rounds with peers chosen per exchange (docs/concepts/peers.md): the
sends of :func:`sfg.world.peers.round_sends` as the round's deliveries. Every pair of devices
that ever exchanged a message is a link of the run's graph (its union), and round t delivers
over a link in one direction exactly when the sender sent to the receiver in round t and the
receiver was available; the round (docs/concepts/round.md#one-round) then runs unchanged, so
every rule of a seed sees the same messages (they come from the seed's own streams, never from
the rule) and the staleness scalars act on them as they are."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.world.peers import Peers, round_sends

# what keeps state per neighbour, refused when the peers change from one exchange to the
# next (docs/concepts/peers.md#rules-that-keep-state-per-neighbour): the rules by name and the
# modifiers, each with why. One source: check_rule refuses them, and the rules reference's
# column (docs/reference/rules.md, :func:`rules_markdown`) is written from them.
PER_NEIGHBOUR_RULES: dict[str, str] = {
    "dfl-aa": "its weights divide by a link estimate q̂ per neighbour",
    "metropolis-hastings": "its weights read the neighbours' degrees",
    **{name: "it keeps the last model received from each neighbour"
       for name in ("model-memory", "model-memory+sfg", "model-memory+sfg-l")},
    "relative-variance": "it keeps a model-distance average per neighbour",
}
PER_NEIGHBOUR_MODIFIERS: dict[str, str] = {
    "ipw": "+ipw divides by a link estimate q̂ per neighbour",
    "guard": "+guard keeps evidence per link",
    "refute": "+refute keeps +guard's evidence per link",
    "certified": "+certified keeps evidence per neighbour",
}


def per_neighbour(rule) -> str | None:
    """Why ``rule`` (a parsed rule) keeps state per neighbour, or None when it keeps none."""
    if rule.name in PER_NEIGHBOUR_RULES:
        return PER_NEIGHBOUR_RULES[rule.name]
    for m in rule.modifiers:
        if m in PER_NEIGHBOUR_MODIFIERS:
            return PER_NEIGHBOUR_MODIFIERS[m]
    return None


def check_rule(rule, peers: Peers) -> None:
    """Refuse (one line) a rule that keeps state per neighbour (:func:`per_neighbour`) under
    ``peers`` ≠ fixed: link estimates q̂ (``dfl-aa``, ``+ipw``), degrees
    (``metropolis-hastings``), model memories (``model-memory*``), model-distance averages
    (``relative-variance``), certified evidence (``+certified``) and ``+guard``'s (and
    ``+refute``'s) evidence per link."""
    if peers.fixed:
        return
    why = per_neighbour(rule)
    if why is not None:
        raise SfgError(f"rule {str(rule)!r} cannot run with peers {str(peers)!r}: {why}, and "
                       "the peers change from one exchange to the next; use peers fixed, or a "
                       "rule without it")


def schedule_digest(label: str, *arrays: np.ndarray) -> str:
    """The digest of a run's sampled exchanges (``label``, then each array's bytes): every
    rule of a seed has the same (the pairing, docs/concepts/peers.md#targets)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(label.encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


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
    return part, union, live, {**stats, **counts}, schedule_digest(f"lockstep peers {peers}",
                                                                     part, live)


_PAGE_HEAD = """# Rules and modifiers

Every aggregation rule and modifier, as `sfg rules` lists them, and whether each runs with
[peers chosen per exchange](../concepts/peers.md) (`peers` other than `fixed`). A rule or
modifier that keeps state per neighbour (a link estimate, a model memory, degrees, evidence)
would carry it across exchanges with different peers: it is refused with one line there. The
formulas are in [the rule family](../concepts/rules.md).

The table is generated from `sfg.round.rules` and `sfg.modelfree.peers` (`python -m
sfg.modelfree.peers docs/reference/rules.md`); `tests/test_peers_train.py` checks that it is
current and that its last column is what the runs refuse.

"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _peers_cell(why: str | None) -> str:
    return "runs" if why is None else f"refused: {why}"


def rules_markdown() -> str:
    """docs/reference/rules.md: every registered rule and every modifier, and whether it runs
    under ``peers`` ≠ fixed (:func:`per_neighbour`, what :func:`check_rule` refuses)."""
    from sfg.round.rules import MODIFIERS, RULES, parse_rule, rule_names

    head = "| rule | kind | parameters | description | peers other than `fixed` |"
    rows = [head, "|---|---|---|---|---|"]
    for name in rule_names():
        e = RULES.entry(name)
        params = ", ".join(f"`{k}={v:g}`" for k, v in e.params.items())
        rows.append(f"| `{name}` | {', '.join(sorted(e.tags))} | {params} | {_cell(e.doc)} | "
                    f"{_peers_cell(per_neighbour(parse_rule(name)))} |")
    rows += ["", "| modifier | peers other than `fixed` |", "|---|---|"]
    for m in MODIFIERS:
        rows.append(f"| `+{m}` | {_peers_cell(PER_NEIGHBOUR_MODIFIERS.get(m))} |")
    return _PAGE_HEAD + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    """``python -m sfg.modelfree.peers [OUT]``: print docs/reference/rules.md, or write it to
    OUT."""
    from sfg.util.page import page_main

    return page_main(rules_markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
