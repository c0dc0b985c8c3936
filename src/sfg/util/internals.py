"""The private internals of other packages that sfg uses, every one of them.

A later numba or Python may change what is private without notice. Each use below with a
name is feature-tested where it is made — the internal is looked up, and
its answer checked, before sfg relies on it — and falls back to public API when the test
fails. A fallback changes the time a step takes, never a number: the tests run each use both
ways and compare the results (``tests/test_internals.py``).

* ``first-class-address`` (:mod:`sfg.round.compiled`): a compile result's C wrapper address
  (``cres.library``, ``cres.fndesc.llvm_cfunc_wrapper_name``), passed to compiled code as a
  first-class function. Fallback: the same function compiled by ``numba.cfunc`` (public API;
  the same code behind the same C wrapper; a second compile on a cold cache).
* ``cache-index`` (:mod:`sfg.round.compiled`): ``numba.core.caching.FunctionCache`` and its
  ``_cache_file._load_index()`` tell whether a kernel is in numba's on-disk cache. Fallback: "cached", so no helper process compiles ahead
  (a cold cache compiles in this process).
* ``blas-probe`` (:mod:`sfg.util.numba_start`): ``numba.np.linalg.ensure_blas`` answered while
  numba's array library loads. Fallback: numba's own probe (it imports scipy.linalg: ~0.13 s
  of a start).
* ``no-refcount`` (:mod:`sfg.util.numba_start`): numba's private ``_nrt=False`` compile
  option (its CPU target's ``_nrt``) on the compiled functions of peers chosen per exchange
  that allocate nothing, so that a call takes no reference counts of the arrays it is
  passed. Fallback: numba's reference counting (the same code otherwise; about a tenth of
  the clock's simulation under peers).
* ``fast-exit`` (:mod:`sfg.cli.console`): ``threading._shutdown`` and
  ``atexit._run_exitfuncs``, then ``os._exit``. Fallback: ``sys.exit`` (the interpreter's full
  teardown: ~0.6 s).
* ``clock-resolution`` (:mod:`sfg.net.simclock`): asyncio's ``BaseEventLoop._run_once`` reads
  the loop's ``_clock_resolution``, which the virtual loop sets. Fallback: the clock as it is
  up to 2^22 s; a run that would pass that stops with one error line (asyncio's own ~1 ns
  resolution no longer separates one instant from the next there).

Used without a switch, where no public spelling exists (a dependency that drops one fails
loudly where it is used, never with other numbers):

* ``torch.ops.aten._log_softmax_backward_data`` (:mod:`sfg.sim.backends`): the gradient of a
  log-softmax as autograd computes it, which the batched backend's hand-written backward of a
  linear chain (:func:`sfg.sim.backends.chain_grads`) calls so that its gradients are
  autograd's bit for bit. Looked up when the module is imported: a torch without it fails
  that import. No fallback.
* ``Tensor._version`` (:mod:`sfg.sim.backends`): torch's count of a tensor's in-place writes,
  part of the key under which the evaluation inputs are cached, so that an input written in
  place is not served from the cache. No fallback.
* ``numpy._core.multiarray._reconstruct``, ``numpy._core.multiarray.scalar`` and
  ``numpy._core.numeric._frombuffer`` (:mod:`sfg.world.data.safe_pickle`): the globals that a
  CIFAR archive's pickle names, the only ones its restricted unpickler resolves. Fallback:
  ``numpy.core`` (numpy 1.x, where they live).

``tests/test_internals.py`` scans the source for attributes, imports and ``getattr`` names
with a leading underscore that sfg does not define itself and fails on one not named here.

The virtual clock no longer reads asyncio's private timer heap (``_scheduled``,
``_timer_cancelled_count``, the handles' ``_when``): it keeps its own record of the loop's
timers through ``loop.call_at`` and the handles' public ``when()`` and ``cancelled()``.

``SFG_PUBLIC_API=1`` in the environment makes every use above take its fallback: the way out
if a dependency's upgrade breaks one in a way its feature test does not catch.
:func:`fallbacks` says which uses took their fallback in this process.
"""

from __future__ import annotations

import os

#: the uses of :data:`USES`' names made in this process -> True where the fallback was taken
_TAKEN: dict[str, bool] = {}

USES = ("first-class-address", "cache-index", "blas-probe", "no-refcount", "fast-exit",
        "clock-resolution")


def forced() -> bool:
    """Whether ``SFG_PUBLIC_API`` asks for every fallback (set, and not ``0``)."""
    return os.environ.get("SFG_PUBLIC_API", "").strip() not in ("", "0")


def taken(use: str, fallback: bool) -> bool:
    """Record that ``use`` took its fallback (``fallback``) or the internal; returns
    ``fallback``."""
    assert use in USES, use
    _TAKEN[use] = bool(fallback)
    return bool(fallback)


def fallbacks() -> list[str]:
    """The uses that took their fallback in this process, in :data:`USES` order."""
    return [u for u in USES if _TAKEN.get(u)]


def internals() -> list[str]:
    """The uses that relied on the internal in this process, in :data:`USES` order."""
    return [u for u in USES if _TAKEN.get(u) is False]
