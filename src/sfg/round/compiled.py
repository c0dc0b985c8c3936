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
        try:
            from numba.core.caching import FunctionCache

            return bool(FunctionCache(self.py_func)._cache_file._load_index())
        except Exception:  # noqa: BLE001 - an uncachable function, an unwritable cache…
            return True

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
    compiled code (numba's wrapper address protocol: the address of its C wrapper, looked up
    once; passing the dispatcher itself costs two symbol lookups per call, about 50 µs). The
    callee's exceptions do not propagate through the C wrapper: it reports them as unraisable
    and returns 0, which callers can test for."""
    if not _FIRST_CLASS:
        from numba.core import types
        from numba.core.types.function_type import WrapperAddressProtocol
        from numba.core.typing.typeof import typeof_impl

        class FirstClass(WrapperAddressProtocol):
            def __init__(self, dispatcher, signature):
                self.dispatcher, self._signature = dispatcher, signature
                cres = dispatcher.get_compile_result(signature)
                self._address = cres.library.get_pointer_to_function(
                    cres.fndesc.llvm_cfunc_wrapper_name)
                self.type = types.FunctionType(signature)

            def __wrapper_address__(self):
                return self._address

            def signature(self):
                return self._signature

        @typeof_impl.register(FirstClass)
        def _typeof(val, c):
            return val.type

        _FIRST_CLASS.append(FirstClass)
    return _FIRST_CLASS[0](dispatcher, signature)
