"""The options that several commands share: one definition each (name, values, help).

Every command that takes a concept — the protocol, the clock, the rounds, the clients, the data
split, a network cut, a crash, the deadline, the jitter — takes it through :func:`opt`, so the
name, the short option and the help are the same in ``sfg run``, ``sfg replay``, ``sfg swarm``
and ``sfg node`` (``docs/reference/options.md`` tabulates every option against every command).
A command passes its own default only where the command's job needs one (``sfg replay``'s
N and T); otherwise the default is the run settings' (:class:`sfg.experiments.config.RunConfig`).

Old spellings keep their old meaning in their old command for one minor version, with a
one-line notice (:func:`deprecated`).
"""

from __future__ import annotations

from typing import Any

import typer

from sfg.cli import console
from sfg.engines import REAL_PERIOD as _REAL_PERIOD
from sfg.errors import SfgError
from sfg.net.assemble import REAL_DEADLINE

CLOCK_PANEL = "Clock and protocol"
REAL_PANEL = "Real nodes"
FAULT_PANEL = "Faults"

#: the lockstep deadline of real nodes, in seconds: one default in ``sfg swarm`` and ``sfg node``
#: (and sfg.swarm)
DEADLINE = REAL_DEADLINE
#: a real node's period P in seconds when none is given (the virtual clock's is Δ, 600 s)
REAL_PERIOD = _REAL_PERIOD

