"""The front door: every job of sfg as one function, `import sfg` and call it.

```python
import sfg

trained = sfg.run(n_clients=8, rounds=5)        # train: the rounds, or the clock in one call
replayed = sfg.replay(n_clients=16, rounds=10)  # model-free replay of the staleness state
nodes = sfg.swarm(n_clients=8, rounds=5)        # the node's own code on the virtual clock
out = sfg.grid({"base": {"kind": "replay", "n_clients": 16, "rounds": 10},
                "rules": ["dfedavg", "sfg-cut"]}, store="results.sqlite")  # a grid, stored
print(trained.metrics["acc_mean"], replayed.metrics["premise"], len(out))
```

Every job takes the settings of one run as a `RunConfig` (positional), a mapping of its
fields, the path of a YAML or JSON file of them (as `sfg run --config` reads), keywords
with `RunConfig`'s names (`n_clients`, `rounds`, `rule`, `process`,
`seed`, …), or a mix (keywords override the config). A name that is not a setting of a
run is one `SfgError` line naming it. `eval_every` and a replay's `horizon` that were
left at their automatic values (`min(10, rounds)`, `min(50, rounds)`) follow a changed
`rounds`.

Every run returns one result type, `RunResult` (metrics, curves and the engine's own
parts; readable as a mapping; `.summary()` is the JSON the commands print), with the
run's settings and run id in `meta["config"]` and `meta["run_id"]`. A grid returns a
`GridResult`: its store and the runs' `RunResult`s.

Nothing heavy loads before a job runs: `import sfg` imports neither torch nor numba.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sfg.errors import SfgError

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    from sfg.experiments.config import RunConfig
    from sfg.experiments.executors import GridSummary
    from sfg.experiments.grid import Grid
    from sfg.result import Results, RunResult

Progress = Callable[[int, int], None]

# spellings of other interfaces (the commands' flags, older functions) -> the setting's name
_SPELLINGS = {"n": "n_clients", "N": "n_clients", "clients": "n_clients",
              "n_nodes": "n_clients", "T": "rounds", "seeds": "seed", "rules": "rule",
              "processes": "process", "mode": "protocol", "datasets": "dataset"}


# ----------------------------------------------------------------------------- settings
def _fields() -> tuple[str, ...]:
    from sfg.engines import FIELDS

    return ("kind", *FIELDS)


def _unknown(job: str, key: str) -> SfgError:
    from sfg.util.components import did_you_mean

    if key in _SPELLINGS:
        hint = f"; did you mean {_SPELLINGS[key]!r}?"
    else:
        hint = did_you_mean(key, _fields())
    return SfgError(f"sfg.{job}: unknown run setting {key!r}{hint}")


def _given(job: str, config: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings given to ``job``: ``config`` (a RunConfig, a mapping, a settings file's
    path or None), then the keywords; every name checked against RunConfig's."""
    from sfg.experiments.config import RunConfig

    where = ""
    if config is None:
        base: dict[str, Any] = {}
    elif isinstance(config, Mapping):
        base = dict(config)
    elif isinstance(config, (str, os.PathLike)):
        from sfg.util.safety import load_settings_file

        base, where = load_settings_file(config), f" (config file {config})"
    elif isinstance(config, RunConfig):
        base = config.model_dump()
        rounds = int(base["rounds"])
        if base.get("eval_every") == min(10, rounds):  # automatic: follows a new rounds
            base.pop("eval_every")
        if base.get("horizon") == (min(50, rounds) if base.get("kind") == "replay" else 50):
            base.pop("horizon")
    else:
        raise SfgError(f"sfg.{job}: give the run's settings as a RunConfig, a mapping, a "
                       f"YAML or JSON file's path or keywords, not a {type(config).__name__}")
    fields = _fields()
    for key in base:
        if key not in fields:
            raise SfgError(f"{_unknown(job, str(key))}{where}")
    for key in settings:
        if key not in fields:
            raise _unknown(job, str(key))
    return {**base, **settings}


