"""``njit`` that imports numba on first use, so that listing the rules loads no compiler.

``@njit(cache=True)`` here records the Python function; the first call (or
:func:`materialise`, which the round calls before compiling a rule) makes the numba dispatcher
and puts it in the function's module in place of the placeholder, so that compiled callers
see a real dispatcher. Rules may as well use ``numba.njit`` directly.
"""

from __future__ import annotations

from typing import Any


class LazyJit:
    """A function to be compiled by ``numba.njit(**options)`` on first use."""

    def __init__(self, py_func, options: dict[str, Any]):
        self.py_func = py_func
        self.options = options
        self.__doc__ = py_func.__doc__
        self.__name__ = py_func.__name__
        self._dispatcher = None

    @property
    def dispatcher(self):
        if self._dispatcher is None:
            import numba

            import sfg.util.numba_start  # noqa: F401 - numba as sfg starts it

            self._dispatcher = numba.njit(**self.options)(self.py_func)
            g = self.py_func.__globals__
            if g.get(self.py_func.__name__) is self:
                g[self.py_func.__name__] = self._dispatcher
        return self._dispatcher

    def __call__(self, *args, **kwargs):
        return self.dispatcher(*args, **kwargs)


def njit(fn=None, **options):
    """``@njit`` or ``@njit(cache=True, ...)``, compiled lazily (see the module docstring)."""
    if fn is None:
        return lambda f: LazyJit(f, options)
    return LazyJit(fn, options)


def materialise(fn):
    """The numba dispatcher of ``fn`` (lazy or not), after making real every lazy function that
    its module — and the modules of those functions — refer to."""
    seen: set[int] = set()
    todo = [getattr(fn, "py_func", fn).__globals__]
    while todo:
        g = todo.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        for value in list(g.values()):
            if isinstance(value, LazyJit):
                value.dispatcher  # noqa: B018 - replaces the placeholder in its module
                todo.append(value.py_func.__globals__)
    return fn.dispatcher if isinstance(fn, LazyJit) else fn
