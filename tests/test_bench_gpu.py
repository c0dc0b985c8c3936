"""benchmarks/bench_gpu.py, the device script, runs on the CPU too (``--smoke``).

The device machine has no pydantic or cryptography: the smoke run blocks both
(``sys.modules[name] = None`` makes any import of them fail) and must still finish every part,
the grid then as four processes. The Ray executor's variant of the grid (fractional GPUs,
``gpus_per_run=0.25`` on a logical GPU) runs where Ray and pydantic are installed, as here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"
PARTS = ("tests", "matmul", "fused_vs_loop", "paper", "grid")


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_smoke(*args: str, block: tuple[str, ...] = ()) -> dict:
    code = ("import runpy, sys\n"
            f"for m in {block!r}: sys.modules[m] = None\n"
            f"sys.argv = [{str(SCRIPT)!r}, '--smoke', *{list(args)!r}]\n"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RAY_AUTH_MODE": "disabled"}
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stdout.strip().splitlines()
    assert len(lines) == 1, got.stdout[-2000:]  # ONE JSON line
    return json.loads(lines[0])


def test_smoke_runs_every_part_without_pydantic_or_cryptography():
    res = run_smoke(block=("pydantic", "cryptography"))
    assert set(PARTS) | {"device", "device_name", "smoke", "seconds", "loaded",
                         "host_peak_rss_mib", "torch"} <= set(res)
    assert res["loaded"] == [] and res["device"] == "cpu" and res["smoke"] is True
    for part in PARTS:
        assert isinstance(res[part], dict) and "error" not in res[part], (part, res[part])
    t = res["tests"]
    assert t["rc"] == 0 and t["passed"] >= 2 and t["failed"] == 0 and t["skipped"] == 0
    m = res["matmul"]
    assert m["fp32_tflops"] > 0
    assert m["tf32_tflops"] == m["bf16_tflops"] == "skipped: no CUDA"
    f = res["fused_vs_loop"]
    assert set(f["client_steps_per_s"]) == {"loop", "vmap", "batched", f"{f['best_fused']}/tf32",
                                            f"{f['best_fused']}/bf16"}
    assert all(v > 0 for v in f["client_steps_per_s"].values())
    assert all(v > 0 for v in f["fraction_of_matmul_rate"].values())
    p = res["paper"]
    assert set(p["runs"]) == {"sfg-cut", "dfedavg"} and p["backend"] == f["best_fused"]
    for row in p["runs"].values():
        assert row["client_steps"] > 0 and 0 <= row["acc_mean"] <= 1 and row["seconds"] > 0
    assert p["peak_gpu_memory_gib"] == "skipped: no CUDA"
    g = res["grid"]
    assert g["via"].startswith("4 processes on cpu") and g["done"] == 4
    assert g["ray"].startswith("skipped:") and g["throughput_over_one_run"] > 0


def test_smoke_grid_through_the_ray_executor_with_quarter_gpus():
    pytest.importorskip("ray")  # the [ray] extra; installed in the development environment
    res = run_smoke("--parts", "grid")
    g = res["grid"]
    assert g.get("via") == "ray executor, gpus_per_run=0.25", g
    assert g["done"] == 4 and g["failed"] == 0
    assert res["tests"] == "skipped: not selected (--parts)"


def test_frozen_config_is_current_and_every_planned_run_validates_to_itself():
    from sfg.sim.run import resolve_config

    bench = bench_module()
    assert bench.base_config() == resolve_config({}), \
        "stale: run `PYTHONPATH=src python benchmarks/bench_gpu.py --write-config`"
    for smoke in (True, False):
        for device in ("cpu", "cuda"):
            runs = bench.plan(smoke, device, "/data/cifar", "vmap")
            assert len(runs["paper"]) == 2 and len(runs["grid"]) == 4
            for c in runs["paper"] + runs["grid"]:
                assert resolve_config(c) == c
    full = bench.plan(False, "cuda", "/data", "batched")["paper"]
    assert {(c["n_clients"], c["rounds"], c["local_steps"], c["process"], c["model"],
             c["dataset"]) for c in full} == {(100, 300, 10, "bursty:u=0.8", "cnn", "cifar10")}
    assert [c["rule"] for c in full] == ["sfg-cut", "dfedavg"]
    with pytest.raises(KeyError, match="not run settings"):
        bench.config(n_client=3)


def test_synthetic_cifar10_is_read_by_the_real_loader(tmp_path):
    from sfg.world.data import load_federated

    root = bench_module().write_synthetic_cifar10(tmp_path, train_per_class=30,
                                                  test_per_class=10)
    data = load_federated("cifar10", n_clients=4, seed=1, data_root=str(root), alpha=0.3)
    assert tuple(data.input_shape) == (3, 32, 32) and data.num_classes == 10
    assert sum(len(y) for y in data.train_y) > 0
