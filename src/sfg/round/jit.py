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


# the top-level packages whose functions are not hashed into a rule's key (numba compiles
# them from the installed library, which does not change under a running project)
_LIBRARIES = frozenset({"numpy", "numba", "llvmlite", "scipy", "builtins"})


def _own(module: str | None) -> bool:
    """Whether functions of ``module`` are hashed into a rule's key: the project's and the
    user's code, not numpy, numba or the standard library."""
    import sys

    top = (module or "").split(".")[0]
    return bool(top) and top not in _LIBRARIES and top not in sys.stdlib_module_names


def _file_text(path: str) -> bytes:
    """The bytes of a source file (empty when it cannot be read), read once per version."""
    import os

    try:
        st = os.stat(path)
    except OSError:
        return b""
    key = (path, st.st_mtime_ns, st.st_size)
    got = _FILES.get(key)
    if got is None:
        try:
            with open(path, "rb") as f:
                got = f.read()
        except OSError:
            got = b""
        _FILES[key] = got
    return got


_FILES: dict[tuple, bytes] = {}


def source_digest(fn) -> str:
    """A hash of everything numba compiles into ``fn`` (lazy, a numba dispatcher or a plain
    function): its code and, transitively, the code of every function of the project's or
    the user's modules it refers to (helpers it calls, through globals, closures or module
    attributes), their compile options and defaults, the global constants they read (numba
    freezes them at compile time), and the text of every source file those functions are
    defined in. A compiled rule is cached on disk under this hash (:func:`sfg.round.kernel.scorer`),
    so an edit to a rule or to any helper it calls is compiled afresh on the next run instead
    of loading stale code. Functions of numpy, numba and the standard library are named, not
    hashed."""
    import hashlib
    import types

    h = hashlib.sha1()
    seen: set[int] = set()
    files: set[str] = set()
    todo: list = [fn]

    def value(v) -> None:
        if isinstance(v, (bool, int, float, complex, str, bytes, type(None))):
            h.update(repr(v).encode())
        elif isinstance(v, frozenset):
            h.update(repr(sorted(map(repr, v))).encode())
        elif isinstance(v, tuple):
            h.update(b"(")
            for item in v:
                value(item)
            h.update(b")")
        elif isinstance(v, types.ModuleType):
            h.update(f"<module {v.__name__}>".encode())
        elif isinstance(v, LazyJit) or hasattr(v, "py_func") or isinstance(v, types.FunctionType):
            todo.append(v)
        elif type(v).__module__ == "numpy" and hasattr(v, "tobytes"):  # arrays, scalars
            h.update(f"<{type(v).__name__} {getattr(v, 'dtype', '')} "
                     f"{getattr(v, 'shape', '')}>".encode())
            h.update(hashlib.sha1(v.tobytes()).digest())
        else:  # classes, ufuncs, objects: their name (a repr may hold an address)
            h.update(f"<{type(v).__module__}.{type(v).__qualname__} "
                     f"{getattr(v, '__qualname__', getattr(v, '__name__', ''))}>".encode())

    def code(c, g: dict) -> None:
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                code(k, g)
            else:
                value(k)
        mods = [g[n] for n in c.co_names
                if isinstance(g.get(n), types.ModuleType) and _own(g[n].__name__)]
        for n in c.co_names:
            if n in g:
                value(g[n])
            for m in mods:  # helpers reached as module attributes (``helpers.f``)
                if n in vars(m):
                    value(vars(m)[n])

    while todo:
        f = todo.pop()
        options = getattr(f, "options", None) if isinstance(f, LazyJit) else getattr(
            f, "targetoptions", None)
        py = getattr(f, "py_func", f)
        if not isinstance(py, types.FunctionType):
            value(py)
            continue
        if id(py) in seen:
            continue
        seen.add(id(py))
        h.update(f"<def {py.__module__}.{py.__qualname__}>".encode())
        if not _own(py.__module__) and py is not getattr(fn, "py_func", fn):
            continue  # a library's function: named only
        if options:
            h.update(repr(sorted((k, repr(v)) for k, v in dict(options).items())).encode())
        value(py.__defaults__)
        for cell in py.__closure__ or ():
            try:
                value(cell.cell_contents)
            except ValueError:  # an empty cell
                h.update(b"<empty cell>")
        code(py.__code__, py.__globals__)
        files.add(py.__code__.co_filename)
    for path in sorted(files):
        h.update(hashlib.sha1(_file_text(path)).digest())
    return h.hexdigest()[:12]
