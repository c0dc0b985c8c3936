"""Bit-identical numbers across CPUs, on request: ``SFG_REPRODUCIBLE=1``.

What is bit-identical where:

* **Same machine, same settings and seed: always** — every run, every backend, any number of
  processes (the suite checks it).
* **Across machines with different instruction sets** (this project's machines: AVX2 only
  and AVX-512): only with ``SFG_REPRODUCIBLE=1`` in the environment of the ``sfg`` process
  (or set before ``import sfg`` in a program of your own). It pins every numerical library to
  its baseline x86-64 code path, whatever the CPU offers, and fixes the thread count:

  ======================== ================================ ====================================
  library                  setting                          what it pins
  ======================== ================================ ====================================
  PyTorch (ATen kernels)   ``ATEN_CPU_CAPABILITY=default``  the vectorised kernels' width
  MKL (matrix products)    ``MKL_CBWR=COMPATIBLE,STRICT``   MKL's code branch; strict mode
                                                            makes gemm independent of threads
  oneDNN (convolutions)    ``ONEDNN_MAX_CPU_ISA=SSE41``     the JIT kernels' instruction set
  numba (the round, H)     ``NUMBA_CPU_NAME=generic``       code generated for any x86-64
  numpy (ufuncs)           ``NPY_DISABLE_CPU_FEATURES``     its AVX2/AVX-512 dispatch
  threads (torch, MKL)     ``OMP_NUM_THREADS``,             how reductions are split
                           ``MKL_NUM_THREADS``: 1, or
                           ``SFG_REPRODUCIBLE_THREADS``
  ======================== ================================ ====================================

  sfg's own kernels run on one intra-op thread each, on blocks of clients that depend on N
  only, so the thread count changes the speed, not the bits (tested).
  A variable already set in the environment is left as it is (so that it can be tested); the
  others are set before numpy, torch or numba load. Measured on this project's AVX2 machine:
  the default run gives the same bits under the switch whatever lower instruction set the
  process is otherwise restricted to, and different bits without it
  (``tests/test_reproducible.py``; the speed cost is in docs/reference/reproducibility.md).
* **Otherwise** (default, the fastest): results recorded on another CPU agree to float
  tolerance only — parameters to about 1e-6 relative after short runs (rounding differences
  of fused multiply-adds and vector widths, amplified by each local step), accuracies and
  metrics computed from them exactly unless a prediction sits within rounding of a tie.
"""

from __future__ import annotations

import os
import sys

#: the environment of the switch (see the module docstring)
SETTINGS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "NUMBA_CPU_NAME": "generic",
    # numpy 2.4's dispatch targets above its x86-64-v2 baseline, and older numpy's names
    "NPY_DISABLE_CPU_FEATURES": ("X86_V3 X86_V4 AVX512_ICL AVX512_SPR AVX AVX2 FMA3 F16C "
                                 "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX "
                                 "AVX512_CLX AVX512_CNL"),
}
SWITCH = "SFG_REPRODUCIBLE"
THREADS = "SFG_REPRODUCIBLE_THREADS"
_LOADED_TOO_EARLY = ("numpy", "torch", "numba")


def requested(environ=None) -> bool:
    """Whether ``SFG_REPRODUCIBLE`` asks for cross-CPU reproducibility (1/true/yes/on)."""
    env = os.environ if environ is None else environ
    return env.get(SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def threads(environ=None) -> str:
    """The fixed thread count of the switch (``SFG_REPRODUCIBLE_THREADS``, default 1); an
    unusable value gives 1 here (the ``sfg`` program reports it first: :func:`problem`)."""
    return "1" if problem(environ) else (os.environ if environ is None else environ).get(
        THREADS, "1").strip()


def problem(environ=None) -> str | None:
    """What is wrong with the switch's settings (one line), or None."""
    env = os.environ if environ is None else environ
    raw = env.get(THREADS, "1").strip()
    if not requested(env) or (raw.isdigit() and 1 <= int(raw) <= 256):
        return None
    return f"{THREADS}={raw!r} is no thread count; give a whole number from 1 to 256"


def apply(environ=None) -> list[str]:
    """Set the switch's environment (names it set, in order); a no-op unless :func:`requested`.

    Must run before numpy, torch or numba are imported: they read these settings once, when
    they load. Raises :class:`~sfg.errors.SfgError` if one of them is already loaded."""
    env = os.environ if environ is None else environ
    if not requested(env):
        return []
    loaded = [m for m in _LOADED_TOO_EARLY if m in sys.modules]
    if loaded and environ is None:
        from sfg.errors import SfgError

        raise SfgError(f"{SWITCH}=1 must be set before {', '.join(loaded)} is imported: set it "
                       "in the environment of the process (SFG_REPRODUCIBLE=1 sfg ...) or "
                       "before the first import in your program")
    done = []
    n = threads(env)
    for name, value in {**SETTINGS, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}.items():
        if name not in env:
            env[name] = value
            done.append(name)
    return done


def describe() -> dict:
    """The switch's state, for a run's metadata."""
    on = requested()
    return {"reproducible": on, **({"threads": int(threads())} if on else {})}