# name -> (option names, help, panel). The help says every command's meaning where the
# commands differ in what they run, never a different concept under the same name.
SPECS: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "config": (("--config", "-c"), "YAML/JSON file of run settings (as for `sfg run`; `kind: replay` files for `sfg replay`); flags given explicitly override it", None),
    "dataset": (("--dataset",), "digits (embedded), cifar10, cifar100, femnist, imagefolder; the clients' data sizes as parameters, e.g. cifar10:min_train=4,test_per_client=50", None),
    "data_root": (("--data-root",), "Path to the dataset in its standard format", None),
    "model": (("--model",), "mlp, small-cnn, cnn, resnet18-gn", None),
    "process": (("--process", "-p"), "Outage process or trace, e.g. iid:u=0.6, bursty:u=0.8, flash:rule=strict,path=FILE, trace:path=fleet.csv", None),
    "rule": (("--rule", "-r"), "Aggregation rule, e.g. sfg-cut, sfg-cut:L=2, sfg-l:gamma=0.3+ipw", None),
    "peers": (("--peers",), "Whom each send goes to: fixed (default: the graph's neighbours), epidemic:s=S (S devices drawn afresh from all others) or online:s=S,view=V,gossip=M (S drawn from a table of V peers last heard of online, M entries carried in every message; defaults V 4S, M S); `sfg replay` runs it in rounds and on the virtual clock; `sfg run` trains with it in rounds and on the clock's lockstep, async and event; the nodes (`sfg swarm`, also `--clock virtual`, and `sfg node`) draw their peers with it (lockstep nodes: epidemic only); a rule that keeps state per neighbour is refused with it", None),
    "graph": (("--graph",), "Graph: knn:k=6, erdos-renyi:mean_degree=6, regular:d=6, ring:k=1 (`sfg node`: when peers.yaml lists no edges)", None),
    "seed": (("--seed",), "Seed (pairs graph, data, trace, minibatches)", None),
    "clients": (("--clients", "-n"), "Number of clients (nodes) N", None),
    "rounds": (("--rounds", "-T"), "Number of rounds T", None),
    "local_steps": (("--local-steps", "-K"), "Local steps K per round (on the virtual clock: K × compute seconds)", None),
    "batch_size": (("--batch-size",), "Minibatch size of local training", None),
    "lr": (("--lr",), "Learning rate of local training", None),
    "weight_decay": (("--weight-decay",), "Weight decay of local training", None),
    "momentum": (("--momentum",), "Momentum of local training", None),
    "alpha": (("--alpha",), "Dirichlet label-skew concentration of the data split (with --partition dirichlet)", None),
    "partition": (("--partition",), "The data split across clients: dirichlet (uses --alpha) or classes:k=2 (each client exactly k classes). A network cut is --cut", None),
    "eval_every": (("--eval-every",), "Evaluate every this many rounds and at the end (default 10, or T when T < 10)", None),
    "attack": (("--attack",), "Forged-staleness attack, e.g. forge:frac=0.1,claim=fresh,model=sign-flip (default none; `sfg replay`: repeatable, one more axis, none among them)", None),
    "anatomy": (("--anatomy",), "What an outage disables: full, cannot-communicate, cannot-train-shares, cannot-train-adopts", None),
    "link_failure": (("--link-failure",), "Rounds: the probability, each round, that each link of the graph fails (both directions, that round only); the round-based counterpart of --loss", None),
    "json": (("--json",), "Print JSON", None),
    "store": (("--store", "-s"), "SQLite results store (`sfg grid run` and `sfg swarm` write runs into it, created if missing; `sfg grid status` and `sfg report` read it)", None),
    # the clock and the protocol
    "clock": (("--clock",), "rounds (default: time counted in rounds — `sfg run`/`sfg replay` synchronous rounds, `sfg swarm` real nodes over gRPC on their own time) or virtual (time in seconds on the virtual clock)", CLOCK_PANEL),
    "protocol": (("--protocol",), "lockstep (rounds: every node waits for its neighbours' models up to --deadline), async (every node on its own timer, period --period) or event (train-send-repeat; the virtual clock only). Default lockstep; `sfg run`/`sfg replay` need --clock virtual for async and event", CLOCK_PANEL),
    "round_seconds": (("--round-seconds",), "Virtual clock: Δ, the seconds of one round and of one staleness unit (default 600; `sfg swarm` takes --period)", CLOCK_PANEL),
    "period": (("--period",), "async: the wake period P in seconds (default: Δ on the virtual clock, 0.2 for real nodes; in `sfg swarm --clock virtual` P is also Δ)", CLOCK_PANEL),
    "jitter": (("--jitter",), "async: wake jitter, a fraction of the period P in [0, 1) by which each wake-up is shifted at random (default 0)", CLOCK_PANEL),
    "window": (("--window",), "async: W, a neighbour's latest message counts if it arrived within W periods (default 1)", CLOCK_PANEL),
    "deadline": (("--deadline",), f"lockstep: longest wait for a round's models, in seconds (default {DEADLINE:g} for real nodes; with --clock virtual, virtual seconds, default the run's T·P)", CLOCK_PANEL),
    "compute": (("--compute",), "Virtual clock: seconds per local step per device, e.g. const:value=2, lognormal:median=2,sigma=1, trace:path=FILE.csv", CLOCK_PANEL),
    "uplink": (("--uplink",), "Virtual clock: uplink bytes/s per device (default const:value=inf: instant)", CLOCK_PANEL),
    "latency": (("--latency",), "Virtual clock: seconds per directed link, e.g. lognormal:median=0.1,sigma=0.5", CLOCK_PANEL),
    "loss": (("--loss",), "Virtual clock: the probability, per directed link, that a message on it is lost (a property of the world drawn per link, e.g. const:value=0.1); in rounds see --link-failure, as a fault event see --faults loss=", CLOCK_PANEL),
    "message_bytes": (("--message-bytes",), "Virtual clock: bytes per message (default: the model's float32 parameters + 256 when training, 0 in replay)", CLOCK_PANEL),
    "eval_seconds": (("--eval-seconds",), "Virtual clock: evaluate every this many seconds of virtual time (default eval_every·Δ)", CLOCK_PANEL),
    "on_return": (("--on-return",), "async and event (virtual clock), async real nodes: what a device does when it comes back online: none (default: it trains at once on what it holds) or pull:timeout=S (it asks its neighbours, or under --peers the peers drawn for the return, for their latest models and trains when they have answered or S seconds have passed, virtual seconds on the clock, wall seconds for real nodes; default S 60, under async S < P)", CLOCK_PANEL),
    "target_accuracy": (("--target-accuracy",), "Virtual clock: mean accuracy whose first time is reported as time-to-accuracy (default 0.8)", CLOCK_PANEL),
    # faults
    "faults": (("--faults",), "Virtual clock, async/event: message faults as events of the schedule, e.g. faults:loss=0.1,delay=2,dup=0.05,reorder=0.1,corrupt=0.01 (loss= drops each message at random, independent of the link, unlike --loss); cuts and crashes: --cut, --crash (none: no faults)", FAULT_PANEL),
    "faults_seed": (("--faults-seed",), "Seed of the faults' own draws (default 0), independent of --seed: a failing seed replays exactly", FAULT_PANEL),
    "cut": (("--cut",), "Network cut: drop the traffic between node sets A and B, A|B@5r-9r (rounds 5..9, real nodes) or A|B@1200s-3600s (seconds [1200, 3600), the virtual clock); a set is ids and ranges joined by ',' (0,1 or 0-3), '*' the other nodes (seconds only) (repeatable)", FAULT_PANEL),
    "crash": (("--crash",), "Crash a node: NODE@10r (real nodes: SIGKILL its process at round 10; it restarts from its checkpoint) or NODE@1500s (virtual clock: at 1500 s) (repeatable)", FAULT_PANEL),
}