def _make(job: str, config: Any, settings: Mapping[str, Any], **forced: Any) -> RunConfig:
    from sfg.experiments.config import make_config

    return make_config({**_given(job, config, settings), **forced})


@contextmanager
def _extras(job: str) -> Iterator[None]:
    """An optional dependency the job needs but that is not installed: one `SfgError` line
    naming the extra to install (any other import error keeps its traceback)."""
    try:
        yield
    except ImportError as e:
        from sfg.util.extras import missing_extra

        err = missing_extra(e, f"sfg.{job}")
        if err is None:
            raise
        raise err from None


# ----------------------------------------------------------------------------- one run
def _execute(cfg: RunConfig, progress: Progress | None) -> RunResult:
    """Run ``cfg`` on the engine its kind, clock and protocol name (the grid workers' one
    dispatch, :func:`sfg.experiments.runner.run_result`)."""
    from sfg.experiments.config import run_id, validate_names
    from sfg.experiments.runner import run_result

    validate_names(cfg)
    res = run_result(cfg, progress=progress)
    res.meta.update(config=cfg.model_dump(mode="json"), run_id=run_id(cfg))
    return res.as_arrays()


def run(config: RunConfig | Mapping[str, Any] | None = None, /, *,
        progress: Progress | None = None, **settings: Any) -> RunResult:
    """Run one configuration and return its `RunResult`.

    What runs is what the settings name, as in a grid: `kind="train"` (the default) trains
    on the rounds, or on the virtual clock with `clock="virtual"` and `protocol` lockstep,
    async or event — one call for all four; `kind="replay"` is `replay`; `kind="selftest"`
    the built-in numpy workload that checks stores and executors. `progress(done, total)`
    is called as the run goes.

    ```python
    import sfg

    res = sfg.run(n_clients=8, rounds=5, rule="sfg-cut", seed=2)
    print(res.metrics["acc_mean"], res.curves["round"])
    on_clock = sfg.run(n_clients=8, rounds=5, clock="virtual", protocol="event",
                       compute="const:value=30")
    print(on_clock.metrics["acc_mean"], on_clock.curves["hours"])
    ```
    """
    with _extras("run"):
        return _execute(_make("run", config, settings), progress)


def replay(config: RunConfig | Mapping[str, Any] | None = None, /, *,
           n_clients: int | None = None, rounds: int | None = None,
           rule: str | Sequence[str] | None = None, process: str | Sequence[str] | None = None,
           seed: int | Sequence[int] | None = None, progress: Progress | None = None,
           **settings: Any) -> RunResult | Results:
    """Replay without models and return the result: the staleness state and the rule's
    weights on the outage trace (no training; no torch needed) — ages, lags, the premise, the
    spreads, the self-return `H` over `horizon` rounds and the per-round mean age and lag.

    The names are `sfg.run`'s (`n_clients`, `rounds`, every `RunConfig` setting); on the
    rounds by default, on the virtual clock with `clock="virtual"` (its lockstep, async or
    event protocol); the settings' `kind` is `"replay"`; a model-reading rule is refused.
    `rule`, `process` and `seed` each take one value or a list: with one value each, one
    `RunResult`; with a list, a `Results` of one run per (process, rule, seed), paired by seed
    (the same world for every rule). Either has `.rows()`: one flat dict per run, for a table.

    ```python
    import sfg

    res = sfg.replay(n_clients=16, rounds=10, rule="sfg-cut", process="bursty:u=0.5")
    print(res.metrics["premise"], res.curves["mean_age"][:3])
    grid = sfg.replay(n_clients=16, rounds=10, rule=["dfedavg", "sfg-cut"], seed=[1, 2])
    print([(r["rule"], r["seed"], r["premise"]) for r in grid.rows()])
    ```
    """
    given = {k: v for k, v in {"n_clients": n_clients, "rounds": rounds}.items()
             if v is not None}
    axes = {k: v for k, v in {"process": process, "rule": rule, "seed": seed}.items()
            if v is not None}
    many = {k: list(v) for k, v in axes.items() if isinstance(v, (list, tuple))}
    with _extras("replay"):
        if not many:
            return _execute(_make("replay", config, {**settings, **given, **axes},
                                  kind="replay"), progress)
        for k, v in many.items():
            if not v:
                raise SfgError(f"sfg.replay: {k}=[] names no {k}; give one or more")
        import itertools

        one = {k: [v] for k, v in axes.items() if k not in many}
        keys = [k for k in ("process", "rule", "seed") if k in many or k in one]
        combos = list(itertools.product(*[many.get(k, one.get(k)) for k in keys]))
        cfgs = [_make("replay", config, {**settings, **given, **dict(zip(keys, c, strict=True))},
                      kind="replay") for c in combos]  # every setting checked before any run
        from sfg.result import Results

        return Results([_execute(cfg, progress) for cfg in cfgs])


