"""numba as sfg starts it: ``njit``, with numba's BLAS probe answered without loading scipy.

numba's array library (``numba.np.arraymath``), loaded at the first compile or cache load of
the process, probes for BLAS when it is imported, by importing ``scipy.linalg.cython_blas`` —
which loads all of ``scipy.linalg`` (and ``numpy.f2py``, through scipy's array-API layer):
about 0.13 s of every ``sfg replay``, cold cache or warm (``benchmarks/bench_startup.py``).
sfg's compiled code calls no BLAS (no ``np.dot`` inside ``njit``), and scipy is one of sfg's
dependencies, so the probe's answer is known: it is answered "available" without the import,
and numba's real check (``numba.np.linalg.ensure_blas``, restored at once) still runs when a
compiled ``np.dot`` or ``np.linalg`` call is typed, in sfg or in a user's own code
(``tests/test_startup.py``). Every sfg module that compiles imports ``njit`` from here.

``ensure_blas`` is a numba internal (:mod:`sfg.util.internals`, ``blas-probe``): it is
answered only where it is there, a plain function of no arguments; otherwise, and under
``SFG_PUBLIC_API=1``, numba runs its own probe (the same compiled code, a slower start).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys


def _probe_answerable(linalg) -> bool:
    """Whether ``linalg.ensure_blas`` is what sfg answers: a function of no arguments."""
    real = getattr(linalg, "ensure_blas", None)
    if not inspect.isfunction(real):
        return False
    try:
        return not inspect.signature(real).parameters
    except (TypeError, ValueError):
        return False


def _answer_blas_probe() -> None:
    if "numba.np.arraymath" in sys.modules or importlib.util.find_spec("scipy") is None:
        return  # already probed, or no scipy: numba's own probe decides
    from sfg.util import internals

    if internals.forced():
        internals.taken("blas-probe", True)
        return
    import numba.np.linalg as linalg

    if internals.taken("blas-probe", not _probe_answerable(linalg)):
        return  # a later numba: its own probe runs
    real = linalg.ensure_blas
    linalg.ensure_blas = lambda: None
    try:
        import numba.np.arraymath  # noqa: F401 - probes once, at import
    finally:
        linalg.ensure_blas = real


_answer_blas_probe()

from numba import njit  # noqa: E402 - after the probe

__all__ = ["njit"]
