"""The metrics of a run: one name per quantity, in every engine that reports it.

Every metric that an engine (:data:`sfg.engines.ENGINES`) or the model-free replay
(``replay``: ``sfg replay``, on rounds and on the virtual clock) reports is one entry of
:data:`METRICS`: its name, unit, one-line definition, and the engines that report it (some
only under a setting, :attr:`Metric.when`). A name means the same quantity wherever it
appears: on the same run, two engines that both report a name report the same value (exactly
for the counts that do not read the models; ``tests/test_metric_names.py``). A quantity one
engine counts differently from another has a name of its own (the node's encoded bytes
``wire_bytes_received`` beside the nominal ``bytes``; its network's ``net_*`` counts).

Stores written before the names were unified (sfg 0.2.0) are read with their old names mapped
to these (:func:`upgrade`, one table: :data:`RENAMED`). ``docs/reference/metrics.md`` is
:func:`markdown` (write it with ``python -m sfg.metrics docs/reference/metrics.md``). This
module imports nothing heavy, so the command line and the store can read it at no cost.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sfg.engines import ENGINES

REPLAY = "replay"
# who reports metrics: the engines, and the model-free replay
REPORTERS: tuple[str, ...] = (*ENGINES, REPLAY)

_SIM = ("rounds", "clock-lockstep", "clock-async", "clock-event")
_CLOCK = ("clock-lockstep", "clock-async", "clock-event")
_TIMED = ("clock-async", "clock-event")  # the clock's engines with a schedule of events
_VNODES = tuple(e for e in ENGINES if e.startswith("node-"))  # the node on the virtual clock
_REAL = tuple(e for e in ENGINES if e.startswith("real-"))  # real nodes over gRPC
_NODES = (*_VNODES, *_REAL)
# the nodes that pull on return (asynchronous); the nodes that run +certified (lockstep)
_PULLING = tuple(e for e in _NODES if not e.endswith("-lockstep"))
_CERTIFYING = tuple(e for e in _NODES if e.endswith("-lockstep"))


@dataclass(frozen=True)
class Metric:
    """One metric: ``name``, ``unit``, one-line ``definition``, the ``engines`` that report
    it (names of :data:`REPORTERS`) and ``when`` they do when not always (a setting)."""

    name: str
    unit: str
    definition: str
    engines: tuple[str, ...]
    when: str = ""


def _m(name: str, unit: str, definition: str, engines: tuple[str, ...], when: str = "") -> Metric:
    return Metric(name, unit, definition, tuple(e for e in REPORTERS if e in engines), when)


_PULL = "with `on_return: pull`"
_FAULTS = "with `faults`"
_CERT = "with a `+certified` rule"
_ATTACK = "with an `attack`"
_PEERS = "with `peers` other than fixed"

METRICS: tuple[Metric, ...] = (
    # --------------------------------------------------------------- accuracy
    _m("acc_mean", "fraction", "mean personalised test accuracy over all clients at the end",
       ENGINES),
    _m("acc_p10", "fraction", "10th percentile of the clients' final test accuracy", ENGINES),
    *(_m(f"acc_q{q}", "fraction", f"mean final accuracy of the clients in availability "
         f"quartile {q} (1: least available)", ENGINES) for q in (1, 2, 3, 4)),
    _m("acc_time_avg", "fraction", "mean of the mean accuracy over the run's evaluations",
       ENGINES),
    _m("acc_honest_mean", "fraction", "mean final accuracy of the clients that do not attack",
       ENGINES, _ATTACK),
    _m("acc_honest_p10", "fraction", "10th percentile of the final accuracy of the clients "
       "that do not attack", ENGINES, _ATTACK),
    _m("time_to_accuracy_h", "hours", "virtual time at which the mean accuracy first reaches "
       "`target_accuracy` (NaN: never)", (*_CLOCK, *_VNODES)),
    _m("reached_target", "0/1", "whether the mean accuracy reached `target_accuracy`",
       (*_CLOCK, *_VNODES)),
    # --------------------------------------------------------------- training and messages
    _m("messages", "messages", "neighbour models aggregated (received and used), summed over "
       "every aggregation", REPORTERS),
    _m("scalars", "scalars", "staleness scalars received with them: `messages` times the "
       "scalars of the rule's header", (*_SIM, *_NODES)),
    _m("local_steps_rel", "ratio", "local SGD steps taken relative to DFedAvg's K per "
       "available client and round", ENGINES),
    _m("unavailability", "fraction", "realised offline fraction of the clients' time",
       REPORTERS),
    _m("local_rounds", "local rounds", "local rounds committed (aggregate, train K steps, "
       "send); lockstep: the rounds' participations", (*_CLOCK, *_NODES, REPLAY)),
    _m("messages_sent", "messages", "messages whose transfer ended with the sender online "
       "(one per neighbour and local round; real nodes: handed to the transport)",
       (*_CLOCK, *_NODES, REPLAY)),
    _m("bytes", "bytes", "nominal bytes sent: `messages_sent` times `message_bytes` (the "
       "model's float32 parameters and a 256-byte header unless set)",
       (*_CLOCK, *_NODES, REPLAY)),
    _m("delivered", "messages", "messages that arrived at an online receiver, not lost",
       (*_TIMED, REPLAY)),
    _m("compute_seconds", "seconds", "virtual seconds of local training (steps times each "
       "device's seconds per step)", (*_CLOCK, REPLAY)),
    _m("late", "messages", "lockstep: messages that would arrive after their round's deadline",
       ("clock-lockstep", REPLAY)),
    _m("lost", "messages", "lockstep: messages lost (receiver offline on arrival, or `loss`)",
       ("clock-lockstep", REPLAY)),
    _m("stragglers", "client-rounds", "lockstep: clients online at a round's start whose "
       "steps and sends cannot finish online by its end", ("clock-lockstep", REPLAY)),
    _m("lost_sender", "messages", "messages whose sender went offline before their transfer "
       "ended", (*_TIMED, REPLAY)),
    _m("lost_receiver", "messages", "messages sent whose receiver was offline on arrival",
       (*_TIMED, REPLAY)),
    _m("lost_random", "messages", "messages sent to an online receiver but lost to `loss`",
       (*_TIMED, REPLAY)),
    _m("lost_link", "messages", "messages lost to a failed link (`link_failure`)",
       (*_TIMED, REPLAY)),
    _m("wakes", "wakes", "async: timer wakes of every device", ("clock-async", REPLAY)),
    _m("offline_wakes", "wakes", "async: wakes of an offline device", ("clock-async", REPLAY)),
    _m("skipped", "wakes", "async: wakes of a device still busy with its last local round",
       ("clock-async", *_VNODES, REPLAY)),
    _m("interrupted", "local rounds", "local rounds discarded: the device went offline before "
       "its K steps ended", (*_TIMED, *_VNODES, REPLAY)),
    _m("unfinished", "local rounds", "local rounds still running at the end of the run",
       (*_TIMED, *_VNODES, REPLAY)),
    # lockstep: the rates of messages sent, bytes and compute-seconds only
    *(_m(f"{k}_per_device_hour", f"{unit} per device-hour",
         f"`{k}` per device-hour of the run (N · horizon / 3600)",
         (*(_CLOCK if k in ("messages_sent", "bytes", "compute_seconds") else _TIMED), REPLAY),
         _PULL if k.startswith("pull_") else "")
      for k, unit in (("local_rounds", "local rounds"), ("messages_sent", "messages"),
                      ("delivered", "messages"), ("bytes", "bytes"),
                      ("compute_seconds", "seconds"), ("pull_requests", "requests"),
                      ("pull_replies", "replies"), ("pull_empty", "answers"),
                      ("pull_unreachable", "answers"), ("pull_bytes", "bytes"),
                      ("pull_wait_seconds", "seconds"))),
    # --------------------------------------------------------------- returns in time
    _m("returns", "returns", "returns in time: starts of online intervals after the run's "
       "start (a restart online for a node)", (*_TIMED, *_PULLING, REPLAY)),
    _m("returns_aggregated", "returns", "returns followed by an aggregation before the next "
       "outage", (*_TIMED, REPLAY)),
    _m("returns_heard", "returns", "returns whose first aggregation held at least one "
       "neighbour's model", (*_TIMED, *_PULLING, REPLAY)),
    _m("returns_alone", "returns", "returns with no neighbour online and reachable at the "
       "return", (*_TIMED, REPLAY)),
    _m("returns_unanswered", "returns", "returns whose pull no neighbour answered with a "
       "message (all unreachable, empty or silent)", _PULLING, _PULL),
    _m("pull_requests", "requests", "pull requests whose transfer ended with the returning "
       "device online", (*_TIMED, "node-async", REPLAY), _PULL),
    _m("pull_replies", "replies", "replies with a model whose transfer ended with the "
       "answering neighbour online", (*_TIMED, "node-async", REPLAY), _PULL),
    _m("pull_empty", "answers", "empty answers sent (the neighbour had never sent)",
       (*_TIMED, "node-async", REPLAY), _PULL),
    _m("pull_unreachable", "answers", "requests answered unreachable (the neighbour offline)",
       (*_TIMED, "node-async", REPLAY), _PULL),
    _m("pull_replies_delivered", "replies", "replies with a model accepted by the returning "
       "device", (*_TIMED, *_PULLING, REPLAY), _PULL),
    _m("pull_bytes", "bytes", "nominal bytes of the pull: requests and empty answers at the "
       "header's 256 bytes, replies at `message_bytes`", (*_TIMED, "node-async", REPLAY), _PULL),
    _m("pull_wait_seconds", "seconds", "delay of the first local rounds after returns, "
       "against no pull (virtual seconds; real nodes: wall seconds)",
       (*_TIMED, *_PULLING, REPLAY), _PULL),
    _m("pull_abandoned", "waits", "waits abandoned: the device went offline inside its window",
       (*_TIMED, *_PULLING, REPLAY), _PULL),
    _m("pull_windows", "windows", "waits opened (one per return that pulls)",
       (*_TIMED, REPLAY), _PULL),
    _m("pull_timed_out", "windows", "waits ended by the timeout, not by every answer",
       (*_TIMED, REPLAY), _PULL),
    _m("pull_skipped", "wakes", "async: wakes skipped inside a wait", (*_TIMED, REPLAY), _PULL),
    _m("pull_requests_made", "requests", "the nodes' pull requests (one per neighbour and "
       "return)", _PULLING, _PULL),
    _m("pull_empty_received", "answers", "empty answers the returning nodes received",
       _PULLING, _PULL),
    _m("pull_unreachable_received", "answers", "unreachable answers the returning nodes "
       "received", _PULLING, _PULL),
    _m("pull_rejected", "replies", "replies the node's checks rejected", _PULLING, _PULL),
    _m("pull_replies_unused", "replies", "accepted replies not newer than what the node held",
       _PULLING, _PULL),
    _m("pull_replies_lost", "replies", "replies that arrived while the node was offline again",
       _PULLING, _PULL),
    _m("wire_pull_bytes_received", "bytes", "encoded bytes of the pull replies the nodes "
       "received", _PULLING, _PULL),
    # --------------------------------------------------------------- faults
    *(_m(f"fault_{k}", "messages", f"messages {what} by a fault", (*_TIMED, REPLAY), _FAULTS)
      for k, what in (("lost", "lost"), ("partitioned", "cut off by a partition"),
                      ("delayed", "delayed"), ("corrupted", "corrupted (refused)"))),
    # --------------------------------------------------------------- the nodes
    _m("wire_bytes_received", "bytes", "encoded bytes (header and payload) of the messages "
       "the nodes accepted", _NODES),
    _m("header_bytes", "bytes per message", "mean encoded header size of the messages sent",
       _NODES),
    _m("rejected", "messages", "messages the nodes' checks rejected", _NODES),
    _m("deliveries_refused", "messages", "deliveries a node refused while unavailable or "
       "partitioned", _NODES),
    _m("send_failed", "messages", "sends not delivered: transport error or rejection", _NODES),
    _m("restarts", "restarts", "nodes restarted from their checkpoint after a crash", _NODES),
    _m("wall_seconds", "seconds", "wall-clock seconds of the run", _NODES),
    _m("rss_mb_per_node", "MB", "resident memory per node process (`sfg swarm`, real nodes)",
       _REAL),
    _m("startup_seconds", "seconds", "wall seconds until every node served (`sfg swarm`, "
       "real nodes)", _REAL),
    _m("virtual_seconds", "seconds", "virtual time when the last node finished", _VNODES),
    _m("train_batches", "batches", "batched training calls of the virtual swarm", _VNODES),
    _m("train_requests", "local rounds", "local rounds the virtual swarm's trainer ran",
       _VNODES),
    _m("net_sent", "messages", "messages handed to the in-memory network (lost by the sender "
       "included)", _VNODES),
    *(_m(f"net_{k}", "messages", f"messages the in-memory network {what}", _VNODES,
         "" if k in ("lost_sender", "lost_random", "no_server", "past_horizon") else _FAULTS)
      for k, what in (("lost_sender", "lost: sender offline before the transfer ended"),
                      ("lost_random", "lost to `loss`, drawn once the receiver is there at "
                       "the arrival (without faults; before it is reached with them)"),
                      ("past_horizon", "refused: they would arrive after the run's end"),
                      ("dropped", "dropped (fault)"), ("duplicated", "duplicated (fault)"),
                      ("delayed", "delayed (fault)"), ("partitioned", "cut off (partition)"),
                      ("no_server", "found no server for (receiver crashed)"))),
    _m("net_pull_faults", "messages", "pull requests and replies a fault lost, cut or "
       "corrupted", ("node-async",), _PULL),
    # --------------------------------------------------------------- claims
    _m("claims_refused", "fraction", "share of the neighbours' claims refused by their "
       "evidence", ("rounds", "clock-lockstep", *_CERTIFYING, REPLAY), _CERT),
    _m("signatures", "signatures", "headers signed", _CERTIFYING, _CERT),
    _m("verifications", "signatures", "signatures verified", _CERTIFYING, _CERT),
    _m("sign_ms_per_node_round", "ms", "signing time per node and round", _CERTIFYING, _CERT),
    _m("verify_ms_per_node_round", "ms", "verification time per node and round", _CERTIFYING,
       _CERT),
    # --------------------------------------------------------------- the model-free replay
    _m("returning_aggregations", "aggregations", "aggregations by a returning client "
       "(age τ ≥ 1)", (REPLAY,)),
    _m("returning_aggregations_heard", "fraction", "share of returning aggregations that hold "
       "a live neighbour's model", (REPLAY,)),
    _m("aggregations", "aggregations", "local rounds that aggregate (virtual clock)", (REPLAY,)),
    _m("premise", "fraction", "share of returning aggregations with a live neighbour where the "
       "receiver is strictly the stalest candidate", (REPLAY,)),
    _m("spread_age", "rounds", "mean over aggregations of the largest relative age",
       (REPLAY,)),
    _m("spread_lag", "rounds", "mean over aggregations of the largest relative lag",
       (REPLAY,)),
    _m("kept", "candidates", "mean candidates with weight > 0 per aggregation", (REPLAY,)),
    _m("self_weight_return", "weight", "mean receiver self-weight on return", (REPLAY,)),
    _m("H", "weight", "receiver self-return over the horizon (NaN on async and event)",
       (REPLAY,)),
    _m("H_se", "weight", "standard error of H when sampled", (REPLAY,)),
    _m("H_pairs", "pairs", "(start, receiver) pairs H averages", (REPLAY,)),
    _m("final_mean_lag", "rounds", "mean lag at the end", (REPLAY,)),
    _m("peer_messages_per_device_hour", "messages", "messages sent to the peers drawn per "
       "exchange, per device-hour", (*_SIM, *_REAL, REPLAY), _PEERS),
    _m("messages_to_offline_per_device_hour", "messages", "of those, messages whose target "
       "was offline (lost), per device-hour", (*_SIM, *_REAL, REPLAY), _PEERS),
    _m("membership_bytes_per_device_hour", "bytes", "bytes of the membership entries the "
       "messages carry (12 each), per device-hour", (*_SIM, *_REAL, REPLAY),
       _PEERS),
    _m("attack_weight", "weight", "mean weight honest receivers give attackers", (REPLAY,),
       _ATTACK),
    _m("self_cut", "fraction", "share of honest aggregations whose own model is cut",
       (REPLAY,), _ATTACK),
    _m("reach", "fraction", "share of honest clients whose model carries ≥ 10% attacker "
       "weight at the end of each horizon window", (REPLAY,), _ATTACK),
    _m("clamped", "claims", "claims a defence clamped", (REPLAY,), "with a defence"),
)
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
assert len(BY_NAME) == len(METRICS), "a metric registered twice"

# the virtual clock's schedule counts (sfg.clock.schedule, sfg.clock.pull) -> metric names
# (None: not reported, another metric holds it); a count not listed keeps its name
CLOCK_COUNTS: dict[str, str | None] = {
    "participations": "local_rounds", "bytes_sent": "bytes", "candidates": None,
    "online_returns": "returns", "online_returns_aggregated": "returns_aggregated",
    "online_returns_heard": "returns_heard", "online_returns_alone": "returns_alone",
}


def unavailability(online, horizon: float) -> float:
    """``unavailability``, the one formula of every engine: 1 − the clients' online time over
    all of theirs, ``online`` [N] each client's online time (rounds or seconds) over a run
    of ``horizon`` (the same unit), summed exactly (so rounds and seconds of whole rounds give
    the same bits). NaN for no client or no time."""
    import math

    n = len(online)
    if n == 0 or not horizon > 0:
        return float("nan")
    return 1.0 - math.fsum(float(x) for x in online) / (n * float(horizon))


def clock_name(count: str) -> str | None:
    """The metric name of the clock's schedule count ``count`` (None: not reported)."""
    return CLOCK_COUNTS.get(count, count)


