"""One run's configuration (docs/concepts/training.md#the-training-protocol), its content hash, and name checks against the registries.

:class:`RunConfig` is a frozen, strictly typed pydantic model; every field has the reference
default of docs/concepts/training.md#the-training-protocol. ``run_id(cfg)`` is the first 16 hex digits of the SHA-256 of the canonical
JSON of the fully resolved config (all fields, sorted keys), so the same experiment always
gets the same id and a results store can skip runs it already has (docs/concepts/training.md#pairing).

Component strings (``rule``, ``process``, ``graph``, ``dataset``, ``model``) are stripped and
put in canonical form (lower-case names, parameters in sorted order: ``"SFG-L:gamma=0.30"`` ->
``"sfg-l:gamma=0.3"``) when that form parses back to the same component, so spelling
variants share one run id.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from sfg.clock.settings import DEFAULTS as _CLOCK
from sfg.errors import SfgError
from sfg.sim.precision import Precision
from sfg.util.components import format_component, parse_component

Kind = Literal["train", "replay", "selftest"]
Backbone = Literal["full", "personal-head", "dfedavgm", "ditto"]
Anatomy = Literal["full", "cannot-communicate", "cannot-train-shares", "cannot-train-adopts"]

_FLOAT32_MAX = 3.4028234663852886e38
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class ConfigError(SfgError):
    """A bad value in one field of a run configuration; ``field`` names it (for line lookup)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _canonical_component(text: str, kind: str) -> str:
    comp = parse_component(text, kind=kind)
    params = comp.params
    if kind == "dataset" and {"min_train", "test_per_client"} & set(params):
        # a size spelled out at the dataset's default names the same data: the same run id
        # (the data package, with torch, is imported only for a dataset string that has one)
        try:
            from sfg.world.data import DATASETS
            from sfg.world.data.base import canonical_sizes
        except ImportError:  # no torch: a replay-only install never loads a dataset
            DATASETS = canonical_sizes = None
        if DATASETS is not None and comp.name in DATASETS:
            params = canonical_sizes(comp)
            if params != comp.params:
                return format_component(comp.name, params, comp.modifiers)
    return _canonical_component_text(comp, text, kind)


def _canonical_component_text(comp: Any, text: str, kind: str) -> str:
    canon = format_component(comp.name, comp.params, comp.modifiers)
    try:
        again = parse_component(canon, kind=kind)
    except SfgError:
        return text.strip()
    same = (again.name, again.params, again.modifiers) == (comp.name, comp.params, comp.modifiers)
    return canon if same else text.strip()


