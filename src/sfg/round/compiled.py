"""Kernels compiled for one signature on first use, optionally ahead in a helper process;
compiled functions as first-class function arguments (:func:`first_class`).

Numba compiles on one core. On a cold cache (the first use on a machine, or a fresh
``NUMBA_CACHE_DIR``) the first replay compiles the round and the self-return's kernel, about
two seconds each; :meth:`Kernel.ahead` hands one of them to a helper process, which compiles
it into numba's on-disk cache while this process compiles the other, and :meth:`Kernel.get`
then loads it from there (waiting for the helper if it is not done yet). The code and its
results are the same either way: the helper only fills the cache, which this process would
otherwise fill itself. Nothing is started when the kernel is cached already, when fewer than
two cores are usable, or when numba's JIT is disabled; if the helper fails, this process
compiles the kernel itself.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


class Kernel:
    """``py_func`` compiled by numba for the one signature ``signature()`` returns (cached on
    disk, GIL released), made on first :meth:`get`. ``name`` is this object's attribute name
    in ``py_func``'s module (what the helper process imports)."""

    def __init__(self, py_func: Callable, signature: Callable[[], object], name: str):
        self.py_func, self.signature, self.name = py_func, signature, name
        self._dispatcher = None
        self._helper: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def get(self):
        """The numba dispatcher (compiled, or loaded from the cache)."""
        if self._dispatcher is None:
            with self._lock:
                if self._dispatcher is None:
                    if self._helper is not None:  # it compiles the kernel into the cache
                        self._helper.wait()
                        self._helper = None
                    from sfg.util.numba_start import njit

                    self._dispatcher = njit(self.signature(), cache=True, nogil=True)(
                        self.py_func)
        return self._dispatcher

    def cached(self) -> bool:
        """Whether numba's on-disk cache holds the kernel for this source (read from the
        cache's index, without loading numba's compiler); True when that cannot be told."""
        from sfg.util import internals

        index = None
        if not internals.forced():
            try:  # numba internals (sfg.util.internals): looked up and checked
                from numba.core.caching import FunctionCache

                index = FunctionCache(self.py_func)._cache_file._load_index()
            except Exception:  # noqa: BLE001 - a later numba, an uncachable function, an
                index = None  # unwritable cache…
        if internals.taken("cache-index", not isinstance(index, dict)):
            return True  # cannot tell: no helper
        return bool(index)

    def ahead(self) -> None:
        """Start compiling the kernel in a helper process if it is not cached (see the
        module docstring); returns at once."""
        with self._lock:
            if self._dispatcher is not None or self._helper is not None:
                return
            from numba.core import config

            if usable_cores() < 2 or config.DISABLE_JIT or self.cached():
                return
            module = self.py_func.__module__
            root = str(Path(importlib.import_module(module.split(".")[0]).__file__)
                       .resolve().parents[1])  # the folder holding the package
            path = os.environ.get("PYTHONPATH")
            env = dict(os.environ, PYTHONPATH=root if not path else root + os.pathsep + path)
            code = f"import {module} as m; m.{self.name}.get()"
            try:
                self._helper = subprocess.Popen([sys.executable, "-c", code], env=env,
                                                stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL)
            except OSError:  # no helper: this process compiles it when needed
                self._helper = None


_FIRST_CLASS: list = []


def first_class(dispatcher, signature):
    """``dispatcher``, compiled for ``signature``, as a first-class function argument of
    compiled code: an object of numba's wrapper address protocol holding the address of its C
    wrapper, looked up once (passing the dispatcher itself, numba looks it up at each call,
    about 50 µs, and calls past the C wrapper). The callee's exceptions do not propagate
    through the C wrapper: it reports them as unraisable and returns 0, which callers can test
    for.

    The address comes from numba's compile result (``cres.library``, ``cres.fndesc``: numba
    internals, :mod:`sfg.util.internals`). Where they are missing or give no address, or
    under ``SFG_PUBLIC_API=1``, the same function is compiled with ``numba.cfunc`` (public
    API: a C callback, which numba also takes as a first-class function) and passed as that:
    the same code behind the same C wrapper, so the same numbers and the same 0 on an
    exception; the cost is a second compile of the function on a cold cache."""
    from sfg.util import internals

    if not internals.forced():
        try:
            made = _first_class_type()(dispatcher, signature)
        except Exception:  # noqa: BLE001 - a later numba without these internals
            pass
        else:
            internals.taken("first-class-address", False)
            return made
    internals.taken("first-class-address", True)
    return _as_cfunc(dispatcher, signature)


def _as_cfunc(dispatcher, signature):
    """``dispatcher``'s Python function compiled by ``numba.cfunc`` for ``signature`` (cached
    on disk under its own name, ``<name>__cfunc``: numba's cache index does not tell a C
    callback from a jit function of the same name and signature)."""
    import types as pytypes

    from numba import cfunc

    py = dispatcher.py_func
    copy = pytypes.FunctionType(py.__code__, py.__globals__, f"{py.__name__}__cfunc",
                                py.__defaults__, py.__closure__)
    copy.__qualname__ = f"{py.__qualname__}__cfunc"
    copy.__module__ = py.__module__
    return cfunc(signature, cache=True, nogil=True)(copy)


def _first_class_type():
    """The wrapper-address class (made once); raises if numba's internals are not there."""
    if not _FIRST_CLASS:
        from numba.core import types
        from numba.extending import typeof_impl

        class FirstClass(types.WrapperAddressProtocol):
            def __init__(self, dispatcher, signature):
                self.dispatcher, self._signature = dispatcher, signature
                cres = dispatcher.get_compile_result(signature)
                address = cres.library.get_pointer_to_function(
                    cres.fndesc.llvm_cfunc_wrapper_name)
                if not isinstance(address, int) or address <= 0:
                    raise TypeError(f"no C wrapper address for {dispatcher}: {address!r}")
                self._address = address
                self.type = types.FunctionType(signature)

            def __wrapper_address__(self):
                return self._address

            def signature(self):
                return self._signature

        @typeof_impl.register(FirstClass)
        def _typeof(val, c):
            return val.type

        _FIRST_CLASS.append(FirstClass)
    return _FIRST_CLASS[0]
