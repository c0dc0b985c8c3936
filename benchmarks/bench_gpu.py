"""The CUDA path checked and measured in one call: prints ONE JSON line.

    PYTHONPATH=src python benchmarks/bench_gpu.py            # on a CUDA machine, <= 8 minutes
    PYTHONPATH=src python benchmarks/bench_gpu.py --smoke    # anywhere (CPU): tiny sizes, ~30 s

Parts (keys of the JSON line), in this order; each is a dict, ``{"error": "..."}`` when it
broke, or the string ``"skipped: <why>"`` (CUDA-only parts on a machine without CUDA, parts
that no longer fit ``--budget``):

* ``tests`` -- the CUDA test subset: ``tests/test_backends_device.py`` (the fused backends
  equal the loop, on one device) run by pytest with ``SFG_TEST_DEVICE=cuda``. The tests are
  run, not copied: pytest reports each one, and nothing is skipped there (a missing device
  fails them). ``--smoke``: the same file on the CPU, the small CNN's cases only.
* ``matmul`` -- the device's measured matrix rates (TF32 and bf16 on CUDA; fp32 on the CPU).
* ``fused_vs_loop`` -- client-steps/s of ``loop``, ``vmap`` and ``batched`` on the paper CNN
  (N = 100 clients, K = 10, B = 32, 3×32×32), the best fused backend in tf32 and bf16 too,
  the ratio to the loop and the fraction of the matrix rate reached.
* ``paper`` -- the paper's CIFAR-10 run, N = 100, T = 300, K = 10, bursty u = 0.8, for
  sfg-cut and dfedavg, on the fastest backend of ``fused_vs_loop``, fp32. CIFAR-10 is read by
  sfg's own loader from a synthetic archive of the real format and shape written here
  (50,000 + 10,000 images, 3×32×32, class templates plus noise) unless ``--data-root``
  names the real one. Seconds, accuracy, client-steps/s, the fraction of the matrix rate
  reached and the peak GPU memory.
* ``grid`` -- four runs sharing one GPU: through the Ray executor with ``gpus_per_run=0.25``
  where Ray and pydantic are importable (the grid machinery needs both), else as four
  processes on the device; throughput of the four against one run alone.

The device machine has no pydantic, so no part imports it: runs go through
``sfg.sim.run.simulate(cfg, validated=True)`` with configs built from
``bench_gpu_config.json`` (``resolve_config``'s output, made where pydantic is installed:
``python benchmarks/bench_gpu.py --write-config``; tests/test_bench_gpu.py checks it is
current and that every config the script builds validates to itself).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG = HERE / "bench_gpu_config.json"
RULES = ("sfg-cut", "dfedavg")
BLOCKED = ("pydantic", "cryptography")  # absent on the device machine
PARTS = ("tests", "matmul", "fused_vs_loop", "paper", "grid")


# ----------------------------------------------------------------------------- configs
def base_config() -> dict[str, Any]:
    """The resolved default run (``bench_gpu_config.json``)."""
    return dict(json.loads(CONFIG.read_text())["base"])


def config(**over: Any) -> dict[str, Any]:
    """The base run with ``over`` (existing keys only: a typo is an error, not a new key)."""
    c = base_config()
    unknown = sorted(set(over) - set(c))
    if unknown:
        raise KeyError(f"not run settings: {unknown}")
    c.update(over)
    return c


def sizes(smoke: bool) -> dict[str, int]:
    """N, T, K, B of the paper run (and the grid's T) at full size or for --smoke."""
    if smoke:
        return dict(N=8, T=4, K=2, B=8, grid_T=2, eval_every=2)
    return dict(N=100, T=300, K=10, B=32, grid_T=50, eval_every=10)


def plan(smoke: bool, device: str, data_root: str, backend: str = "batched"
         ) -> dict[str, list[dict[str, Any]]]:
    """Every run config the script makes: ``paper`` (one per rule) and ``grid`` (four)."""
    s = sizes(smoke)
    common = dict(dataset="cifar10", data_root=data_root, model="cnn",
                  process="bursty:u=0.8", n_clients=s["N"], local_steps=s["K"],
                  batch_size=s["B"], eval_every=s["eval_every"], device=device,
                  backend=backend)
    if smoke:  # bursty u = 0.8 and knn:k=6 need more clients and rounds than a smoke run has
        common.update(process="iid:u=0.5", graph="ring:k=1")
    paper = [config(**common, rounds=s["T"], rule=r, seed=1) for r in RULES]
    grid = [config(**common, rounds=s["grid_T"], rule=RULES[i % 2], seed=1 + i // 2)
            for i in range(4)]
    return {"paper": paper, "grid": grid}


# ----------------------------------------------------------------------------- data
def write_synthetic_cifar10(root: Path, *, train_per_class: int, test_per_class: int,
                            seed: int = 0) -> Path:
    """A ``cifar-10-batches-py`` of the real format (5 train batches, a test batch, uint8
    3×32×32 rows) whose images are a smooth per-class template plus noise, so that a model
    can learn something. Returns ``root``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (10, 3, 4, 4))
    templates = coarse.repeat(8, axis=2).repeat(8, axis=3).reshape(10, 3072)

    def batch(n_per_class: int, tag: int) -> dict:
        labels = np.tile(np.arange(10), n_per_class)
        rng.shuffle(labels)
        noise = rng.normal(0, 60, (labels.size, 3072))
        data = np.clip(templates[labels] + noise, 0, 255).astype(np.uint8)
        return {b"batch_label": f"synthetic {tag}".encode(), b"labels": labels.tolist(),
                b"data": data}

    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    per_batch = max(1, train_per_class // 5)
    for i in range(1, 6):
        (d / f"data_batch_{i}").write_bytes(pickle.dumps(batch(per_batch, i), protocol=2))
    (d / "test_batch").write_bytes(pickle.dumps(batch(test_per_class, 9), protocol=2))
    names = [n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer", "dog",
                                  "frog", "horse", "ship", "truck")]
    (d / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}, protocol=2))
    return root


# ----------------------------------------------------------------------------- parts
def _sync(torch: Any, device: Any) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def part_tests(device: str, smoke: bool, budget_s: float) -> dict[str, Any]:
    """pytest on tests/test_backends_device.py with SFG_TEST_DEVICE=device."""
    env = {**os.environ, "SFG_TEST_DEVICE": device,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           str(ROOT / "tests" / "test_backends_device.py")]
    if smoke:
        cmd += ["-k", "small-cnn"]
    t0 = time.perf_counter()
    try:
        got = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=budget_s)
    except subprocess.TimeoutExpired:
        return {"error": f"pytest ran past {budget_s:.0f} s", "device": device}
    out = got.stdout + got.stderr
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", out)}
    failed = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return {"device": device, "rc": got.returncode, "passed": counts.get("passed", 0),
            "failed": counts.get("failed", 0) + counts.get("error", 0),
            "skipped": counts.get("skipped", 0), "failures": failed[:10],
            "seconds": round(time.perf_counter() - t0, 1)}


def matmul_rate(device: str, dtype_name: str, size: int, repeats: int) -> float:
    """TFLOP/s of a square matrix product (fp32 under ``tf32``'s switches for ``tf32``)."""
    import torch
    from bench_backends import best_time

    from sfg.sim.precision import device_precision

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    with device_precision("tf32" if dtype_name == "tf32" else "fp32", device):
        best = best_time(lambda: a @ b, repeats, torch.device(device))
    return 2 * size**3 / best / 1e12


def part_matmul(device: str, smoke: bool) -> dict[str, Any]:
    if device.startswith("cuda"):
        return {"tf32_tflops": round(matmul_rate(device, "tf32", 8192, 10), 1),
                "bf16_tflops": round(matmul_rate(device, "bf16", 8192, 10), 1),
                "fp32_tflops": round(matmul_rate(device, "fp32", 8192, 5), 1)}
    return {"fp32_tflops": round(matmul_rate(device, "fp32", 1024 if smoke else 2048, 3), 4),
            "tf32_tflops": "skipped: no CUDA", "bf16_tflops": "skipped: no CUDA"}


def _reference_rate(matmul: dict[str, Any], precision: str) -> float | None:
    """The matrix rate a training in ``precision`` is measured against (TF32 for fp32 and
    tf32 on CUDA, bf16 for bf16; the fp32 rate on the CPU)."""
    key = "bf16_tflops" if precision == "bf16" else "tf32_tflops"
    rate = matmul.get(key)
    if not isinstance(rate, float):
        rate = matmul.get("fp32_tflops")
    return rate if isinstance(rate, float) and rate > 0 else None


def part_fused_vs_loop(device: str, smoke: bool, matmul: dict[str, Any]) -> dict[str, Any]:
    import torch
    from bench_backends import best_time, step_flops

    from sfg.sim.backends import forward_macs, make_backend
    from sfg.sim.params import init_params
    from sfg.world.models import make_model

    s = sizes(smoke)
    n, K, B = (4, 2, 8) if smoke else (s["N"], s["K"], s["B"])

    def factory():
        return make_model("cnn", input_shape=(3, 32, 32), num_classes=10)

    gen = torch.Generator().manual_seed(0)
    P = init_params(factory, n, seed=0).to(device)
    xs = torch.randn(n, K, B, 3, 32, 32, generator=gen).to(device)
    ys = torch.randint(0, 10, (n, K, B), generator=gen).to(device)
    flops = step_flops(forward_macs(factory()), B)
    kw = dict(lr=0.05, weight_decay=5e-4)
    rates: dict[str, float] = {}
    runs = [(b, "fp32") for b in ("loop", "vmap", "batched")]
    for name, precision in runs:
        be = make_backend(name, factory(), device=device, precision=precision)
        rates[name] = n * K / best_time(lambda be=be: be.train(P, xs, ys, **kw),
                                        1 if smoke else 2, torch.device(device))
    best = max(("vmap", "batched"), key=lambda b: rates[b])
    for precision in ("tf32", "bf16"):
        be = make_backend(best, factory(), device=device, precision=precision)
        rates[f"{best}/{precision}"] = n * K / best_time(
            lambda be=be: be.train(P, xs, ys, **kw), 1 if smoke else 2, torch.device(device))
    out: dict[str, Any] = {"clients": n, "K": K, "B": B, "step_gflop": round(flops / 1e9, 3),
                           "client_steps_per_s": {k: round(v, 1) for k, v in rates.items()},
                           "best_fused": best, "fused_over_loop": round(rates[best] /
                                                                        rates["loop"], 2)}
    for key, rate in rates.items():
        ref = _reference_rate(matmul, key.split("/")[1] if "/" in key else "fp32")
        if ref is not None:
            out.setdefault("fraction_of_matmul_rate", {})[key] = round(
                rate * flops / 1e12 / ref, 4)
    return out


def part_paper(configs: list[dict[str, Any]], matmul: dict[str, Any], device: str,
               deadline: float) -> dict[str, Any]:
    import torch
    from bench_backends import step_flops

    from sfg.sim.backends import forward_macs
    from sfg.sim.run import simulate
    from sfg.world.models import make_model

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    flops = step_flops(forward_macs(make_model("cnn", input_shape=(3, 32, 32),
                                               num_classes=10)), configs[0]["batch_size"])
    ref = _reference_rate(matmul, configs[0]["precision"])
    out: dict[str, Any] = {"N": configs[0]["n_clients"], "T": configs[0]["rounds"],
                           "K": configs[0]["local_steps"], "process": configs[0]["process"],
                           "backend": configs[0]["backend"], "runs": {}}
    last = 0.0
    for c in configs:
        if time.perf_counter() + last > deadline:
            out["runs"][c["rule"]] = "skipped: time budget"
            continue
        t0 = time.perf_counter()
        res = simulate(c, validated=True)
        last = time.perf_counter() - t0
        steps = res.meta["client_steps"]
        row = {"seconds": round(last, 1), "acc_mean": round(res.metrics["acc_mean"], 4),
               "acc_p10": round(res.metrics["acc_p10"], 4), "client_steps": steps,
               "client_steps_per_s": round(steps / last, 1), "backend": res.meta["backend"]}
        if ref is not None:
            row["fraction_of_matmul_rate"] = round(steps * flops / last / 1e12 / ref, 4)
        out["runs"][c["rule"]] = row
    done = [r for r in out["runs"].values() if isinstance(r, dict)]
    if len(done) == 2:
        out["sfg_cut_gain"] = round(done[0]["acc_mean"] - done[1]["acc_mean"], 4)
    out["peak_gpu_memory_gib"] = (round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda
                                  else "skipped: no CUDA")
    return out


def _have(name: str) -> bool:
    """Whether ``name`` imports here (a module blocked by ``sys.modules[name] = None`` does
    not)."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _one_run(c: dict[str, Any]) -> dict[str, Any]:
    """A grid run in a child process (the processes' variant of the grid)."""
    from sfg.sim.run import simulate

    t0 = time.perf_counter()
    res = simulate(c, validated=True)
    return {"seconds": time.perf_counter() - t0, "client_steps": res.meta["client_steps"],
            "acc_mean": res.metrics["acc_mean"]}


def part_grid(configs: list[dict[str, Any]], device: str, workdir: Path) -> dict[str, Any]:
    from sfg.sim.run import simulate

    t0 = time.perf_counter()
    alone = simulate(configs[0], validated=True)
    t_alone = time.perf_counter() - t0
    out: dict[str, Any] = {"runs": len(configs), "rounds": configs[0]["rounds"],
                           "one_run_seconds": round(t_alone, 1)}
    missing = [m for m in ("ray", "pydantic") if not _have(m)]
    t0 = time.perf_counter()
    if not missing:
        out["via"] = "ray executor, gpus_per_run=0.25"
        out.update(_grid_ray(configs, device, workdir))
    else:
        import multiprocessing as mp

        out["via"] = f"4 processes on {device} ({' and '.join(missing)} not installed here)"
        out["ray"] = f"skipped: {' and '.join(missing)} not installed"
        with mp.get_context("spawn").Pool(len(configs)) as pool:
            got = pool.map(_one_run, configs)
        out["failed"] = 0
        out["done"] = len(got)
    wall = time.perf_counter() - t0
    out["grid_seconds"] = round(wall, 1)
    out["throughput_over_one_run"] = round(len(configs) * t_alone / wall, 2)
    out["one_run_client_steps"] = alone.meta["client_steps"]
    return out


def _grid_ray(configs: list[dict[str, Any]], device: str, workdir: Path) -> dict[str, Any]:
    import ray

    from sfg.experiments.config import make_config
    from sfg.experiments.executors import run_grid

    cuda = device.startswith("cuda")
    # off CUDA a logical GPU stands in, so the fractional requests are scheduled all the same
    ray.init(num_gpus=None if cuda else 1, num_cpus=None if cuda else 2,
             include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT / "src")}})
    try:
        summary = run_grid([make_config(c) for c in configs], workdir / "grid.sqlite",
                           executor="ray", gpus_per_run=0.25,
                           cpus_per_run=1.0 if cuda else 0.5)
    finally:
        ray.shutdown()
    return {"done": summary.done, "failed": summary.failed,
            "failures": [e for _, e in summary.failures][:4]}


# ----------------------------------------------------------------------------- main
def _guard(fn, *args: Any) -> Any:
    """A part's result, or ``{"error": one line}``."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - every part reports, the others still run
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (or --device)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all parts")
    ap.add_argument("--data-root", default=None, help="real CIFAR-10 (default: synthetic)")
    ap.add_argument("--out", default=None, help="also write the JSON line to this file")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    ap.add_argument("--write-config", action="store_true",
                    help="rewrite bench_gpu_config.json from the run schema (needs pydantic)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.write_config:
        from sfg.sim.run import resolve_config

        CONFIG.write_text(json.dumps({"base": resolve_config({})}, indent=1, sort_keys=True)
                          + "\n")
        return {}
    import torch

    t_start = time.perf_counter()
    deadline = t_start + args.budget
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    result: dict[str, Any] = {
        "bench": "bench_gpu", "smoke": args.smoke, "device": device,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__, "python": sys.version.split()[0]}
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    result.update(dict.fromkeys(PARTS, "skipped: not selected (--parts)"))
    with tempfile.TemporaryDirectory(prefix="sfg-bench-gpu-") as tmp:
        work = Path(tmp)
        if "tests" in parts:
            result["tests"] = _guard(part_tests, device, args.smoke, max(60.0, args.budget / 4))
        matmul: dict[str, Any] = {}
        if "matmul" in parts:
            result["matmul"] = matmul = _guard(part_matmul, device, args.smoke)
        backend = "batched"
        if "fused_vs_loop" in parts:
            fused = result["fused_vs_loop"] = _guard(part_fused_vs_loop, device, args.smoke,
                                                     matmul)
            backend = fused.get("best_fused", backend)
        root = args.data_root
        if root is None and {"paper", "grid"} & set(parts):
            per = (40, 20) if args.smoke else (5000, 1000)
            root = str(write_synthetic_cifar10(work / "cifar", train_per_class=per[0],
                                               test_per_class=per[1]))
        runs = plan(args.smoke, device, root or "", backend)
        if "paper" in parts:
            result["paper"] = _guard(part_paper, runs["paper"], matmul, device, deadline - 60)
        if "grid" in parts:
            result["grid"] = ("skipped: time budget" if time.perf_counter() > deadline - 60
                              else _guard(part_grid, runs["grid"], device, work))
    result["host_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        / 1024, 1)
    result["loaded"] = sorted(m for m in BLOCKED if sys.modules.get(m) is not None)
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    line = json.dumps(result, sort_keys=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)
    return result


if __name__ == "__main__":
    main()