def _old_replay(processes: Sequence[str], rules: Sequence[str], seeds: Sequence[int], *,
                n: int = 100, T: int = 300, **kw: Any) -> list[dict[str, Any]]:
    """``sfg.replay.replay(processes, rules, seeds, n=, T=)``, the old spelling (until 0.4):
    the rows of :func:`sfg.modelfree.replay`."""
    import warnings

    from sfg.modelfree import replay as rows

    warnings.warn("sfg.replay.replay(processes, rules, seeds, n=, T=) is now "
                  "sfg.replay(process=[...], rule=[...], seed=[...], n_clients=, rounds=)"
                  ".rows(); the old spelling works until 0.4", DeprecationWarning, stacklevel=2)
    return rows(processes, rules, seeds, n=n, T=T, **kw)


replay.replay = _old_replay  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- swarms
def swarm(config: RunConfig | Mapping[str, Any] | None = None, /, *,
          nodes: Literal["virtual", "real"] | None = None, deadline: float | None = None,
          procs: int = 2, workdir: str | os.PathLike | None = None,
          progress: Progress | None = None, **settings: Any) -> RunResult:
    """Run a swarm of networked nodes — every node the deployable node's own code — and
    return its `RunResult` (the nodes' states under `res["nodes"]`, the final models in
    `res.params`).

    `nodes="virtual"` (the default, or the settings' `nodes`): every node in this process on
    the virtual clock, the in-memory network and a batched trainer; no sockets and no
    sleeping, so the same settings give the same numbers. The settings are the clock's:
    `protocol` lockstep or async (the node has no event protocol), `period` (also the
    staleness unit Δ; default `round_seconds`), `jitter`, `window`, the world (`compute`,
    `uplink`, `latency`, `loss`, `message_bytes`) and `faults` (crashes, cuts, loss bursts).
    `deadline`: a lockstep round's wait in virtual seconds (default the run's `rounds · period`).

    `nodes="real"`: real nodes over gRPC on loopback, in `procs` worker processes, in wall
    time: `protocol`, `period` (default 0.2 s), `jitter` and `window` set the nodes' timing;
    `deadline` (default 300 s) a lockstep round's wait; `workdir` keeps their checkpoints and
    results (default a new temporary folder). A failed node raises `RuntimeError`.

    The run's settings, with `nodes` and the nodes' resolved timing and backend, are its
    `meta["config"]`; its `meta["run_id"]` is that of `sfg swarm --store` with the same
    settings (:func:`sfg.net.assemble.run_nodes_config` runs both).

    ```python
    import sfg

    res = sfg.swarm(n_clients=8, rounds=5, protocol="async", period=600.0,
                    compute="const:value=30", latency="const:value=2")
    print(res.metrics["acc_mean"], res.metrics["virtual_seconds"], len(res["nodes"]))
    ```
    """
    values = _given("swarm", config, settings)
    kind = nodes if nodes is not None else values.get("nodes") or "virtual"
    if kind == "none":
        kind = "virtual"
    if kind not in ("virtual", "real"):
        raise SfgError(f"sfg.swarm: nodes {kind!r} is not one of virtual (the node on the "
                       "virtual clock, in this process) or real (real nodes over gRPC on "
                       "loopback)")
    if kind == "virtual":
        if values.get("clock", "virtual") != "virtual":
            raise SfgError("sfg.swarm: the virtual nodes run on the virtual clock; drop "
                           f"clock={values['clock']!r}, or give nodes='real'")
        if values.get("protocol", "lockstep") not in ("lockstep", "async"):
            raise SfgError(f"sfg.swarm: the node runs protocol lockstep or async, not "
                           f"{values['protocol']!r}; the clock's event protocol trains with "
                           "sfg.run")
        values["clock"] = "virtual"
    with _extras("swarm"):
        from sfg.net.assemble import run_nodes_config

        cfg = _make("swarm", {**values, "nodes": kind}, {}, kind="train")
        return run_nodes_config(cfg, deadline=deadline, procs=int(procs) if kind == "real" else 1,
                                workdir=None if workdir is None else str(workdir),
                                progress=progress).as_arrays()