class RunConfig(BaseModel):
    """Everything that determines one run (docs/concepts/training.md#the-training-protocol defaults).

    ``kind``: ``"train"`` (simulation with models, ``sfg.sim``), ``"replay"`` (model-free
    trace replay, docs/concepts/replay.md#model-free-analyses) or ``"selftest"`` (a built-in, deterministic numpy diagnostic
    workload for checking executors, stores and clusters; see :mod:`sfg.experiments.runner`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Kind = "train"
    dataset: str = "digits"
    data_root: str | None = None
    alpha: float = 0.3
    model: str = "mlp"
    backbone: Backbone = "full"
    process: str = "bursty:u=0.8"
    rule: str = "dfedavg"
    graph: str = "knn:k=6"
    seed: int = 1
    n_clients: int = 100
    rounds: int = 300
    local_steps: int = 10
    batch_size: int = 32
    lr: float = 0.05
    weight_decay: float = 5e-4
    momentum: float = 0.0
    ditto_lambda: float = 0.2
    anatomy: Anatomy = "full"
    link_failure: float = 0.0
    eval_every: int = 10
    backend: str = "auto"
    device: str = "cpu"
    # arithmetic of the local training (sfg.sim.precision); left out of the run id at fp32
    precision: Precision = "fp32"
    horizon: int = 50
    partition: str = "dirichlet"
    diagnostics: str = ""
    backbone_from: str | None = None
    # forged-staleness attack (sfg.round.attacks), e.g. "forge:frac=0.1,claim=fresh"; None = none.
    # Left out of the dump (and so of the run id) when None: ids of runs without attacks are
    # those they had before the field existed.
    attack: str | None = None
    # the virtual clock (docs/concepts/clock.md#the-virtual-clock, sfg.clock.settings): "rounds" (the default, docs/concepts/round.md#one-round) or
    # "virtual". Its settings are left out of the dump (and the run id) with clock "rounds",
    # so run ids of round-based runs are those they had before the clock existed.
    # (defaults: the clock's own, sfg.clock.settings.DEFAULTS)
    clock: Literal["rounds", "virtual"] = _CLOCK["clock"]
    protocol: Literal["lockstep", "async", "event"] = _CLOCK["protocol"]
    round_seconds: float = _CLOCK["round_seconds"]
    period: float | None = _CLOCK["period"]
    jitter: float = _CLOCK["jitter"]
    window: float = _CLOCK["window"]
    compute: str = _CLOCK["compute"]
    uplink: str = _CLOCK["uplink"]
    latency: str = _CLOCK["latency"]
    loss: str = _CLOCK["loss"]
    message_bytes: float | None = _CLOCK["message_bytes"]
    eval_seconds: float | None = _CLOCK["eval_seconds"]
    target_accuracy: float = _CLOCK["target_accuracy"]
    faults: str = _CLOCK["faults"]
    faults_seed: int = _CLOCK["faults_seed"]
    on_return: str = _CLOCK["on_return"]
    # which nodes run it (docs/concepts/engines.md#one-run-every-engine, sfg.engines): "none"
    # (the simulators: sfg run, sfg grid), "virtual" (the node's own code on the virtual clock:
    # sfg swarm --clock virtual) or "real" (real nodes over gRPC in wall time: sfg swarm, sfg
    # node). (clock, protocol, nodes) name exactly one engine. Left out of the dump (and so of
    # the run id) at "none": ids of the simulators' runs are those they had before the field.
    nodes: Literal["none", "virtual", "real"] = "none"
    # whom each send goes to (docs/concepts/peers.md): "fixed" (the graph), "epidemic:s=S" or
    # "online:s=S,view=V,gossip=M"; the model-free replay runs it, the training engines refuse
    # anything but fixed (sfg.engines). Left out of the dump (and so of the run id) at "fixed".
    peers: str = "fixed"

    @model_validator(mode="after")
    def _clock(self) -> RunConfig:
        from sfg.clock.settings import DEFAULTS, make_settings

        if self.clock == "rounds":
            # on_return is also real nodes' (sfg swarm/node, async, in wall seconds): kept on
            # clock rounds, where sfg run refuses it (sfg.engines); real nodes take their
            # protocol and timer (period, jitter, window: in wall seconds) from here too
            own = ("clock", "on_return", *(REAL_TIMING if self.nodes == "real" else ()))
            changed = [k for k in DEFAULTS if k not in own and getattr(self, k) != DEFAULTS[k]]
            if changed:
                raise ValueError(f"{changed[0]} is a setting of the virtual clock, which the "
                                 "engines on clock rounds (rounds, real-lockstep, real-async) do "
                                 "not implement; add clock: virtual (--clock virtual), or nodes: real "
                                 "for real nodes' protocol and timer, or drop it")
            if self.nodes == "real":
                _check_real_timing(self)
            from sfg.clock.settings import parse_on_return

            try:
                parse_on_return(self.on_return)
            except SfgError as e:
                raise ValueError(str(e)) from None
            return self
        try:
            make_settings({k: getattr(self, k) for k in DEFAULTS})
        except SfgError as e:
            raise ValueError(str(e)) from None
        if not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy must lie in (0, 1], got {self.target_accuracy}")
        return self

    @model_validator(mode="after")
    def _small_graph(self) -> RunConfig:
        # a kNN graph's k is at most N − 1 (sfg.world.graphs.fit_graph): a small run runs,
        # with the k it uses stored in its settings
        from sfg.world.graphs import fit_graph

        object.__setattr__(self, "graph", fit_graph(self.graph, self.n_clients))
        return self

    @model_validator(mode="after")
    def _engine(self) -> RunConfig:
        # (clock, protocol, nodes) name exactly one engine (sfg.engines.engine_of)
        if self.nodes != "none" and self.kind != "train":
            raise ValueError(f"nodes {self.nodes!r}: nodes train; a {self.kind} run has none "
                             "— drop nodes there")
        if self.kind == "train":
            from sfg.engines import engine_of

            try:
                engine_of({k: getattr(self, k) for k in ("clock", "protocol", "nodes")})
            except SfgError as e:
                raise ValueError(str(e)) from None
        return self

    @model_validator(mode="after")
    def _robust(self) -> RunConfig:
        # the robust aggregators read models in sfg run's rounds (and the lockstep clock);
        # the model-free replay and the clock's async/event training have no such step
        from sfg.round.rules import robust_modifiers

        try:
            got = robust_modifiers(self.rule)
        except SfgError:
            return self  # the rule field reports its own error
        where = ("a model-free replay (kind: replay)" if self.kind == "replay" else
                 f"the virtual clock's {self.protocol} protocol"
                 if self.clock == "virtual" and self.protocol != "lockstep" else None)
        if got and where is not None:
            raise ValueError(f"rule {self.rule!r}: +{got[0]} reads model parameters (training "
                             f"only: sfg run in rounds or on the lockstep clock); {where} "
                             f"cannot run it — drop +{got[0]} there")
        return self

    @model_validator(mode="after")
    def _precision(self) -> RunConfig:
        # every training takes it (sfg.sim.run, sfg.clock.train); a replay trains nothing
        if self.precision != "fp32" and self.kind == "replay":
            raise ValueError(f"precision {self.precision!r} applies to training; a model-free "
                             "replay (kind: replay) trains nothing — drop precision there")
        return self

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, v: Any) -> Any:
        if _number(v):
            raise ValueError(f"nodes names which nodes run the run (none, virtual or real), not "
                             f"how many (got {v!r}); the number of clients is n_clients")
        return v

    @field_validator("attack")
    @classmethod
    def _attack(cls, v: str | None) -> str | None:
        if v is None:
            return None
        from sfg.round.attacks import parse_attack

        try:
            a = parse_attack(v)
        except SfgError as e:
            raise ValueError(str(e)) from None
        return None if a is None else _canonical_component(v, "attack")

    @model_serializer(mode="wrap")
    def _omit_no_attack(self, handler):
        data = handler(self)
        if isinstance(data, dict) and data.get("attack") is None:
            data.pop("attack", None)
        if isinstance(data, dict) and data.get("nodes") == "none":
            data.pop("nodes")
        if isinstance(data, dict) and data.get("peers") == "fixed":
            data.pop("peers")
        if isinstance(data, dict) and data.get("clock", "rounds") == "rounds":
            from sfg.clock.settings import DEFAULTS

            real = REAL_TIMING if data.get("nodes") == "real" else ()
            for k in DEFAULTS:
                if k not in real and (k != "on_return" or data.get(k) == DEFAULTS[k]):
                    data.pop(k, None)
        return data

    # ------------------------------------------------------------------ field checks
    @field_validator("rule", "process", "graph", "dataset", "model")
    @classmethod
    def _component(cls, v: str, info) -> str:
        if not v.strip():
            raise ValueError(f"{info.field_name} is empty; give a name such as "
                             f"{RunConfig.model_fields[info.field_name].default!r}")
        try:
            return _canonical_component(v, info.field_name)
        except SfgError as e:
            raise ValueError(str(e)) from None

    @field_validator("peers")
    @classmethod
    def _peers(cls, v: str) -> str:
        from sfg.world.peers import canonical_peers

        try:
            return canonical_peers(v)
        except SfgError as e:
            raise ValueError(str(e)) from None

    @field_validator("diagnostics")
    @classmethod
    def _diagnostics(cls, v: str) -> str:
        from sfg.sim.diagnostics import parse_diagnostics  # numpy only

        try:
            parse_diagnostics(v)
        except SfgError as e:
            raise ValueError(str(e)) from None
        return v.strip()

    @model_validator(mode="after")
    def _partition(self) -> RunConfig:
        # checked for training runs only: the data package imports torch, replay never reads it
        if self.kind == "train" and self.partition != "dirichlet":
            from sfg.world.data.partition import parse_partition

            try:
                parse_partition(self.partition)
            except SfgError as e:
                raise ValueError(f"partition: {e}") from None
        return self

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"seed must be >= 0 (got {v}); seeds 1-5 evaluate, 0 is for pilots")
        return v

    @field_validator("n_clients")
    @classmethod
    def _n(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"n_clients must be >= 2 (got {v}); a graph needs two clients")
        return v

    @field_validator("rounds", "batch_size", "eval_every", "horizon")
    @classmethod
    def _positive_int(cls, v: int, info) -> int:
        if v < 1:
            raise ValueError(f"{info.field_name} must be >= 1 (got {v})")
        return v

    @field_validator("local_steps")
    @classmethod
    def _steps(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"local_steps must be >= 0 (got {v}); 0 means gossip only")
        return v

    @field_validator("lr", "alpha")
    @classmethod
    def _positive(cls, v: float, info) -> float:
        if not v > 0 or v != v or v == float("inf"):
            what = {"lr": "learning rate lr", "alpha": "Dirichlet concentration alpha"}
            raise ValueError(f"{what[info.field_name]} must be a finite number > 0 (got {v})")
        if info.field_name == "lr" and v > _FLOAT32_MAX:
            raise ValueError(f"learning rate lr={v} does not fit the float32 models train in "
                             "(at most 3.4e38)")
        return v

    @field_validator("weight_decay", "ditto_lambda")
    @classmethod
    def _nonneg(cls, v: float, info) -> float:
        if not 0 <= v <= _FLOAT32_MAX:
            raise ValueError(f"{info.field_name} must be a finite number >= 0 that fits the "
                             f"float32 models train in (got {v})")
        return v

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"momentum must lie in [0, 1) (got {v}); DFedAvgM uses 0.9")
        return v

    @field_validator("link_failure")
    @classmethod
    def _link(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"link_failure must lie in [0, 1) (got {v}); the study used 0.3-0.6")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        v = v.strip().lower()
        if not _DEVICE.match(v):
            raise ValueError(f"device {v!r} is not one of auto, cpu, cuda, cuda:N, mps")
        return v

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("backend is empty; use 'auto' to let sfg pick the fastest")
        return v.strip().lower()

    @field_validator("data_root")
    @classmethod
    def _root(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("data_root is empty; omit it (null) or give a folder")
        return v

    @model_validator(mode="before")
    @classmethod
    def _defaults_that_fit(cls, data: Any) -> Any:
        """``eval_every`` not given: ``min(10, rounds)`` (a run shorter than the evaluation
        period evaluates at its end); a replay's ``horizon`` not given: ``min(50, rounds)``.
        At rounds >= 10 (>= 50) these are the old fixed defaults, so run ids do not change."""
        if not isinstance(data, dict):
            return data
        rounds = data.get("rounds", cls.model_fields["rounds"].default)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            return data  # left to the field's own check
        out = _resolve_nodes(dict(data))
        if out.get("eval_every") is None:
            out["eval_every"] = min(cls.model_fields["eval_every"].default, rounds)
        if out.get("kind", "train") == "replay" and out.get("horizon") is None:
            out["horizon"] = min(cls.model_fields["horizon"].default, rounds)
        return out

    @model_validator(mode="after")
    def _combination(self) -> RunConfig:
        if self.eval_every > self.rounds:
            raise ValueError(
                f"eval_every ({self.eval_every}) is larger than rounds ({self.rounds}), so no "
                "evaluation would happen before the end; set eval_every <= rounds"
            )
        if self.kind == "replay" and self.horizon > self.rounds:
            raise ValueError(
                f"replay horizon ({self.horizon}) is longer than rounds ({self.rounds}); "
                "set horizon <= rounds (the self-return H averages over t <= T - h)"
            )
        return self


# real nodes' settings on clock rounds: the protocol and the timer, in wall seconds
REAL_TIMING = ("protocol", "period", "jitter", "window")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _resolve_nodes(out: dict[str, Any]) -> dict[str, Any]:
    """The settings the nodes run with, resolved once and stored (docs/concepts/nodes.md):
    the node on the virtual clock's period P is also Δ (``period`` and ``round_seconds`` both
    P: either given, else ``round_seconds``); real async nodes' period not given is
    :data:`sfg.engines.REAL_PERIOD` wall seconds; the nodes' ``backend`` ``auto`` is ``loop``
    (one client at a time, as a node trains)."""
    from sfg.engines import REAL_PERIOD

    nodes = out.get("nodes", "none")
    if nodes == "virtual":
        p, d = out.get("period"), out.get("round_seconds")
        if _number(p) and _number(d) and float(p) != float(d):
            raise ValueError(f"period {p:g} and round_seconds {d:g} disagree: the node on the "
                             "virtual clock's period P is also Δ; give one")
        P = p if p is not None else d if d is not None else _CLOCK["round_seconds"]
        if _number(P):
            out["period"] = out["round_seconds"] = float(P)
    elif nodes == "real" and out.get("protocol") == "async" and out.get("period") is None:
        out["period"] = REAL_PERIOD
    if nodes in ("virtual", "real") and out.get("backend", "auto") == "auto":
        out["backend"] = "loop"
    return out


def _check_real_timing(cfg: RunConfig) -> None:
    """Real nodes' protocol and timer (wall seconds), as every node checks them."""
    if cfg.protocol not in ("lockstep", "async"):
        return  # no engine: _engine names the ones there are
    if cfg.period is not None and not (math.isfinite(cfg.period) and cfg.period > 0):
        raise ValueError(f"period must be > 0 wall seconds for real nodes, got {cfg.period}")
    from sfg.clock.settings import check_timer

    try:
        check_timer(cfg.jitter, cfg.window)
    except SfgError as e:
        raise ValueError(str(e)) from None


