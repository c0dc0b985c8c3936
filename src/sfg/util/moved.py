"""The model-free package's old name, ``sfg.replay.*`` (``sfg.replay`` is the replay job, a
function, since 0.3): ``from sfg.replay import replay`` and ``import sfg.replay.metrics`` keep
working until 0.4, each with one :class:`DeprecationWarning` that names the new home
(``import sfg.replay.metrics as m`` does not: ``sfg.replay`` is the function there),
:mod:`sfg.modelfree`. :func:`install` (called by ``import sfg``) puts a light module under the
old name into ``sys.modules`` — so importing it never replaces the function ``sfg.replay`` —
and a finder that answers the old submodules with the new ones."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

OLD, NEW = "sfg.replay", "sfg.modelfree"


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is now {new} (sfg.replay is the replay job, a function); the old "
                  "path works until 0.4", DeprecationWarning, stacklevel=3)


class _Old(types.ModuleType):
    """``sfg.replay`` as a module: each name read from it comes from :mod:`sfg.modelfree`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        _warn(f"{OLD}.{name}", f"{NEW}.{name}")
        value = getattr(importlib.import_module(NEW), name)
        setattr(self, name, value)  # one warning per name
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sfg.replay.X`` → the module ``sfg.modelfree.X``."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(OLD + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=False)

    def create_module(self, spec):
        new = NEW + spec.name[len(OLD):]
        _warn(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        pass  # the new module, already loaded


def install() -> None:
    """Put the old name in place (once per process)."""
    if OLD in sys.modules:
        return
    mod = _Old(OLD, "The old name of sfg.modelfree (until 0.4).")
    mod.__path__ = []  # a package, so that its submodules are looked up (by the finder)
    sys.modules[OLD] = mod
    sys.meta_path.insert(0, _Finder())