def reported_by(engine: str) -> set[str]:
    """The names ``engine`` (one of :data:`REPORTERS`) may report."""
    if engine not in REPORTERS:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(REPORTERS)}")
    return {m.name for m in METRICS if engine in m.engines}


# ----------------------------------------------------------------------------- old names
# sfg 0.2.0's names -> today's, per kind of row: "clock" (the virtual clock's counts, in
# training and replay rows), "node" (sfg swarm rows), "run" (training rows), "replay"
# (sfg replay rows). None: dropped (another metric holds the same value).
_OLD_CLOCK = ("participations", "stragglers", "late", "lost", "messages_sent", "bytes_sent",
              "compute_seconds", "local_rounds", "delivered", "candidates", "lost_sender",
              "lost_receiver", "lost_random", "lost_link", "wakes", "skipped", "interrupted",
              "unfinished", "offline_wakes", "online_returns", "online_returns_aggregated",
              "online_returns_heard", "online_returns_alone", "pull_requests", "pull_replies",
              "pull_empty", "pull_unreachable", "pull_replies_delivered", "pull_bytes",
              "pull_wait_seconds", "pull_skipped", "pull_abandoned", "pull_windows",
              "pull_timed_out", "fault_partitioned", "fault_lost", "fault_delayed",
              "fault_corrupted")