def config_error_message(err: ValidationError) -> tuple[str, str]:
    """(field, one-line message) for the first error of a pydantic ValidationError."""
    first = err.errors()[0]
    loc = first.get("loc") or ()
    field = str(loc[0]) if loc else ""
    msg = str(first.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        from sfg.util.components import did_you_mean

        return field, (f"unknown run setting {field!r}"
                       f"{did_you_mean(field, RunConfig.model_fields)}")
    got = first.get("input")
    if kind == "literal_error" and isinstance(got, str):
        from typing import get_args

        from sfg.util.components import did_you_mean

        choices = get_args(RunConfig.model_fields[field].annotation)
        hint = did_you_mean(got, choices)
        listed = f" one of {', '.join(choices)}" if hint.startswith("; did") else " valid"
        msg = f"{field} {got!r} is not{listed}{hint}"
    elif kind == "literal_error" or kind.endswith("_type") or kind.endswith("_parsing"):
        msg = f"{msg} (got {got!r} of type {type(got).__name__})"
    where = f"{field}: " if field and not msg.startswith(field) else ""
    return field, where + msg


def make_config(data: dict[str, Any] | None = None, **fields: Any) -> RunConfig:
    """Build a :class:`RunConfig`, turning validation errors into one-line :class:`SfgError`."""
    values = {**(data or {}), **fields}
    try:
        return RunConfig(**values)
    except ValidationError as err:
        field, msg = config_error_message(err)
        raise ConfigError(field, f"bad run config: {msg}") from None


def canonical_json(cfg: RunConfig) -> str:
    """The canonical JSON of the fully resolved config: every field, sorted keys, no spaces."""
    return json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


# settings added after stores were first written: left out of the run's identity at their
# defaults, so that earlier stores keep their run ids (a resumed grid redoes nothing)
_OMIT_AT_DEFAULT = {"partition": "dirichlet", "diagnostics": "", "backbone_from": None,
                    "faults": "none", "faults_seed": 0, "precision": "fp32",
                    "on_return": "none"}


def run_id(cfg: RunConfig) -> str:
    """SHA-256 (first 16 hex digits) of :func:`canonical_json` without the later settings that
    are at their defaults (:data:`_OMIT_AT_DEFAULT`): the run's identity."""
    data = cfg.model_dump(mode="json")
    for key, default in _OMIT_AT_DEFAULT.items():
        if data.get(key) == default:
            data.pop(key)
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()[:16]


# ---------------------------------------------------------------------- registry checks
def broken_module(what: str, e: BaseException) -> SfgError:
    """One line naming the module that failed to import (the innermost file of the traceback)
    and why: a broken module is an error, never a skipped check."""
    tb, where = e.__traceback__, None
    while tb is not None:
        where, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    if isinstance(e, SyntaxError) and e.filename:
        where = f"{e.filename}, line {e.lineno}"
    return SfgError(f"{what}: importing it failed in {where}: {type(e).__name__}: {e}")


def _module(name: str):
    """Import the registry ``name``; None when an optional dependency of it is not installed
    (the run then names the extra to install). Any other failure is an error naming the
    broken module."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any error while importing: a broken module
        from sfg.util.extras import missing_extra

        if isinstance(e, ImportError) and missing_extra(e, name) is not None:
            return None
        raise broken_module(f"{name} cannot be checked", e) from None


def _check_member(registry: Any, comp_text: str, field: str, kind: str) -> None:
    """Check a component string against a Registry (params too) or a plain mapping/set."""
    comp = parse_component(comp_text, kind=kind)
    try:
        if hasattr(registry, "check_params"):
            registry.check_params(comp.name, comp.params)
        elif comp.name not in registry:
            from sfg.util.components import did_you_mean

            raise SfgError(f"unknown {kind} {comp.name!r}{did_you_mean(comp.name, registry)}")
    except SfgError as e:
        raise ConfigError(field, str(e)) from None


def validate_names(cfg: RunConfig) -> None:
    """Check rule, process, dataset (and graph/model where registries exist) by their registries.

    Raises :class:`ConfigError` (an :class:`SfgError` carrying the offending ``field``).
    The registries: ``sfg.round.rules.parse_rule``, ``sfg.world.outages.make_process``,
    ``sfg.world.data.DATASETS``, ``sfg.world.graphs.GRAPHS``, ``sfg.world.models.MODELS``. Only
    an optional dependency that is not installed (torch for the models) skips its check (the
    run names the extra to install); a module that fails to import otherwise is an
    :class:`SfgError` naming it. Datasets and models are checked for ``train`` runs only
    (replay and selftest never load them). A ``replay`` run with a rule whose parsed object has
    ``reads_models`` true is rejected: model-free replay cannot evaluate it (docs/concepts/replay.md#model-free-analyses).
    """
    from sfg.util.extras import missing_extra

    for check in (_check_rule, _check_process, _check_dataset, _check_graph, _check_model):
        try:
            check(cfg)
        except ImportError as e:  # imported while checking: only a missing extra skips
            if missing_extra(e, check.__name__) is None:
                raise broken_module(f"the {check.__name__.removeprefix('_check_')} cannot be "
                                    "checked", e) from None


def _check_rule(cfg: RunConfig) -> None:
    rules = _module("sfg.round.rules")
    if rules is None:
        return
    try:
        rule = rules.parse_rule(cfg.rule)
    except SfgError as e:
        raise ConfigError("rule", str(e)) from None
    if cfg.kind == "replay" and bool(getattr(rule, "clip", False)):
        raise ConfigError("rule", f"rule {cfg.rule!r}: +clip reads model parameters, so it "
                                  "cannot run in a model-free replay; use kind: train")
    if cfg.kind == "replay" and bool(getattr(rule, "reads_models", False)):
        raise ConfigError("rule", f"rule {cfg.rule!r} reads model parameters, so it cannot "
                                  "run in a model-free replay; use kind: train")


def _check_process(cfg: RunConfig) -> None:
    outages = _module("sfg.world.outages")
    if outages is None:
        return
    try:
        outages.make_process(cfg.process)
    except SfgError as e:
        raise ConfigError("process", str(e)) from None


def _check_dataset(cfg: RunConfig) -> None:
    if cfg.kind != "train":
        return
    data = _module("sfg.world.data")
    if data is not None:
        _check_member(data.DATASETS, cfg.dataset, "dataset", "dataset")
        try:  # the size parameters' values (min_train, test_per_client)
            data.base.check_sizes(parse_component(cfg.dataset, kind="dataset"))
        except SfgError as e:
            raise ConfigError("dataset", str(e)) from None


def _check_graph(cfg: RunConfig) -> None:
    graphs = _module("sfg.world.graphs")
    if graphs is not None:
        _check_member(graphs.GRAPHS, cfg.graph, "graph", "graph")


def _check_model(cfg: RunConfig) -> None:
    if cfg.kind != "train":
        return
    models = _module("sfg.world.models")
    if models is not None:
        _check_member(models.MODELS, cfg.model, "model", "model")
