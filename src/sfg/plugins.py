"""Plugins: your own rules, datasets, models and outage processes, loaded by every sfg process.

A plugin is a Python module that registers components when it is imported (``@rule(...)``,
``DATASETS.register(...)``, ``MODELS.register(...)``, ``PROCESSES.register(...)``). sfg imports

* the modules named by the entry points of an installed distribution, in the groups
  :data:`GROUPS` (``sfg.rules``, ``sfg.datasets``, ``sfg.models``, ``sfg.processes``); in a
  ``pyproject.toml``::

      [project.entry-points."sfg.rules"]
      my-rules = "my_package.rules"

* the modules named by ``--plugin MODULE`` (``sfg --plugin my_rules replay ...``, repeatable)
  and by the environment variable ``SFG_PLUGINS`` (comma-separated module names), which must
  be importable (on ``PYTHONPATH``).

The command line loads them before a command runs (and passes ``--plugin`` on to its child
processes through ``SFG_PLUGINS``); the grid's worker processes (in-process, the process
pool, Ray tasks) and the networked nodes' workers load them again on start; in Python, the
rule registry loads them on first use (:func:`sfg.round.rules.parse_rule`), or call
:func:`load`.

A plugin that fails to import is one :class:`PluginError` line naming it, reported by what
needs it: the command line and the registries note it and go on (``--help``, the built-in
names and ``sfg rules``, which lists it as broken, keep working); an unknown name while a
plugin is broken says so (:func:`broken_note`), in the grid's and the nodes' worker
processes too: a run fails only if it needs the broken plugin. ``SFG_NO_PLUGINS=1`` (``sfg --no-plugins``, passed on
to child processes through the environment) turns the installed plugins (entry points) off;
modules named by ``--plugin`` and ``SFG_PLUGINS`` still load.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterable

from sfg.errors import SfgError
from sfg.util.components import broken, broken_by_key, broken_note, note_broken

#: the entry-point groups sfg reads, one per kind of component
GROUPS = ("sfg.rules", "sfg.datasets", "sfg.models", "sfg.processes")
#: the environment variable naming plugin modules (comma-separated)
ENV = "SFG_PLUGINS"
#: the environment variable that turns the installed plugins (entry points) off: 1
OFF = "SFG_NO_PLUGINS"

_LOCK = threading.RLock()
_DONE: set[str] = set()  # entry points and modules imported in this process
_SCANNED: list[list[tuple[str, str, str, str]]] = []  # the entry points found, once per process
_ACTIVE: list[bool] = []  # set while loading (a plugin's own import may ask for the rules)


def installed_off() -> bool:
    """Whether ``SFG_NO_PLUGINS`` turns the installed plugins off (any value but empty or 0)."""
    return os.environ.get(OFF, "").strip() not in ("", "0")


class PluginError(SfgError):
    """A plugin could not be loaded (one line naming it)."""


def env_modules(value: str | None = None) -> list[str]:
    """The module names in ``SFG_PLUGINS`` (or ``value``), in order, without repeats."""
    raw = os.environ.get(ENV, "") if value is None else value
    out: list[str] = []
    for item in raw.split(","):
        name = item.strip()
        if name and name not in out:
            out.append(name)
    return out


def add_to_env(modules: Iterable[str]) -> None:
    """Add ``modules`` to ``SFG_PLUGINS`` in this process's environment, so that the child
    processes it starts (grid workers, node workers, compile helpers) load them too."""
    names = env_modules()
    for m in modules:
        m = m.strip()
        if m and m not in names:
            names.append(m)
    if names:
        os.environ[ENV] = ",".join(names)


def entry_points() -> list[tuple[str, str, str, str]]:
    """(group, name, value, distribution) of every installed entry point in :data:`GROUPS`
    (read once per process)."""
    if not _SCANNED:
        from importlib.metadata import entry_points as eps

        every = eps()  # one scan of the installed distributions (each group's would rescan)
        found = [(group, ep.name, ep.value, getattr(getattr(ep, "dist", None), "name", "?"))
                 for group in GROUPS for ep in every.select(group=group)]
        _SCANNED.append(found)
    return _SCANNED[0]


def _check_name(module: str, where: str) -> None:
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        raise PluginError(f"plugin {module!r} ({where}) is not a module name; give an "
                          "importable module such as my_rules or my_package.rules")


def _import(target: str, what: str) -> None:
    """Import ``module`` or ``module:attr`` (an entry point's value); one error line if it
    fails, naming ``what``."""
    module, _, attr = target.partition(":")
    try:
        got = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            got = getattr(got, part)
    except ModuleNotFoundError as e:
        if e.name is not None and (module.strip() == e.name
                                   or module.strip().startswith(e.name + ".")):
            raise PluginError(f"plugin {what}: no module named {e.name!r}; install it or put "
                              "its folder on PYTHONPATH") from None
        raise PluginError(f"plugin {what} failed to import: {_line(e)}") from None
    except SfgError as e:
        raise PluginError(f"plugin {what} failed to import: {e}") from None
    except Exception as e:  # noqa: BLE001 - any error in a user's module is one line naming it
        raise PluginError(f"plugin {what} failed to import: {_line(e)}") from None


def _line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def load(modules: Iterable[str] = (), *, entry_points_too: bool = True,
         strict: bool = True) -> list[str]:
    """Import the plugins: ``modules``, those in ``SFG_PLUGINS`` and (``entry_points_too``,
    unless ``SFG_NO_PLUGINS=1``) the installed entry points of :data:`GROUPS`. Each is imported
    once per process; the built-in rules are registered first, so a plugin's name that clashes
    with one is an error naming the plugin. Returns what this call imported. One that fails is
    noted (:func:`broken`); ``strict``: then raise its :class:`PluginError` (also for one that
    failed in an earlier call)."""
    with _LOCK:
        if _ACTIVE:
            return []
        entry_points_too = entry_points_too and not installed_off()
        modules = [m.strip() for m in modules if m.strip()]
        wanted: list[tuple[str, str, str]] = []  # (key, what to import, how it is named)
        for m in dict.fromkeys([*modules, *env_modules()]):
            where = "--plugin" if m in modules else ENV
            _check_name(m, where)
            wanted.append((f"module={m}", m, f"{m!r} ({where})"))
        if entry_points_too:
            for group, name, value, dist in entry_points():
                wanted.append((f"{group}:{name}={value}", value,
                               f"{value!r} (entry point {name!r} in group {group!r} of the "
                               f"package {dist})"))
        todo = [w for w in wanted if w[0] not in _DONE]
        done: list[str] = []
        if todo:
            _ACTIVE.append(True)
            try:
                from sfg.round.rules import library, oracles  # noqa: F401 - built-ins first

                for key, target, what in todo:
                    _DONE.add(key)
                    try:
                        _import(target, what)
                    except PluginError as e:
                        note_broken(key, str(e))
                        continue
                    done.append(target)
            finally:
                _ACTIVE.clear()
        gone = broken_by_key()
        failed = [gone[key] for key, _, _ in wanted if key in gone]
        if strict and failed:
            raise PluginError(failed[0])
        return done

__all__ = ["ENV", "GROUPS", "OFF", "PluginError", "add_to_env", "broken", "broken_note",
           "entry_points", "env_modules", "installed_off", "load"]