_PER_HOUR = ("local_rounds", "messages_sent", "delivered", "bytes_sent", "compute_seconds",
             "pull_requests", "pull_replies", "pull_empty", "pull_unreachable", "pull_bytes",
             "pull_wait_seconds")
RENAMED: dict[str, dict[str, str | None]] = {
    "clock": {**{f"clock_{k}": clock_name(k) for k in _OLD_CLOCK},
              **{f"clock_{k}_per_device_hour": f"{clock_name(k)}_per_device_hour"
                 for k in _PER_HOUR}},
    "node": {"bytes": "wire_bytes_received", "refused": "deliveries_refused",
             "returns_alone": "returns_unanswered", "pull_requests": "pull_requests_made",
             "pull_replies": "pull_replies_delivered", "pull_empty": "pull_empty_received",
             "pull_unreachable": "pull_unreachable_received",
             "pull_bytes": "wire_pull_bytes_received", "net_pull_requests": "pull_requests",
             "net_pull_replies": "pull_replies", "net_pull_empty": "pull_empty",
             "net_pull_unreachable": "pull_unreachable"},
    "run": {"refused": "claims_refused"},
    "replay": {"refused": "claims_refused", "returns": "returning_aggregations",
               "returns_heard": "returning_aggregations_heard"},
}


