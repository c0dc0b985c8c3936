"""Grid files (YAML): a base config and axes expanded into run configs, validated up front.

::

    name: demo
    base: {kind: train, dataset: digits, model: mlp, n_clients: 100, rounds: 100}
    datasets: [digits]                       # optional axes, each a non-empty list
    processes: ["none", "bursty:u=0.8"]
    rules: [dfedavg, "aoi+ipw", sfg, sfg-l]
    seeds: [1, 2, 3]
    overrides: [{}, {local_steps: 10}]       # optional: each dict expands the grid once
    family: {comparisons: 24, alpha: 0.05}   # optional: the comparisons it will test

``family`` declares, before anything runs, how many paired comparisons the grid's results
will be tested in (m, corrected together by Holm) at which level (alpha, default 0.05):
:func:`check_family` (``sfg grid check``, and ``sfg grid run`` before running) refuses a grid
whose seeds cannot resolve them — with U seeds the exact sign-flip test's smallest p is
2^(1 − U), which must lie below alpha / m (docs/concepts/statistics.md#paired-statistics).

The grid is datasets x processes x rules x seeds x overrides (in that nesting order); an
absent axis takes its value from ``base`` (or the :class:`RunConfig` default). Every error
(unknown key, wrong type, unknown rule or process, impossible combination, duplicate run)
is raised before any run as one-line :class:`SfgError` naming ``file:line`` and the fix.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sfg.errors import SfgError
from sfg.experiments.config import (
    ConfigError,
    RunConfig,
    config_error_message,
    run_id,
    validate_names,
)
from sfg.util.components import did_you_mean
from sfg.util.safety import check_cells, check_int64, compose_yaml, max_runs, read_text

AXES = {"datasets": "dataset", "processes": "process", "rules": "rule", "seeds": "seed"}
GRID_KEYS = ("name", "description", "base", *AXES, "overrides", "family")
FAMILY_KEYS = ("comparisons", "alpha")
FIELDS = tuple(RunConfig.model_fields)


@dataclass(frozen=True)
class Grid:
    """An expanded grid: its name and the run configs, in expansion order."""

    name: str
    configs: tuple[RunConfig, ...]
    axes: dict[str, list[Any]] = field(default_factory=dict)
    source: str = "<grid>"
    family: dict[str, Any] | None = None  # comparisons m, alpha (check_family)

    def __len__(self) -> int:
        return len(self.configs)

    def __iter__(self) -> Iterator[RunConfig]:
        return iter(self.configs)

    def run_ids(self) -> list[str]:
        return [run_id(c) for c in self.configs]


class _Where:
    """Line numbers of nodes in a composed YAML document."""

    def __init__(self, source: str, root: yaml.Node):
        self.source, self.root = source, root

    def node(self, *path: str | int) -> yaml.Node | None:
        node: yaml.Node | None = self.root
        for part in path:
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if k.value == part), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                node = node.value[part] if part < len(node.value) else None
            else:
                return None
        return node

    def key(self, *path: str | int) -> yaml.Node | None:
        """The key node of the last element of ``path`` (for 'unknown key' errors)."""
        parent = self.node(*path[:-1])
        if isinstance(parent, yaml.MappingNode):
            return next((k for k, _ in parent.value if k.value == path[-1]), None)
        return self.node(*path)

    def at(self, node: yaml.Node | None) -> str:
        line = node.start_mark.line + 1 if node is not None else 1
        return f"{self.source}:{line}"

    def error(self, path: tuple, message: str, *, key: bool = False) -> SfgError:
        node = self.key(*path) if key else self.node(*path)
        while node is None and path:  # fall back to the nearest existing parent
            path = path[:-1]
            node = self.node(*path)
        return SfgError(f"{self.at(node)}: {message}")


def _check_duplicate_keys(where: _Where, node: yaml.Node) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for k, v in node.value:
            if k.value in seen:
                raise SfgError(f"{where.at(k)}: key {k.value!r} appears twice in the same "
                               "mapping; keep one")
            seen.add(k.value)
            _check_duplicate_keys(where, v)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _check_duplicate_keys(where, v)


def _check_config_keys(where: _Where, mapping: Any, path: tuple, what: str) -> None:
    if not isinstance(mapping, dict):
        raise where.error(path, f"{what} must be a mapping of run settings (key: value), got "
                                f"{type(mapping).__name__}")
    for key in mapping:
        if key not in FIELDS:
            hint = did_you_mean(str(key), FIELDS)
            if key in AXES:
                hint = f"; {key!r} is a grid axis, write it at the top level"
            raise where.error((*path, key), f"unknown run setting {key!r} in {what}{hint}",
                              key=True)


def _check_axis(where: _Where, name: str, values: Any) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise where.error((name,), f"{name} must be a non-empty list, e.g. {name}: [...]")
    seen: dict[Any, int] = {}
    for i, v in enumerate(values):
        if name == "seeds":
            if isinstance(v, bool) or not isinstance(v, int):
                raise where.error((name, i), f"seeds must be integers, got {v!r} "
                                             f"({type(v).__name__}); write e.g. seeds: [1, 2, 3]")
            if v < 0:
                raise where.error((name, i), f"seed {v} is negative; seeds are >= 0")
        elif not isinstance(v, str) or not v.strip():
            raise where.error((name, i), f"{name} entries must be non-empty strings, got {v!r}; "
                                         "quote names such as 'aoi+ipw'")
        key = v.strip().lower() if isinstance(v, str) else v
        if key in seen:
            raise where.error((name, i), f"{name} lists {v!r} twice (also entry {seen[key]}); "
                                         "remove one")
        seen[key] = i
    return values


def parse_grid(text: str, *, source: str = "<grid>", default_name: str = "grid",
               check_names: bool = True) -> Grid:
    """Parse, validate and expand grid YAML ``text`` (``source`` names it in errors)."""
    root, data = compose_yaml(text, source, what="grid file")  # bounded: depth, alias bombs
    if root is None:
        raise SfgError(f"{source}: the grid file is empty; see examples/demo.yaml")
    where = _Where(source, root)
    if not isinstance(data, dict):
        raise where.error((), "a grid file must be a mapping with keys such as base:, rules:, "
                              "seeds:; see examples/demo.yaml")
    _check_duplicate_keys(where, root)
    for key in data:
        if key not in GRID_KEYS:
            hint = did_you_mean(str(key), GRID_KEYS)
            axis = next((a for a, f in AXES.items() if f == key), None)
            if axis:
                hint = f"; did you mean the axis {axis!r} (a list), or put {key!r} under base:?"
            elif key in FIELDS:
                hint = f"; {key!r} is a run setting, put it under base:"
            raise where.error((key,), f"unknown grid key {key!r}{hint}", key=True)
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise where.error(("name",), "name must be a non-empty string")
    if "description" in data and not isinstance(data["description"], str):
        raise where.error(("description",), "description must be a string")
    base = data.get("base") or {}
    _check_config_keys(where, base, ("base",), "base")
    axes: dict[str, list[Any]] = {}
    for axis, fld in AXES.items():
        if axis not in data:
            continue
        axes[axis] = _check_axis(where, axis, data[axis])
        if fld in base:
            raise where.error(("base", fld), f"base sets {fld!r} but the grid also has the axis "
                                             f"{axis!r}; remove one of them", key=True)
    overrides = data.get("overrides", [{}])
    if not isinstance(overrides, list) or not overrides:
        raise where.error(("overrides",), "overrides must be a non-empty list of mappings, "
                                          "e.g. overrides: [{}, {local_steps: 10}]")
    for i, o in enumerate(overrides):
        o = {} if o is None else o
        _check_config_keys(where, o, ("overrides", i), f"overrides[{i}]")
        for fld in o:
            axis = next((a for a, f in AXES.items() if f == fld), None)
            if axis in axes:
                raise where.error(("overrides", i, fld), f"overrides[{i}] sets {fld!r}, which "
                                  f"the axis {axis!r} already varies; remove one", key=True)
    cells = len(overrides)
    for values in axes.values():
        cells *= len(values)
    if cells > max_runs():
        sizes = " x ".join(f"{len(v)} {a}" for a, v in axes.items())
        raise where.error((), f"this grid expands to {cells:,} runs ({sizes} x {len(overrides)} "
                              f"overrides), over the limit of {max_runs():,}; split it into "
                              "smaller grids, or raise SFG_MAX_RUNS if it is meant")
    configs = _expand(where, base, axes, overrides, check_names)
    return Grid(name=name.strip(), configs=tuple(configs), axes=axes, source=source,
                family=_family(where, data.get("family")) if "family" in data else None)


def _family(where: _Where, fam: Any) -> dict[str, Any]:
    """The grid's declared family of comparisons: comparisons m (a whole number, 1 to
    1,000,000) and alpha (in (0, 1), default 0.05)."""
    if not isinstance(fam, dict):
        raise where.error(("family",), "family must be a mapping, e.g. family: {comparisons: "
                                       "24, alpha: 0.05}")
    for key in fam:
        if key not in FAMILY_KEYS:
            raise where.error(("family", key), f"unknown family key {key!r}"
                              f"{did_you_mean(str(key), FAMILY_KEYS)}; give comparisons: and "
                              "alpha:", key=True)
    m = fam.get("comparisons")
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 1_000_000:
        raise where.error(("family", "comparisons"), "family comparisons must be a whole "
                          f"number from 1 to 1,000,000 (the tests Holm corrects together), "
                          f"got {m!r}")
    alpha = fam.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise where.error(("family", "alpha"), f"family alpha must lie in (0, 1), got {alpha!r}")
    return {"comparisons": m, "alpha": float(alpha)}


def check_family(grid: Grid) -> str:
    """Whether the grid's seeds can resolve its declared family (:func:`_family`): with U
    seeds (the paired unit) the exact sign-flip test's smallest two-sided p is 2^(1 − U), and
    Holm's strictest threshold is alpha / m, so every comparison can come out significant only
    when 2^(1 − U) < alpha / m. Returns the verdict as one line; raises :class:`SfgError`
    (one line, with the seeds needed) when it cannot, or when no family is declared."""
    if grid.family is None:
        raise SfgError(f"{grid.source}: the grid declares no family of comparisons; add e.g. "
                       "family: {comparisons: 24, alpha: 0.05} (the tests its results will be "
                       "corrected over together)")
    m, alpha = grid.family["comparisons"], grid.family["alpha"]
    seeds = {c.seed for c in grid.configs}
    u = len(seeds)
    smallest, bar = 2.0 ** (1 - u), alpha / m
    need = 1  # the least U with 2^(1-U) < alpha/m (at most about 1,100 steps)
    while 2.0 ** (1 - need) >= bar:
        need += 1
    if smallest >= bar:
        raise SfgError(f"{grid.source}: {u} seeds cannot resolve {m} comparisons at alpha "
                       f"{alpha:g}: the smallest p of the exact sign-flip test, 2^(1-{u}) = "
                       f"{smallest:.3g}, is not below alpha/m = {bar:.3g}; use at least {need} "
                       "seeds, or fewer comparisons")
    return (f"grid {grid.name!r}: {len(grid)} runs, {u} seeds, a family of {m} comparisons at "
            f"alpha {alpha:g}: the smallest p 2^(1-{u}) = {smallest:.3g} < alpha/m = {bar:.3g}, "
            f"so each comparison can be resolved after Holm ({need} seeds are the least)")


def _expand(where: _Where, base: dict, axes: dict[str, list[Any]], overrides: list,
            check_names: bool) -> list[RunConfig]:
    levels = [list(enumerate(axes.get(a, [None]))) for a in AXES]
    configs: list[RunConfig] = []
    origin: dict[str, int] = {}
    checked: dict[tuple, None] = {}
    for combo in itertools.product(*levels, list(enumerate(overrides))):
        *axis_items, (oi, o) = combo
        o = o or {}
        values = dict(base)
        located: dict[str, tuple] = {k: ("base", k) for k in base}
        for (i, v), (axis, fld) in zip(axis_items, AXES.items(), strict=True):
            if axis in axes:
                values[fld] = v
                located[fld] = (axis, i)
        for k, v in o.items():
            values[k] = v
            located[k] = ("overrides", oi, k)
        fallback = ("overrides", oi) if o else ("base",) if base else ()
        try:
            cfg = RunConfig(**values)
        except ValidationError as err:
            fld, msg = config_error_message(err)
            raise where.error(located.get(fld, fallback), msg) from None
        try:  # sizes in range before anything runs: the availability of a run, the seed
            check_cells(cfg.rounds, cfg.n_clients, 2, "a run of this grid",
                        cols_name="clients", fix="lower rounds or n_clients")
            check_int64(cfg.seed, "seed", lo=0)
        except SfgError as err:
            fld = "seed" if "seed" in str(err).split(" ", 1)[0] else "rounds"
            raise where.error(located.get(fld, fallback), str(err)) from None
        if check_names:
            key = (cfg.kind, cfg.rule, cfg.process, cfg.dataset, cfg.graph, cfg.model)
            if key not in checked:
                try:
                    validate_names(cfg)
                except ConfigError as err:
                    raise where.error(located.get(err.field, fallback), str(err)) from None
                checked[key] = None
        rid = run_id(cfg)
        if rid in origin:
            raise where.error(fallback or ("base",),
                              f"this grid expands to the same run twice (runs {origin[rid]} and "
                              f"{len(configs)}: {cfg.rule}, {cfg.process}, seed {cfg.seed}); an "
                              "override repeats the base or another override, remove it")
        origin[rid] = len(configs)
        configs.append(cfg)
    return configs


def load_grid(path: str | Path, *, check_names: bool = True) -> Grid:
    """Read and expand the grid file at ``path`` (see :func:`parse_grid`)."""
    p = Path(path)
    if not p.exists():
        raise SfgError(f"grid file {p} does not exist; give the path of a YAML grid such as "
                       "examples/demo.yaml")
    text = read_text(p, "grid file", hint="; give the path of a YAML grid such as "
                                          "examples/demo.yaml", bytes_per_byte=50)
    return parse_grid(text, source=str(p), default_name=p.stem, check_names=check_names)
