"""Experiments (docs/concepts/training.md#pairing, docs/concepts/statistics.md#paired-statistics): run configs, grid files, the SQLite results store, executors.

::

    from sfg.experiments import load_grid, run_grid, records
    grid = load_grid("examples/demo.yaml")
    summary = run_grid(grid.configs, "results.sqlite", workers=0)   # resumable
    rows = records("results.sqlite")     # [{"run_id", "dataset", "process", "rule", "seed",
                                         #   "config", "metrics", "curves"}, ...]
"""

from sfg.util.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = ["ConfigError", "Grid", "GridSummary", "RunConfig", "SCHEMA_VERSION", "Store",
           "canonical_json", "load_grid", "make_config", "parse_grid", "records", "run_config",
           "run_grid", "run_id", "selftest_run", "validate_names", "worker_loop"]
