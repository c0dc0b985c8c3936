"""Component strings and registries (Gymnasium-style string ids with did-you-mean errors).

A component is named by a string ``name[:key=value,key=value][+modifier[+modifier...]]``::

    sfg-cut:L=2
    sfg-l:gamma=0.3+ipw
    bursty:u=0.8,mean_off=10
    flash:rule=strict,path=../shared/data/flash/flash_state_traces_subset.json

Values are parsed as int, float, bool (``true``/``false``) or left as strings. Modifiers may
carry parameters too (``+catchup``). A :class:`Registry` maps names to factories and checks
every key against the factory's declared parameters.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sfg.errors import SfgError


@dataclass(frozen=True)
class Component:
    """A parsed component string."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    modifiers: tuple[str, ...] = ()
    text: str = ""

    def __str__(self) -> str:
        return self.text or format_component(self.name, self.params, self.modifiers)


def _value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw.strip()


def parse_component(text: str, *, kind: str = "component") -> Component:
    """Parse ``name:key=value,...+mod+mod`` into a :class:`Component`."""
    if not isinstance(text, str) or not text.strip():
        raise SfgError(f"empty {kind} name; write e.g. 'name' or 'name:key=value'")
    raw = text.strip()
    head, _, tail = raw.partition(":")
    params: dict[str, Any] = {}
    modifiers: list[str] = []
    if tail:
        # modifiers follow the last parameter: "sfg-l:gamma=0.3+ipw"
        parts = tail.split("+")
        param_text, modifiers = parts[0], [m for m in parts[1:]]
        for item in param_text.split(","):
            if not item.strip():
                continue
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise SfgError(
                    f"cannot parse {kind} parameter {item!r} in {raw!r}; write key=value, "
                    "e.g. 'bursty:u=0.8'"
                )
            if key.strip() in params:
                raise SfgError(
                    f"{kind} {raw!r} gives parameter {key.strip()!r} twice; keep one value"
                )
            params[key.strip()] = _value(value)
    else:
        parts = head.split("+")
        head, modifiers = parts[0], parts[1:]
    name = head.strip().lower()
    if not name:
        raise SfgError(f"{kind} {raw!r} has no name before ':' or '+'")
    modifiers = [m.strip().lower() for m in modifiers]
    if any(not m for m in modifiers):
        raise SfgError(f"{kind} {raw!r} has an empty '+' modifier")
    twice = sorted({m for m in modifiers if modifiers.count(m) > 1})
    if twice:
        raise SfgError(f"{kind} {raw!r} gives the modifier '+{twice[0]}' twice; keep one")
    return Component(name=name, params=params, modifiers=tuple(modifiers), text=raw)


def format_component(name: str, params: dict[str, Any] | None = None,
                     modifiers: Iterable[str] = ()) -> str:
    """Inverse of :func:`parse_component` (canonical order of keys)."""
    out = name
    if params:
        out += ":" + ",".join(f"{k}={params[k]}" for k in sorted(params))
    for m in modifiers:
        out += "+" + m
    return out


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` or a list of the valid choices."""
    choices = sorted(set(choices))
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    if close:
        return f"; did you mean {close[0]!r}?"
    shown = ", ".join(choices[:40]) + (", ..." if len(choices) > 40 else "")
    return f"; choose one of: {shown}"


_BROKEN: dict[str, str] = {}  # a plugin that failed to import -> its one-line message


def note_broken(key: str, message: str) -> None:
    """Note a plugin that failed to import (:mod:`sfg.plugins`): an unknown name says so."""
    _BROKEN[key] = message


def broken() -> list[str]:
    """The one-line messages of the plugins that failed to import in this process."""
    return list(_BROKEN.values())


def broken_by_key() -> dict[str, str]:
    """What failed to import (:mod:`sfg.plugins`' key) -> its one-line message."""
    return dict(_BROKEN)


def broken_note() -> str:
    """``""``, or the clause an unknown-name error adds while a plugin is broken: the name may
    be one of its components."""
    gone = broken()
    if not gone:
        return ""
    which = "a plugin that may define it is" if len(gone) == 1 else \
        f"{len(gone)} plugins that may define it are"
    return (f"; note that {which} broken: {'; '.join(gone)} (fix it, or turn installed "
            "plugins off with --no-plugins or SFG_NO_PLUGINS=1)")


def plain_text(doc: str) -> str:
    """A docstring line as a person reads it in a terminal or a table: reStructuredText's
    ``literal`` marks and Sphinx roles (a colon-named role before a backquoted target)
    dropped (``sfg rules``, :func:`sfg.rules`)."""
    import re

    doc = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`", r"\1", doc)
    return re.sub(r"``([^`]+)``", r"\1", doc)


def unknown_parameter(kind: str, name: str, key: str, valid: Iterable[str]) -> str:
    """The one message for an unknown parameter ``key`` of ``kind`` ``name``: a did-you-mean
    with the valid parameters, or the list of them (said once)."""
    valid = sorted(valid)
    if not valid:
        return f"unknown parameter {key!r} for {kind} {name!r}; it takes no parameters"
    hint = did_you_mean(key, valid)
    if hint.startswith("; did you mean"):
        hint += f" (valid parameters: {', '.join(valid)})"
    return f"unknown parameter {key!r} for {kind} {name!r}{hint}"


@dataclass
class Entry:
    name: str
    factory: Callable[..., Any] | None  # None: run elsewhere (model-reading rules)
    params: dict[str, Any]
    doc: str = ""
    tags: frozenset[str] = frozenset()


class Registry:
    """Name -> factory, with declared parameters (and their defaults) for validation."""

    def __init__(self, kind: str, entry_type: type[Entry] = Entry):
        self.kind = kind
        self.entry_type = entry_type
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, factory: Callable[..., Any] | None, *,
                 params: dict[str, Any] | None = None, doc: str = "", tags: Iterable[str] = (),
                 **extra: Any) -> Callable[..., Any] | None:
        """``extra``: the fields of a subclass of :class:`Entry` (``entry_type``)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = self.entry_type(name, factory, dict(params or {}), plain_text(doc),
                                              frozenset(tags), **extra)
        return factory

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(sorted(self._entries))

    def names(self, tag: str | None = None) -> list[str]:
        return sorted(n for n, e in self._entries.items() if tag is None or tag in e.tags)

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise SfgError(f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)}"
                           f"{broken_note()}") from None

    def check_params(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        """Defaults merged with ``params``; unknown keys raise a did-you-mean error."""
        entry = self.entry(name)
        for key in params:
            if key not in entry.params:
                raise SfgError(unknown_parameter(self.kind, name, key, entry.params))
        merged = dict(entry.params)
        merged.update(params)
        return merged

    def make(self, text: str | Component, **overrides: Any) -> Any:
        comp = text if isinstance(text, Component) else parse_component(text, kind=self.kind)
        params = self.check_params(comp.name, {**comp.params, **overrides})
        factory = self._entries[comp.name].factory
        if factory is None:
            raise SfgError(f"{self.kind} {comp.name!r} cannot be made here")
        return factory(**params)
