"""Experiments (SPEC §7-8): run configs, grid files, the SQLite results store, executors.

::

    from sfg.experiments import load_grid, run_grid, records
    grid = load_grid("examples/demo.yaml")
    summary = run_grid(grid.configs, "results.sqlite", workers=0)   # resumable
    rows = records("results.sqlite")     # [{"run_id", "dataset", "process", "rule", "seed",
                                         #   "config", "metrics", "curves"}, ...]
"""

from .config import ConfigError, RunConfig, canonical_json, make_config, run_id, validate_names
from .executors import GridSummary, run_grid, worker_loop
from .grid import Grid, load_grid, parse_grid
from .runner import run_config, selftest_run
from .store import SCHEMA_VERSION, Store, records

__all__ = ["ConfigError", "Grid", "GridSummary", "RunConfig", "SCHEMA_VERSION", "Store",
           "canonical_json", "load_grid", "make_config", "parse_grid", "records", "run_config",
           "run_grid", "run_id", "selftest_run", "validate_names", "worker_loop"]