def opt(name: str, default: Any = None, *, also: tuple[str, ...] = (), **extra: Any) -> Any:
    """The one ``typer.Option`` of ``name`` (a key of :data:`SPECS`); ``default`` where the
    command's job sets one (otherwise the run settings' default applies); ``also``: a
    command's own further spelling (``sfg swarm --nodes``)."""
    decls, help_text, panel = SPECS[name]
    decls = (*also, *decls)
    kw: dict[str, Any] = {}
    if default is None and "show_default" not in extra:
        help_text = with_default(name, help_text)
        kw["show_default"] = False  # said in the text (older typer would add "[default: None]")
    kw["help"] = help_text
    if panel is not None:
        kw["rich_help_panel"] = panel
    kw.update(extra)
    return typer.Option(default, *decls, **kw)


#: option names whose run setting (sfg.engines.DEFAULTS) has another name
_SETTING = {"clients": "n_clients"}


def with_default(name: str, help_text: str) -> str:
    """``help_text`` with the run settings' default of option ``name`` appended, where the
    text does not already say its default (a command that passes its own default shows it
    through typer)."""
    from sfg.engines import DEFAULTS

    value = DEFAULTS.get(_SETTING.get(name, name))
    if value is None or value == "" or "default" in help_text.lower():
        return help_text
    return f"{help_text} (default {value})"


def deprecated(old: str, new: str, command: str) -> None:
    """The one-line notice of an old spelling (it keeps working for one minor version)."""
    console.note(f"warning: {old} is deprecated; use {new} (`sfg {command}` reads the old "
                 "spelling until the next minor version)")


def given(**values: Any) -> dict[str, Any]:
    """The options given, by their settings' names (None = not given)."""
    return {k: v for k, v in values.items() if v is not None}


def protocol_of(protocol: str | None, mode: str | None, command: str) -> str | None:
    """``--protocol``, or the deprecated ``--mode`` of ``sfg swarm``/``sfg node``."""
    if mode is not None:
        if protocol is not None and protocol != mode:
            raise SfgError(f"--mode {mode} and --protocol {protocol} disagree; give --protocol "
                           "only")
        protocol = mode
    if protocol is not None and protocol not in ("lockstep", "async", "event"):
        raise SfgError(f"unknown --protocol {protocol!r}; choose lockstep or async (or event, "
                       "on the virtual clock)")
    if mode is not None:
        deprecated(f"--mode {mode}", f"--protocol {mode}", command)
    return protocol


def cuts_and_crashes(cut: list[str], crash: list[str]) -> tuple[list, list]:
    """The parsed ``--cut`` and ``--crash`` values (:class:`sfg.net.cuts.Cut`, ``Crash``)."""
    from sfg.net.cuts import Crash, Cut

    return [Cut.parse(c) for c in cut], [Crash.parse(c) for c in crash]


def faults_with(faults: str | None, cuts: list, crashes: list) -> str | None:
    """``--faults`` with the cuts and crashes in seconds added (``partition=``, ``crash=``);
    cuts or crashes in rounds are refused: the virtual clock counts seconds."""
    if not cuts and not crashes:
        return faults
    for x, flag, example in [*((c, "--cut", "0-3|4-7@1200s-3600s") for c in cuts),
                             *((c, "--crash", "3@1500s") for c in crashes)]:
        if x.unit != "seconds":
            raise SfgError(f"{flag} in rounds is for real nodes; the virtual clock counts "
                           f"seconds: write e.g. {flag} {example}")
    base = None if faults is None or faults.strip().lower() in ("", "none") else faults.strip()
    if base is not None and any(f"{k}=" in base for k in ("partition", "crash")) and \
            ((cuts and "partition=" in base) or (crashes and "crash=" in base)):
        raise SfgError("give network cuts and crashes either with --cut/--crash or inside "
                       "--faults (partition=, crash=), not both")
    parts = []
    if cuts:
        parts.append("partition=" + ";".join(c.text() for c in cuts))
    if crashes:
        parts.append("crash=" + ";".join(f"{c.node}@{c.at:g}" for c in crashes))
    return (base + "," if base else "faults:") + ",".join(parts)
