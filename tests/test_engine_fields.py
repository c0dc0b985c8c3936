"""Honour or refuse, never ignore: every engine, every setting of a run (sfg.engines).

For every engine and every field of RunConfig (but ``kind``) the engine runs once with the
field at a non-default value (:data:`VALUES`) and once at the defaults (cached per engine), on
a tiny run (8 clients, 3 rounds, digits, mlp), and the field's declared class is checked:

* affects: the final models differ, or an accuracy (``acc_*``), or a metric or output that
  ``sfg.engines.METRIC_ONLY`` declares for the field (any other metric moving is no
  evidence: a figure per device-hour moves with the horizon);
* invariant: the final models are bit-equal and every metric and output is equal, AND the
  engine read the setting: the settings every engine builds its run from
  (``sfg.sim.context.build_run``) carry the value, and the engine looked it up there (a
  setting declared invariant that the engine never reads is an ignored one);
* refused: the run raises one SfgError line (checked before SfgError joins lines) naming the
  engine and the field, before any data is read (the data loader fails if reached).

A field added to RunConfig without a class in sfg.engines, or without a value here, fails.
``clock``, ``protocol`` and ``nodes`` select the engine. The nodes run through the one swarm
assembly every entry point calls (:func:`sfg.net.assemble.run_nodes_config`); real nodes over
gRPC on loopback in this process. Real asynchronous nodes run in wall time (their numbers
differ run to run): their refusals are run, their invariant settings run and checked to be
read, their affects settings checked to reach the stored settings.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from running import bounded

from sfg import engines
from sfg.engines import (
    AFFECTS,
    DECLARED,
    ENGINES,
    INVARIANT,
    METRIC_ONLY,
    REFUSED,
    SELECTORS,
    WALL_TIME,
)
from sfg.errors import SfgError

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "engines.md"

# the tiny run every engine runs (its values are the "defaults" of the checks below)
BASE: dict[str, Any] = dict(n_clients=8, rounds=3, local_steps=2, batch_size=8,
                            graph="knn:k=3", process="iid:u=0.5")
# per engine: what it needs to run at all (the event protocol: devices that take time)
ENGINE_BASE: dict[str, dict[str, Any]] = {"clock-event": {"compute": "const:value=100"}}
REAL = ("real-lockstep", "real-async")
BACKBONE = "<a saved mlp state_dict>"  # replaced by the file the backbone fixture writes

# a valid value other than the default (other than BASE's where BASE sets the field)
VALUES: dict[str, Any] = {
    "dataset": "digits:test_fraction=0.2",
    "data_root": "engine-fields-data",  # digits is embedded: the same data from any folder
    "alpha": 5.0,
    "model": "mlp:hidden=32",
    "backbone": "ditto",
    "process": "bursty:u=0.5",
    "rule": "sfg-cut",
    "graph": "ring",
    "seed": 2,
    "n_clients": 6,
    "rounds": 2,
    "local_steps": 1,
    "batch_size": 4,
    "lr": 0.1,
    "weight_decay": 0.01,
    "momentum": 0.5,
    "ditto_lambda": 5.0,  # a pull strong enough to move an accuracy (the clock's async run reports no personal models)
    "anatomy": "cannot-communicate",
    "link_failure": 0.5,
    "eval_every": 1,
    "backend": "loop",
    "device": "auto",
    "precision": "bf16",
    "horizon": 20,
    "partition": "classes",
    "diagnostics": "raw",
    "backbone_from": BACKBONE,
    "attack": "forge:frac=0.3,claim=fresh,model=constant",
    "round_seconds": 300.0,
    "period": 300.0,
    "jitter": 0.5,
    "window": 0.5,  # a message one period old no longer counts
    "compute": "const:value=400",  # 2 steps: 800 s, longer than a 600 s lockstep round
    "uplink": "const:value=100",  # bytes/s: a 36 kB model takes 6 minutes to send
    "latency": "const:value=700",
    "loss": "const:value=0.5",
    "message_bytes": 1e6,
    "eval_seconds": 900.0,
    "target_accuracy": 0.05,
    "faults": "faults:loss=0.5",
    "faults_seed": 3,
    "on_return": "pull:timeout=60",
    "peers": "epidemic:s=2",
}
# per engine: where the value above is not one the engine can run
ENGINE_VALUES: dict[tuple[str, str], Any] = {
    # the nodes train on the cpu ("auto" picks it); another device is refused
    **{(e, "device"): "cuda" for e in ("node-lockstep", "node-async", *REAL)},
    # real nodes train with the loop backend (what auto resolves to): another is refused
    **{(e, "backend"): "batched" for e in REAL},
    # real async nodes' timer in wall seconds (a period of 300 s would take an hour)
    ("real-async", "period"): 0.1,
    ("real-async", "on_return"): "pull:timeout=0.05",
    # the async timer needs K steps shorter than the period
    # (250 s a step: a local round of 500 s, plus the context's latency, is late for the next
    # wake at 600 s)
    **{(e, "compute"): "const:value=250" for e in ("clock-async", "node-async")},
    ("clock-event", "compute"): "const:value=250",
    # the node's lockstep waits for every message: a late one is an error
    ("node-lockstep", "latency"): "const:value=100",
}
# the other settings a field acts through (applied to both runs unless the field is refused)
CONTEXT: dict[str, dict[str, Any]] = {
    "ditto_lambda": {"backbone": "ditto"},
    "attack": {"rule": "sfg-cut"},
    "message_bytes": {"uplink": "const:value=1000"},
    "faults_seed": {"faults": "faults:loss=0.5"},
    # a returning device's pull acts through the replies' time: latency makes the wait real
    "on_return": {"latency": "const:value=20"},
}
# the models' tolerance for the settings that compute the same float terms (engines.FLOAT_TERMS)
FLOAT_ROUNDING = 1e-5
# per engine: the context where it differs from CONTEXT (the node's lockstep rounds follow the
# messages: the period matters through the devices' time, stragglers past the round)
ENGINE_CONTEXT: dict[tuple[str, str], dict[str, Any]] = {
    ("node-lockstep", "round_seconds"): {"compute": "const:value=200"},
    ("node-lockstep", "period"): {"compute": "const:value=200"},
    ("clock-lockstep", "round_seconds"): {"compute": "const:value=200"},
    # async: time scaled alone is the same run; with devices that take time, the period
    # decides which messages are in time for a wake
    **{(e, f): {"compute": "const:value=100", "latency": "const:value=150"}
       for e in ("clock-async", "node-async") for f in ("round_seconds", "period")},
    **{(e, "compute"): {"latency": "const:value=150"} for e in ("clock-async", "node-async")},
    ("real-async", "on_return"): {},  # real nodes have no latency setting: wall time's
}
# not compared: wall-clock time
TIMING = re.compile(r"^(wall_seconds|seconds)$|_ms_")


# ----------------------------------------------------------------------------- the engines
def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _outcome(res):
    """(params, metrics, outputs) of an engine's result (a mapping or a result object): the
    final models (ditto's personal models beside them), the metrics, the named outputs."""
    get = res.get if isinstance(res, dict) else (lambda k: getattr(res, k, None))
    params = _numpy(get("params"))
    if get("personal") is not None:
        params = np.concatenate([params, _numpy(get("personal"))], axis=1)
    return params, get("metrics"), {k: get(k) for k in ("diagnostics", "faults")}


def _simulate(cfg):
    from sfg.sim.run import simulate

    return _outcome(simulate(cfg))


def _events(cfg):
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    return _outcome(simulate_events(resolve_config(cfg)))


def _nodes(cfg):
    """As ``sfg swarm`` and ``sfg.swarm`` run it: the one swarm assembly
    (:func:`sfg.net.assemble.run_nodes_config`); real nodes over gRPC on 127.0.0.1 in this
    process (procs 0)."""
    from sfg.experiments.config import make_config
    from sfg.net.assemble import run_nodes_config

    rc = make_config(cfg, kind="train")
    res = bounded(lambda: run_nodes_config(rc, procs=0 if rc.nodes == "real" else 1), 150.0)
    return _outcome(res)


RUNNERS = {"rounds": _simulate, "clock-lockstep": _simulate, "clock-async": _events,
           "clock-event": _events, "node-lockstep": _nodes, "node-async": _nodes,
           "real-lockstep": _nodes, "real-async": _nodes}


# ----------------------------------------------------------------------------- what engines read
class _Settings(dict):
    """A run's settings that note which keys the engine looks up (``refuse``'s own look-ups
    aside): every engine builds its run from them (``sfg.sim.context.build_run``)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()
        self.quiet = False

    def __getitem__(self, key):
        if not self.quiet:
            self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if not self.quiet:
            self.read.add(key)
        return super().get(key, default)


_BUILT: list[tuple[str, _Settings]] = []  # (engine, settings) of each run built


@pytest.fixture(scope="module", autouse=True)
def _instrumented():
    """Where the engines read their settings (build_run), with refuse's look-ups left out,
    and SfgError's message as written (before it joins lines)."""
    import sfg.net.world
    import sfg.sim.context
    import sfg.sim.run

    build, refuse = sfg.sim.context.build_run, engines.refuse
    init = SfgError.__init__

    def noted_build_run(c, *, engine, **kw):
        c = c if isinstance(c, _Settings) else _Settings(c)
        _BUILT.append((engine, c))
        return build(c, engine=engine, **kw)

    def quiet_refuse(engine, cfg):
        was = getattr(cfg, "quiet", None)
        if was is not None:
            cfg.quiet = True
        try:
            return refuse(engine, cfg)
        finally:
            if was is not None:
                cfg.quiet = was

    def noted_init(self, message):
        self.written = str(message)
        init(self, message)

    with pytest.MonkeyPatch.context() as mp:
        for mod in (sfg.sim.context, sfg.sim.run, sfg.net.world):
            mp.setattr(mod, "build_run", noted_build_run)
        mp.setattr(engines, "refuse", quiet_refuse)
        mp.setattr(SfgError, "__init__", noted_init)
        yield


def _no_data(*args, **kwargs):
    raise AssertionError("the data was read before the refusal")


# ----------------------------------------------------------------------------- runs, cached
_RUNS: dict[tuple, Any] = {}
_SEEN: dict[tuple, list[tuple[str, dict, set[str]]]] = {}


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> str:
    """A saved mlp body for ``backbone_from`` (every parameter set, none the initial ones)."""
    import torch

    from sfg.world.data import load_federated
    from sfg.world.models import make_model

    data = load_federated("digits", n_clients=2, seed=1)
    model = make_model("mlp", input_shape=tuple(data.input_shape), num_classes=data.num_classes)
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.copy_(torch.linspace(-0.1, 0.1, p.numel()).reshape(p.shape) * (k + 1))
    path = tmp_path_factory.mktemp("backbone") / "mlp.pt"
    torch.save(model.state_dict(), path)
    return str(path)


def _config(engine: str, over: dict[str, Any]) -> dict[str, Any]:
    return {**BASE, **ENGINE_BASE.get(engine, {}), **SELECTORS[engine], **over}


def _key(engine: str, over: dict[str, Any]) -> tuple:
    cfg = _config(engine, over)
    return (RUNNERS[engine], tuple(sorted((k, repr(v)) for k, v in cfg.items())))


def _run(engine: str, over: dict[str, Any]):
    """(params, metrics, outputs) of ``engine`` on BASE with ``over``; or the SfgError it
    raised. Runs with the same settings are run once."""
    key = _key(engine, over)
    if key not in _RUNS:
        del _BUILT[:]
        try:
            _RUNS[key] = RUNNERS[engine](_config(engine, over))
        except SfgError as e:
            _RUNS[key] = e
        _SEEN[key] = [(e, dict(c), set(c.read)) for e, c in _BUILT]
    return _RUNS[key]


def _seen(engine: str, over: dict[str, Any]) -> list[tuple[str, dict, set[str]]]:
    """(engine, settings, keys read) of every run the engine built for ``over``."""
    _run(engine, over)
    return _SEEN[_key(engine, over)]


def _value(engine: str, field: str, backbone: str) -> Any:
    v = ENGINE_VALUES.get((engine, field), VALUES[field])
    return backbone if v is BACKBONE else v


def _same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    return a == b


def _differences(a, b, atol: float = 0.0) -> list[str]:
    """What differs between two runs: 'params' (beyond ``atol``), metric names, output
    names."""
    pa, ma, oa = a
    pb, mb, ob = b
    out = []
    if pa.shape != pb.shape or pa.dtype != pb.dtype or not (
            np.array_equal(pa, pb, equal_nan=True) if atol == 0
            else np.allclose(pa, pb, rtol=0, atol=atol)):
        out.append("params")
    for k in sorted(set(ma) | set(mb)):
        if TIMING.search(k):
            continue
        if k not in ma or k not in mb or not _same_value(ma[k], mb[k]):
            out.append(f"metric {k}")
    for k in sorted(set(oa) | set(ob)):
        if not _same_value(oa.get(k), ob.get(k)):
            out.append(f"output {k}")
    return out


def _names(message: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", message) is not None


# ----------------------------------------------------------------------------- the declaration
def test_defaults_are_the_schemas():
    from sfg.experiments.config import RunConfig

    fields = {k: f.default for k, f in RunConfig.model_fields.items() if k != "kind"}
    assert engines.DEFAULTS == fields
    assert list(engines.FIELDS) == list(fields)


def test_every_engine_declares_every_field_once_and_every_field_has_a_value():
    from sfg.experiments.config import RunConfig

    fields = [k for k in RunConfig.model_fields if k != "kind"]
    assert set(ENGINES) == set(DECLARED) == set(SELECTORS) == set(RUNNERS)
    for e in ENGINES:
        missing = [f for f in fields if f not in DECLARED[e]]
        assert not missing, f"engine {e} declares no class for {missing}"
        assert set(DECLARED[e]) == set(fields), e
        assert set(DECLARED[e].values()) <= {AFFECTS, INVARIANT, REFUSED}, e
    assert set(engines.NOTES) <= set(fields)
    no_value = [f for f in fields if f not in VALUES and f not in SELECTORS["rounds"]]
    assert not no_value, f"no non-default value to check {no_value} with (VALUES)"


def test_engines_module_imports_nothing_heavy():
    code = ("import sys, sfg.engines; bad = [m for m in ('torch', 'numba', 'pydantic', "
            "'numpy') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_refuse_names_the_engine_and_the_setting_and_what_to_do():
    for e in ENGINES:
        engines.refuse(e, _config(e, {}))  # the defaults pass
        for f, cls in DECLARED[e].items():
            if f in SELECTORS[e]:
                continue
            cfg = _config(e, {f: _value(e, f, "backbone.pt")})
            if cls != REFUSED:
                engines.refuse(e, cfg)
                continue
            with pytest.raises(SfgError) as err:
                engines.refuse(e, cfg)
            msg = str(err.value)
            assert "\n" not in msg and _names(msg, e) and _names(msg, f), msg
            assert "drop it" in msg, msg


def test_refuse_checks_the_engines_own_clock_and_protocol():
    for e in ENGINES:
        for other in ENGINES:
            if SELECTORS[other] != SELECTORS[e]:
                with pytest.raises(SfgError, match=re.escape(e)):
                    engines.refuse(e, {**SELECTORS[other]})
    with pytest.raises(SfgError, match="unknown engine"):
        engines.refuse("no-such-engine", {})


def test_engine_of_finds_every_engine_from_its_settings():
    for e in ENGINES:
        assert engines.engine_of(SELECTORS[e]) == e
    with pytest.raises(SfgError, match="no node on the virtual clock engine runs"):
        engines.engine_of({"clock": "virtual", "protocol": "event"}, nodes="virtual")


def test_reference_page_is_the_generated_table():
    assert PAGE.read_text(encoding="utf-8") == engines.markdown(), \
        "run: python -m sfg.engines docs/reference/engines.md"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "reference/engines.md" in nav


# ----------------------------------------------------------------------------- the runs
def _checked(engine: str) -> list[str]:
    return [f for f in DECLARED[engine] if f not in SELECTORS[engine]]


CASES = [pytest.param(e, f, id=f"{e}-{f}") for e in ENGINES for f in _checked(e)]


def _evidence(engine: str, field: str, diff: list[str]) -> list[str]:
    """What shows that a setting acts: the final models, an accuracy, or a metric or output
    declared for it (engines.METRIC_ONLY)."""
    own = set(METRIC_ONLY.get((engine, field), ()))
    return [d for d in diff if d == "params" or d.startswith("metric acc_") or d in own]


def _check(engine: str, field: str, backbone: str) -> None:
    """The declared class of ``field`` on ``engine``, checked by running it."""
    from sfg.experiments.config import make_config

    cls = DECLARED[engine][field]
    value = _value(engine, field, backbone)
    context = ENGINE_CONTEXT.get((engine, field), CONTEXT.get(field, {})) \
        if cls != REFUSED else {}
    if cls == REFUSED:  # before any data is read: the loader fails if reached
        import sfg.world.data

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sfg.world.data, "load_federated", _no_data)
            try:
                RUNNERS[engine](_config(engine, {field: value}))
            except SfgError as e:
                got = e
            else:
                pytest.fail(f"engine {engine} runs {field}={value!r} instead of refusing it")
        msg = getattr(got, "written", str(got))  # as written, before SfgError joins lines
        assert "\n" not in msg, msg
        assert _names(msg, engine) and _names(msg, field), \
            f"the refusal does not name the engine {engine} and the setting {field}: {msg}"
        return
    if engine in WALL_TIME and cls == AFFECTS:  # wall time: the value reaches the settings
        stored = make_config(_config(engine, {**context, field: value}), kind="train")
        ref_cfg = make_config(_config(engine, context), kind="train")
        assert getattr(stored, field) != getattr(ref_cfg, field), \
            f"engine {engine}: {field}={value!r} does not reach the run's settings"
        return
    got = _run(engine, {**context, field: value})
    ref = _run(engine, context)
    for run in (ref, got):
        if isinstance(run, SfgError):
            pytest.fail(f"engine {engine}: {field}={value!r} is declared {cls}, but the run "
                        f"raised: {run}")
    if cls == INVARIANT:  # the setting reaches the engine, and the engine reads it
        seen = [s for s in _seen(engine, {**context, field: value}) if s[0] == engine]
        assert seen, f"engine {engine} built no run"
        for _, c, read in seen:
            assert c.get(field) == value, \
                f"engine {engine}: {field}={value!r} never reaches it (got {c.get(field)!r})"
            assert field in read or field in engines.UNREAD, \
                f"engine {engine} never reads {field}, declared invariant (an ignored setting)"
    if engine in WALL_TIME:
        return  # the numbers: wall time's
    # backend and device: the same float terms, summed in another order (float rounding)
    diff = _differences(ref, got, atol=FLOAT_ROUNDING if field in engines.FLOAT_TERMS else 0.0)
    if cls == AFFECTS:
        assert _evidence(engine, field, diff), \
            f"engine {engine} ignores {field}={value!r}: the same models and accuracies" + \
            (f" (only {diff} differ: declare them in engines.METRIC_ONLY if that is its "
             "effect)" if diff else "")
    else:
        assert not diff, f"engine {engine}: {field}={value!r} is declared invariant but " \
                         f"changes {diff}"


@pytest.mark.crosspath  # runs compared: under the other arithmetic too (make test-arith)
@pytest.mark.parametrize("engine, field", CASES)
def test_engine_honours_or_refuses_the_setting(engine, field, backbone):
    _check(engine, field, backbone)


@pytest.mark.parametrize("engine, field", [("real-lockstep", "window"),
                                           ("clock-event", "jitter"),
                                           ("node-lockstep", "window")])
def test_a_refused_setting_declared_invariant_fails_a_run_check(engine, field, backbone,
                                                                 monkeypatch):
    """An engine that ignores a setting cannot pass as invariant: moving a refused field to
    invariant in sfg.engines fails its run check (not only the docs page)."""
    assert DECLARED[engine][field] == REFUSED
    monkeypatch.setitem(DECLARED[engine], field, INVARIANT)
    with pytest.raises((AssertionError, pytest.fail.Exception),
                       match="never reads|declared invariant"):
        _check(engine, field, backbone)


SELECTOR_CASES = [pytest.param(e, f, id=f"{e}-{f}") for e in ENGINES for f in SELECTORS[e]
                  if f != "nodes" and e not in WALL_TIME]


@pytest.mark.crosspath
@pytest.mark.parametrize("engine, field", SELECTOR_CASES)
def test_another_clock_or_protocol_is_another_engine_that_runs_differently(engine, field):
    """``clock`` and ``protocol`` select the engine (declared affects): the nearest engine
    with another value of the field (same kind of engine first) runs its defaults
    differently."""
    assert DECLARED[engine][field] == AFFECTS
    own = SELECTORS[engine]
    kind = engines._nodes(engine)
    others = [e for e in ENGINES if SELECTORS[e][field] != own[field]]
    other = min(others, key=lambda e: (engines._nodes(e) != kind,
                                       sum(SELECTORS[e][k] != own[k] for k in own)))
    a, b = _run(engine, {}), _run(other, {})
    for e, run in ((engine, a), (other, b)):
        assert not isinstance(run, SfgError), f"engine {e}'s default run raised: {run}"
    assert _differences(a, b), f"engines {engine} and {other} run the same"


def test_nodes_select_the_engine_and_the_run_id():
    """``nodes`` selects the engine (the node equals the simulators' numbers where it runs the
    same protocol, so its mark is the identity): each engine's settings have their own run
    id, and the simulators' ids leave nodes out."""
    from sfg.experiments.config import make_config, run_id

    ids = {e: run_id(make_config(_config(e, {}), kind="train")) for e in ENGINES}
    assert len(set(ids.values())) == len(ENGINES), ids
    plain = make_config(_config("rounds", {}), kind="train")
    assert "nodes" not in plain.model_dump() and plain.nodes == "none"


@pytest.mark.parametrize("over", [{"clock": "virtual"},
                                  {"clock": "virtual", "compute": "const:value=400"}],
                         ids=["clock", "clock-compute"])
def test_real_nodes_refuse_the_virtual_clock(over):
    """Real nodes take their own time: a run's settings on the virtual clock (a config file's
    ``clock: virtual`` and its world) are refused, naming the engine, never run in wall
    time as if they were not there."""
    got = _run("real-lockstep", over)
    assert isinstance(got, SfgError), "real nodes run settings of the virtual clock"
    assert _names(str(got), "real-lockstep") and _names(str(got), "clock"), str(got)


# ----------------------------------------------------------------------------- the command line
# the node's settings on the virtual clock that a config file gives `sfg swarm --clock virtual`
CLI_VALUES = {f: VALUES[f] for f in ("round_seconds", "period", "jitter", "window", "faults")}
_CLI: dict[str, Any] = {}


def _swarm_command(cfg: dict[str, Any], tmp_path: Path, capsys) -> tuple[int, Any, str]:
    """``sfg swarm --clock virtual --mode async --config FILE --json``: exit status, the
    JSON's metrics (no wall time) and node accuracies, stderr."""
    import json

    from sfg.cli.main import main

    key = repr(sorted(cfg.items()))
    if key not in _CLI:
        path = tmp_path / "run.yaml"
        path.write_text(json.dumps(cfg), encoding="utf-8")
        code = main(["swarm", "--clock", "virtual", "--mode", "async", "--config", str(path),
                     "--json"])
        cap = capsys.readouterr()
        out = None
        if code == 0:
            res = json.loads(cap.out)
            out = ({k: v for k, v in res["metrics"].items() if not TIMING.search(k)},
                   [n["acc"] for n in res["nodes"]], res.get("faults"))
        _CLI[key] = (code, out, cap.err)
    return _CLI[key]


@pytest.mark.parametrize("field", list(CLI_VALUES))
def test_node_command_honours_or_refuses_a_config_files_clock_settings(field, tmp_path, capsys):
    """The node on the virtual clock takes these settings (declared affects); given in a
    config file, ``sfg swarm --clock virtual`` runs them or refuses them in one line — it
    never runs its own flags' defaults in their place."""
    assert DECLARED["node-async"][field] == AFFECTS
    base = {**BASE, "clock": "virtual", "protocol": "async"}
    code0, ref, err0 = _swarm_command(base, tmp_path, capsys)
    assert code0 == 0, err0
    code, got, err = _swarm_command({**base, field: CLI_VALUES[field]}, tmp_path, capsys)
    expected = 2 if DECLARED["node-async"][field] == REFUSED else 0  # affects, invariant: 0
    assert code == expected, err
    if code == 2:
        assert _names(err, field) and _names(err, "node-async"), err
        return
    assert got != ref, f"sfg swarm --clock virtual ignores {field}={CLI_VALUES[field]!r} " \
                       "from its config file"