# ----------------------------------------------------------------------------- grids
def _grid_of(spec: Any) -> Grid:
    from sfg.experiments.grid import Grid, load_grid, parse_grid

    if isinstance(spec, Grid):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return load_grid(spec)
    if isinstance(spec, Mapping):
        import yaml

        return parse_grid(yaml.safe_dump(dict(spec), sort_keys=False), source="<grid spec>")
    if isinstance(spec, Sequence) and spec:
        configs = tuple(_make("grid", c, {}) for c in spec)
        return Grid(name="grid", configs=configs)
    raise SfgError("sfg.grid: give a grid file's path, a grid spec (a mapping as in a grid "
                   f"file: base, rules, processes, seeds, …) or a list of run configs, not "
                   f"{type(spec).__name__ if spec is not None else 'None'}")


def grid(spec: str | os.PathLike | Mapping[str, Any] | Sequence[Any], /, *,
         store: str | os.PathLike | None = None, workers: int = 1, executor: str = "local",
         address: str | None = None, retry_failed: bool = True,
         progress: bool = False) -> GridResult:
    """Run a grid into a results store and return its `GridResult`.

    `spec`: a grid file's path (YAML, as `sfg grid run` takes), the same as a mapping
    (`name`, `base`, `datasets`, `processes`, `rules`, `seeds`, `overrides`), an expanded
    `Grid`, or a list of run configs (`RunConfig`s or mappings). Every run is validated
    before any runs. `store`: the SQLite results store (default: a new one in a new
    temporary folder, its path in the result); runs already done there are not run again,
    so a grid resumes. `workers` local processes (0: one per CPU) or `executor="ray"` at
    `address`; `progress` shows a progress bar.

    ```python
    import sfg

    out = sfg.grid({"base": {"kind": "replay", "n_clients": 16, "rounds": 10},
                    "rules": ["dfedavg", "sfg-cut"], "seeds": [1, 2]},
                   store="results.sqlite")
    for row in out.rows():
        print(row["rule"], row["seed"], row["premise"])
    ```
    """
    from sfg.experiments.config import run_id
    from sfg.experiments.executors import run_grid
    from sfg.experiments.store import Store

    g = _grid_of(spec)
    if store is None:
        store = Path(tempfile.mkdtemp(prefix="sfg-grid-")) / "results.sqlite"
    path = Path(store)
    summary = run_grid(list(g.configs), path, executor=executor, workers=workers,
                       address=address, retry_failed=retry_failed, show_progress=progress,
                       label=g.name, grid=g.name)
    ids = [run_id(c) for c in g.configs]
    with Store(path, create=False, readonly=True) as s:
        done = {r["run_id"]: r for r in s.records("done")}
    results: list[RunResult | None] = []
    for cfg, rid in zip(g.configs, ids, strict=True):
        rec = done.get(rid)
        if rec is None:
            results.append(None)
            continue
        from sfg.result import RunResult

        res = RunResult.from_summary(rec)
        res.meta.update(config=cfg.model_dump(mode="json"), run_id=rid)
        results.append(res)
    return GridResult(name=g.name, store=path, configs=list(g.configs), run_ids=ids,
                      results=results, summary=summary, failures=list(summary.failures))


