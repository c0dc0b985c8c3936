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

**Fresh caches** (:func:`fresh_caches`). numba's on-disk cache (``cache=True``) is keyed by the
text of the one file a function is written in; a compiled function that calls a compiled
function of another file keeps the callee's old code after that file alone changes (an
upgrade, a ``git pull`` in a checkout). So before sfg compiles or loads anything, the text of
every sfg file whose functions numba caches (:data:`COMPILED`) is hashed (about 1 ms), and
when that hash differs from the one written beside the cache (``__pycache__/sfg-compiled``),
sfg's cached machine code there is removed: what changed anywhere is compiled afresh. Where
``NUMBA_CACHE_DIR`` moves numba's cache elsewhere, or the package's folders cannot be written
(numba then caches under the user's cache folder), nothing is removed: remove that cache by
hand after an upgrade.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path


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


#: the files (relative to the sfg package) whose functions numba compiles with ``cache=True``
#: (tests/test_numba_start.py checks the list against the source)
COMPILED = (
    "clock/assemble.py", "clock/events.py", "clock/peersim.py", "clock/pull.py",
    "clock/schedule.py", "clock/train.py", "modelfree/horizon.py", "round/attacks.py",
    "round/compiled.py", "round/defences.py", "round/kernel.py", "round/rules/__init__.py",
    "round/rules/library.py", "round/staleness.py", "sim/gossip.py", "world/locate.py",
    "world/peers.py",
)
STAMP = "sfg-compiled"  # the hash of COMPILED's text, beside the cached code it was made from


def sources_digest(root: Path, files=COMPILED) -> str:
    """A hash of the text of ``files`` under ``root`` (a missing file counts as empty)."""
    h = hashlib.sha256()
    for rel in files:
        try:
            text = (root / rel).read_bytes()
        except OSError:
            text = b""
        h.update(rel.encode() + b"\0" + hashlib.sha256(text).digest())
    return h.hexdigest()[:32]


def fresh_caches(root: Path | None = None, files=COMPILED) -> list[Path]:
    """Remove numba's cached code (``*.nbi``, ``*.nbc``) from the ``__pycache__`` folders
    beside ``files`` (under ``root``, default this sfg package) when the text of ``files``
    changed since it was cached (see the module docstring); returns the folders cleared.
    Best effort: a folder that cannot be read or written is left as it is."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return []  # numba caches elsewhere: nothing here to keep fresh
    root = Path(__file__).resolve().parent.parent if root is None else Path(root)
    digest = sources_digest(root, files)
    cleared = []
    for folder in sorted({(root / rel).parent / "__pycache__" for rel in files}):
        stamp = folder / STAMP
        try:
            if stamp.read_text(encoding="ascii").strip() == digest:
                continue
        except (OSError, UnicodeDecodeError):
            pass
        try:
            folder.mkdir(exist_ok=True)  # (numba would make it to cache there)
            for f in [*folder.glob("*.nbi"), *folder.glob("*.nbc")]:
                f.unlink(missing_ok=True)
            tmp = folder / f"{STAMP}.{os.getpid()}.tmp"
            tmp.write_text(digest + "\n", encoding="ascii")
            os.replace(tmp, stamp)
        except OSError:
            continue
        cleared.append(folder)
    return cleared


def _no_refcount() -> dict[str, bool]:
    """The ``njit`` options of compiled functions that allocate nothing and run once per
    send or message heard (:mod:`sfg.world.peers`, :mod:`sfg.clock.peersim`): numba's
    private ``_nrt=False`` (no reference counts taken of the arrays they are passed, about a
    tenth of the clock's simulation under peers), where numba's CPU target has it
    (:mod:`sfg.util.internals`, ``no-refcount``); otherwise, and under ``SFG_PUBLIC_API=1``,
    none (numba counts references: the same numbers, slower)."""
    from sfg.util import internals

    if internals.forced():
        internals.taken("no-refcount", True)
        return {}
    from numba.core.cpu import CPUTargetOptions

    if internals.taken("no-refcount", not hasattr(CPUTargetOptions, "_nrt")):
        return {}
    return {"_nrt": False}


_answer_blas_probe()
fresh_caches()
#: ``njit(**NO_REFCOUNT)``: see :func:`_no_refcount`
NO_REFCOUNT = _no_refcount()

from numba import njit  # noqa: E402 - after the probe

__all__ = ["NO_REFCOUNT", "njit"]