def old_kind(metrics: Mapping[str, Any], kind: str = "train") -> str | None:
    """Which table of :data:`RENAMED` a stored row's ``metrics`` need besides the clock's
    (``kind``: the run config's ``train`` or ``replay``): ``node`` for a swarm row of 0.2.0
    (``bytes`` without ``messages_sent``), ``replay`` for a replay row of 0.2.0 (``returns``
    without ``returning_aggregations``), ``run`` for a training row with ``refused``; None
    for a row with today's names."""
    if kind == "replay":
        return "replay" if "returns" in metrics and "returning_aggregations" not in metrics \
            or "refused" in metrics else None
    if "bytes" in metrics and "messages_sent" not in metrics:
        return "node"
    return "run" if "refused" in metrics else None


def upgrade(metrics: Mapping[str, Any], kind: str = "train") -> dict[str, Any]:
    """A stored row's ``metrics`` under today's names: the old names of sfg 0.2.0 mapped
    (:data:`RENAMED`), values unchanged; a row with today's names is returned as it is."""
    table = dict(RENAMED["clock"])
    which = old_kind(metrics, kind)
    if which is not None:
        table.update(RENAMED[which])
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        new = table.get(k, k)
        if new is not None:
            out[new] = v
    return out


# ----------------------------------------------------------------------------- the page
_PAGE_HEAD = """\
# Metrics

Every metric a run reports, with its unit, its definition and the engines that report it
(`replay`: the model-free `sfg replay`, on rounds and on the virtual clock). A name means one
quantity wherever it appears: on the same run, two engines that both report a name report the
same value — exactly for the counts that do not read the models (messages, bytes, returns,
returns heard), and every accuracy figure where the engines train the same models. A quantity
that one engine counts differently has a name of its own: `bytes` is the nominal bytes sent
(`message_bytes` per message) everywhere; the nodes' encoded bytes are `wire_bytes_received`;
their in-memory network's counts are `net_*`. The engines:

{engines}

The table is generated from `sfg.metrics` (`python -m sfg.metrics docs/reference/metrics.md`);
`tests/test_metric_names.py` runs every engine and checks that every metric it reports is
listed here for it.

"""

