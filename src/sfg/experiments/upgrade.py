"""``sfg grid upgrade``: give the swarm runs of a results store written by sfg 0.2 their own
identity (docs/reference/store.md#upgrading-a-store).

sfg 0.2's ``sfg swarm --store`` kept swarm runs apart from the simulators' by storing them
with ``backend: swarm-<mode>`` (``swarm-lockstep``, ``swarm-async`` for real nodes,
``swarm-virtual-lockstep``, ``swarm-virtual-async`` for the node on the virtual clock). A
run's settings now say which nodes ran it (``nodes``, :class:`~sfg.experiments.config.RunConfig`),
and its run id covers that. :func:`upgrade_store` rewrites each such row's settings — ``nodes``
and the protocol from the old backend, ``backend: loop`` (what the nodes trained with) — and
moves the row, its curves, diagnostics and grid names to the new run id, in one transaction.
Every other row is left as it is (its id has not changed).

0.2 did not store real asynchronous nodes' timer (``--period``, ``--jitter``, ``--window``):
those rows get the values given here (default the real nodes' defaults: 0.2 s, 0, 1).
"""

from __future__ import annotations

import os
from typing import Any

from sfg.errors import SfgError

# 0.2's backend trick -> the settings that replace it
OLD_BACKENDS: dict[str, dict[str, Any]] = {
    "swarm-lockstep": {"nodes": "real", "protocol": "lockstep"},
    "swarm-async": {"nodes": "real", "protocol": "async"},
    "swarm-virtual-lockstep": {"nodes": "virtual", "clock": "virtual", "protocol": "lockstep"},
    "swarm-virtual-async": {"nodes": "virtual", "clock": "virtual", "protocol": "async"},
}


def upgraded_config(config: dict[str, Any], *, period: float | None = None,
                    jitter: float = 0.0, window: float = 1.0) -> dict[str, Any] | None:
    """The settings a 0.2 swarm row stands for (None: not such a row). ``period``,
    ``jitter``, ``window``: real asynchronous nodes' timer, which 0.2 did not store."""
    from sfg.experiments.config import make_config

    new = OLD_BACKENDS.get(str(config.get("backend")))
    if new is None:
        return None
    values = {**config, **new, "backend": "loop"}
    if new == OLD_BACKENDS["swarm-async"]:
        values.update(period=period, jitter=jitter, window=window)
    return make_config(values).model_dump(mode="json")


def upgrade_store(path: str | os.PathLike, *, period: float | None = None, jitter: float = 0.0,
                  window: float = 1.0, dry_run: bool = False) -> list[dict[str, str]]:
    """Re-key the 0.2 swarm rows of the store at ``path`` (see the module docstring); returns
    one ``{"old", "new", "engine"}`` per row re-keyed (or that would be, ``dry_run``). A row
    whose new id is already in the store is an error naming both (nothing is written)."""
    from sfg.engines import engine_of
    from sfg.experiments.config import RunConfig, canonical_json, run_id
    from sfg.experiments.store import Store

    with Store(path, create=False) as st:
        plan = []
        for row in st.runs():
            cfg = upgraded_config(row["config"], period=period, jitter=jitter, window=window)
            if cfg is None:
                continue
            rc = RunConfig(**cfg)
            plan.append({"old": row["run_id"], "new": run_id(rc), "engine": engine_of(cfg),
                         "config": canonical_json(rc)})
        if dry_run or not plan:
            return [{k: p[k] for k in ("old", "new", "engine")} for p in plan]
        tables = {name for (name,) in st._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        with st._write() as con:
            con.execute("PRAGMA defer_foreign_keys = ON")  # the row and its curves move together
            for p in plan:
                if con.execute("SELECT 1 FROM runs WHERE run_id = ?", (p["new"],)).fetchone():
                    raise SfgError(f"{path}: run {p['old']} re-keys to {p['new']}, which the "
                                   "store already holds; nothing was changed")
                con.execute("UPDATE runs SET run_id = ?, config = ? WHERE run_id = ?",
                            (p["new"], p["config"], p["old"]))
                for table in ("curves", "diagnostics", "grid_runs"):
                    if table in tables:
                        con.execute(f"UPDATE {table} SET run_id = ? WHERE run_id = ?",
                                    (p["new"], p["old"]))
    return [{k: p[k] for k in ("old", "new", "engine")} for p in plan]