@dataclass
class GridResult:
    """What `grid` did: the grid's `name`, the `store` it wrote (a path), its `configs`
    and `run_ids` in the grid's order, each run's `RunResult` in `results` (read back from
    the store: metrics, curves, diagnostics, with `meta["config"]` and `meta["run_id"]`;
    None for a run that failed or is not done) and the executor's `summary` (counts,
    seconds, `failures` as `(run_id, error)`). Iterating gives the results."""

    name: str
    store: Path
    configs: list[RunConfig]
    run_ids: list[str]
    results: list[RunResult | None]
    summary: GridSummary
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every run is done."""
        return all(r is not None for r in self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[RunResult | None]:
        return iter(self.results)

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per done run: `run_id`, `kind`, `rule`, `process`, `seed`,
        `n_clients`, `rounds`, then its metrics (a table's rows, e.g. for pandas)."""
        from sfg.result import ROW_SETTINGS

        out = []
        for cfg, rid, res in zip(self.configs, self.run_ids, self.results, strict=True):
            if res is not None:
                out.append({"run_id": rid, **{k: getattr(cfg, k) for k in ROW_SETTINGS},
                            **res.metrics})
        return out



def config(config: RunConfig | Mapping[str, Any] | None = None, /,
           **settings: Any) -> RunConfig:
    """The validated settings of one run: a `RunConfig` from a config, a mapping and/or
    keywords with `RunConfig`'s names (keywords win). A bad name or value is one
    `SfgError` line naming it.

    ```python
    import sfg

    c = sfg.config(n_clients=8, rounds=5, rule="sfg-cut")
    print(c.rule, c.eval_every)          # sfg-cut 5
    ```
    """
    return _make("config", config, settings)


# ----------------------------------------------------------------------------- rules
def parse_rule(text: str):
    """The `Rule` a rule string names (`"sfg-cut:L=2"`, `"sfg-l:gamma=0.3+ipw"`,
    `"aoi+ipw"`), parameters checked against their ranges; an unknown name or parameter is
    one `SfgError` line with a did-you-mean. `rule.weights_one(...)` is its one-receiver form.

    ```python
    import sfg

    rule = sfg.parse_rule("sfg-cut:L=2")
    print(rule.weights_one(ages=[3, 0, 1], lags=[3.0, 0.5, 1.2], counts=[4, 9, 8], t=10))
    ```
    """
    from sfg.round.rules import parse_rule as parse

    return parse(text)


def rules(tag: str | None = None) -> dict[str, dict[str, Any]]:
    """Every registered aggregation rule (those of your own modules too, once imported):
    `{name: {"params": {name: default}, "tags": [...], "doc": "..."}}` in the order
    `sfg rules` lists them; `tag` keeps the rules with that tag (`"sfg"`, `"model"`, …).

    ```python
    import sfg

    print(list(sfg.rules()))
    print(sfg.rules()["sfg-cut"]["params"])
    ```
    """
    from sfg.round.rules import RULES, rule_names

    out = {}
    for name in rule_names(tag):
        e = RULES.entry(name)
        out[name] = {"params": dict(e.params), "tags": sorted(e.tags), "doc": e.doc}
    return out


__all__ = ["GridResult", "config", "grid", "parse_rule", "replay", "rules", "run", "swarm"]