_PAGE_TAIL = """
## Names of sfg 0.2.0

A results store written by sfg 0.2.0 reads with today's names: the old names below are mapped
when a run is read (`sfg report`, `sfg.experiments.records`), values unchanged.

| old name | name | rows |
|---|---|---|
{renamed}
"""


def markdown() -> str:
    """The reference page ``docs/reference/metrics.md``."""
    from sfg.engines import ENGINE_COMMANDS

    engines = "\n".join([*(f"* `{e}`: `{ENGINE_COMMANDS[e]}`" for e in ENGINES),
                         f"* `{REPLAY}`: `sfg replay` (model-free)"])
    rows = ["| metric | unit | definition | engines |", "|---|---|---|---|"]
    for m in METRICS:
        who = ", ".join(f"`{e}`" for e in m.engines) + (f" ({m.when})" if m.when else "")
        rows.append(f"| `{m.name}` | {m.unit} | {m.definition} | {who} |")
    where = {"clock": "virtual clock", "node": "`sfg swarm`", "run": "training",
             "replay": "`sfg replay`"}
    renamed = "\n".join(f"| `{old}` | {f'`{new}`' if new else '(dropped: `messages`)'} | "
                        f"{where[kind]} |"
                        for kind, table in RENAMED.items() for old, new in table.items())
    return _PAGE_HEAD.format(engines=engines) + "\n".join(rows) + "\n" \
        + _PAGE_TAIL.format(renamed=renamed)


def main(argv: list[str]) -> int:
    """``python -m sfg.metrics [OUT]``: print the page, or write it to OUT."""
    from sfg.util.page import page_main

    return page_main(markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
