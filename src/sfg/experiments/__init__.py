"""Experiments (SPEC §7-8): run configs, grid files, the SQLite results store, executors.

::

    from sfg.experiments import load_grid, run_grid, records
    grid = load_grid("examples/demo.yaml")
    summary = run_grid(grid.configs, "results.sqlite", workers=0)   # resumable
    rows = records("results.sqlite")     # [{"run_id", "dataset", "process", "rule", "seed",
                                         #   "config", "metrics", "curves"}, ...]
"""

from importlib import import_module
from typing import Any

# name -> submodule; loaded on first access (PEP 562): `sfg grid --help` and the commands
# that never touch a grid do not import pydantic, yaml or sqlite
_EXPORTS = {
    "ConfigError": "config", "RunConfig": "config", "canonical_json": "config",
    "make_config": "config", "run_id": "config", "validate_names": "config",
    "GridSummary": "executors", "run_grid": "executors", "worker_loop": "executors",
    "Grid": "grid", "load_grid": "grid", "parse_grid": "grid",
    "run_config": "runner", "selftest_run": "runner",
    "SCHEMA_VERSION": "store", "Store": "store", "records": "store",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = ["ConfigError", "Grid", "GridSummary", "RunConfig", "SCHEMA_VERSION", "Store",
           "canonical_json", "load_grid", "make_config", "parse_grid", "records", "run_config",
           "run_grid", "run_id", "selftest_run", "validate_names", "worker_loop"]
