"""Import paths from before the layout of packages (0.1): each old module name still imports,
as the module it became, with a :class:`DeprecationWarning` naming the new path."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module or package -> where it lives now
MOVED = {
    "sfg.rounds": "sfg.round.slots",
    "sfg.staleness": "sfg.round.staleness",
    "sfg.defences": "sfg.round.defences",
    "sfg.attacks": "sfg.round.attacks",
    "sfg.jit": "sfg.round.jit",
    "sfg.rules": "sfg.round.rules",
    "sfg.graphs": "sfg.world.graphs",
    "sfg.models": "sfg.world.models",
    "sfg.outages": "sfg.world.outages",
    "sfg.traces.cli": "sfg.cli.traces",
    "sfg.traces": "sfg.world.traces",
    "sfg.data": "sfg.world.data",
    "sfg.stats": "sfg.experiments.stats",
    "sfg.report": "sfg.experiments.report.paired",
    "sfg.report_diagnostics": "sfg.experiments.report.diagnostics",
    "sfg.attack_report": "sfg.experiments.report.attacks",
    "sfg.console": "sfg.cli.console",
    "sfg.replay_cli": "sfg.cli.replay",
    "sfg.sim.cli": "sfg.cli.run",
    "sfg.net.cli": "sfg.cli.net",
    "sfg.experiments.cli": "sfg.cli.grid",
    "sfg.report_cli": "sfg.cli.report",
    "sfg.pretrain_cli": "sfg.cli.pretrain",
    "sfg.demo": "sfg.cli.demo",
    "sfg.pretrain": "sfg.sim.pretrain",
    "sfg.spec": "sfg.util.components",
    "sfg.safety": "sfg.util.safety",
    "sfg.rng": "sfg.util.rng",
    "sfg.lazy": "sfg.util.lazy",
    "sfg.alloc": "sfg.util.alloc",
    "sfg.net.state": "sfg.net.checkpoints",
}


def new_name(old: str) -> str | None:
    """Where the module ``old`` lives now, or None if it did not move."""
    parts = old.split(".")
    for k in range(len(parts), 1, -1):
        head = ".".join(parts[:k])
        if head in MOVED:
            return ".".join([MOVED[head], *parts[k:]])
    return None


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Consulted first, for the old names only (no module of today has one of them as prefix)."""

    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass


def install() -> None:
    if not any(isinstance(f, _Moved) for f in sys.meta_path):
        sys.meta_path.insert(0, _Moved())  # before the path finder: an old name never loads a file twice
