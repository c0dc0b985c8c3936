"""The machine a benchmark ran on, measured in the same run: every benchmark prints it first.

CPU model and cores (``/proc/cpuinfo``), the widest vector instructions the CPU has and the
ones torch and numpy use (they differ under ``ATEN_CPU_CAPABILITY``/``SFG_REPRODUCIBLE``), the
load average, and the fp32 matrix-product rate of torch on its default threads (a 1024² sgemm,
best of several): figures taken on machines whose matrix rates differ can then be compared.

    PYTHONPATH=src python benchmarks/machine.py        # print it alone
"""

from __future__ import annotations

import os
import platform
import time


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_vectors() -> str:
    """The widest vector extension the CPU reports: AVX-512, AVX2, AVX or SSE."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return "unknown"
    for name, flag in (("AVX-512", "avx512f"), ("AVX2", "avx2"), ("AVX", "avx")):
        if flag in flags:
            return name
    return "SSE"


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """fp32 GFLOP/s of one n×n @ n×n product on torch's default threads, best of ``repeats``."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def describe() -> dict:
    """The machine, as a dict (benchmarks with ``--json`` embed it)."""
    import numpy as np
    import torch

    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        numpy_isa = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)][-1:] or ["baseline"]
    except ImportError:  # older numpy
        numpy_isa = ["?"]
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_vectors": cpu_vectors(),
        "torch_isa": torch.backends.cpu.get_cpu_capability(),
        "numpy_isa": numpy_isa[0],
        "torch_threads": torch.get_num_threads(),
        "fp32_matmul_gflops": round(matmul_gflops(), 1),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "numpy": np.__version__,
        "torch": torch.__version__,
        "reproducible": os.environ.get("SFG_REPRODUCIBLE", "") not in ("", "0"),
    }


def banner() -> str:
    """One line naming the machine (printed at the top of every benchmark)."""
    d = describe()
    return (f"machine: {d['cpu']}, {d['cores']} cores, CPU {d['cpu_vectors']}, torch ISA "
            f"{d['torch_isa']} ({d['torch_threads']} threads), numpy ISA {d['numpy_isa']}, fp32 "
            f"matmul {d['fp32_matmul_gflops']:.0f} GFLOP/s, load {d['load_average']}"
            + (", SFG_REPRODUCIBLE=1" if d["reproducible"] else ""))


if __name__ == "__main__":
    print(banner())


def load() -> str:
    """The load average (1, 5, 15 min) as printed by the benchmarks."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def start(quick: bool = False) -> str:
    """Print the machine line and the load average at the start of a benchmark; returns the
    machine line (for the JSON)."""
    machine = banner()
    print(machine, flush=True)
    print(f"load average at start: {load()} ({os.cpu_count()} CPUs)" + (" — quick" if quick else ""))
    return machine
