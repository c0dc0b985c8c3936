"""Local-training throughput of every backend (docs/concepts/training.md#the-training-protocol), side by side with a plain loop.

For each model, n clients (default 100) each run K SGD steps on batches of 32; the table
shows client-steps per second per backend, the ratio to a straightforward per-client loop
(an ``nn.Module`` and a ``torch.optim.SGD`` per client, NCHW inputs), and which backend
``auto`` picks. For the paper CNN it also reports the achieved GFLOP/s of a local step
(forward + backward ≈ 3 × 2 × forward MACs per example) as a fraction of this machine's fp32
matmul peak, measured in the same run with a large ``torch.mm``.

    .venv/bin/python benchmarks/bench_backends.py            # full: K = 10 (docs/concepts/training.md#the-training-protocol), ~5 min
    .venv/bin/python benchmarks/bench_backends.py --quick    # K = 2: ~1 minute
    .venv/bin/python benchmarks/bench_backends.py --device cuda --clients 100

Timings are the best of ``--repeats`` runs after one warm-up, interleaved across contenders,
which damps the noise of a shared machine; the load average is printed alongside.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from machine import banner

from sfg.sim.backends import auto_choice, forward_macs, make_backend
from sfg.sim.params import ParamSpec, init_params, load_flat
from sfg.world.models import make_model

MODELS = [  # (label, model, input_shape, classes)
    ("mlp 8×8 digits", "mlp", (64,), 10),
    ("small-cnn 8×8", "small-cnn", (1, 8, 8), 10),
    ("small-cnn 28×28", "small-cnn", (1, 28, 28), 62),
    ("paper cnn 32×32×3", "cnn", (3, 32, 32), 10),
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def best_time(fn, repeats: int, device: torch.device, warmup=None) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call (``warmup`` or ``fn``)."""
    (warmup or fn)()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def step_flops(macs: int, batch: int) -> int:
    """FLOPs of one client's local step: forward + backward ≈ 3 × 2 × forward MACs per
    example, times the batch."""
    return 3 * 2 * macs * batch


def matmul_peak(device: torch.device, size: int, repeats: int) -> float:
    """fp32 GFLOP/s of a large square ``torch.mm``."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    return 2 * size**3 / best_time(lambda: a @ b, repeats, device) / 1e9


def plain_loop(model, params, xs, ys, *, lr, weight_decay):
    """The reference: one nn.Module + torch.optim.SGD per client, NCHW inputs."""
    out = []
    for i in range(params.shape[0]):
        load_flat(model, params[i])
        opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)
        for k in range(xs.shape[1]):
            opt.zero_grad()
            F.cross_entropy(model(xs[i, k]), ys[i, k]).backward()
            opt.step()
        out.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return torch.stack(out)


def bench_model(label, name, shape, classes, *, n, K, B, repeats, device, backends):
    """Client-steps/s of the plain loop and each backend; repeats are interleaved (A B C A B C)
    so that a burst of load from other processes does not land on one contender only."""
    factory = lambda: make_model(name, input_shape=shape, num_classes=classes)  # noqa: E731
    model = factory()
    spec = ParamSpec.from_module(model)
    gen = torch.Generator().manual_seed(0)
    params = init_params(factory, n, seed=0).to(device)
    xs = torch.randn(n, K, B, *shape, generator=gen).to(device)
    ys = torch.randint(0, classes, (n, K, B), generator=gen).to(device)
    kw = dict(lr=0.05, weight_decay=5e-4)
    ref_model = factory().to(device)
    # the plain loop is slow; time it on a subset of clients (per-client cost is independent)
    m_ref = min(n, max(4, n // 5))
    contenders = {"plain loop (reference)": (
        lambda: plain_loop(ref_model, params[:m_ref], xs[:m_ref], ys[:m_ref], **kw),
        lambda: plain_loop(ref_model, params[:2], xs[:2, :1], ys[:2, :1], **kw),
        m_ref * K)}
    failed = {}
    for bname in backends:
        try:
            backend = make_backend(bname, model, device=device)
        except ValueError as exc:
            failed[bname] = str(exc)
            continue
        contenders[bname] = (lambda b=backend: b.train(params, xs, ys, **kw),
                             lambda b=backend: b.train(params, xs[:, :1], ys[:, :1], **kw),
                             n * K)
    for _, warmup, _ in contenders.values():
        warmup()
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(repeats):
        for cname, (fn, _, _) in contenders.items():
            best[cname] = min(best[cname], best_time(fn, 1, device, warmup=lambda: None))
    rates = {cname: contenders[cname][2] / best[cname] for cname in contenders}
    ref_rate = rates["plain loop (reference)"]
    rows = [(cname, rate, rate / ref_rate) for cname, rate in rates.items()]
    rows += [(bname, None, msg) for bname, msg in failed.items()]
    choice = auto_choice(model, device)
    chosen = next(r for r in rows if r[0] == choice)
    rows.append((f"auto (= {choice})", chosen[1], chosen[2]))
    macs = forward_macs(model.to(device))
    return dict(label=label, D=spec.D, rows=rows, auto=choice, macs=macs, B=B)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="K = 2 local steps (~1 minute)")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=None, help="local steps K per call")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="all", help="comma-separated labels' model names")
    args = ap.parse_args()
    print(banner(), flush=True)
    device = torch.device(args.device)
    K = args.steps or (2 if args.quick else 10)
    repeats = args.repeats or 2
    backends = ["loop", "vmap", "batched"]

    peak = matmul_peak(device, 4096, 4)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"fp32 matmul peak {peak:.1f} GFLOP/s; load average {load:.1f} on "
          f"{os.cpu_count()} CPUs")
    if load > 1.0 and device.type == "cpu":
        print("note: other processes are using the CPU; multi-threaded kernels (the plain loop) "
              "suffer most, so ratios are inflated")
    print(f"n = {args.clients} clients, K = {K} steps, batch {args.batch}; client-steps/s "
          "(ratio to the plain per-client loop)\n")
    wanted = None if args.models == "all" else set(args.models.split(","))
    results = []
    for label, name, shape, classes in MODELS:
        if wanted and name not in wanted:
            continue
        res = bench_model(label, name, shape, classes, n=args.clients, K=K, B=args.batch,
                          repeats=repeats, device=device, backends=backends)
        results.append(res)
        print(f"{label}  (D = {res['D']:,}, {res['macs']:,} MACs/example; auto -> {res['auto']})")
        for bname, rate, ratio in res["rows"]:
            if rate is None:
                print(f"    {bname:<24} n/a ({ratio[:70]})")
            else:
                print(f"    {bname:<24} {rate:10.1f} steps/s   {ratio:6.2f}×")
        if name == "cnn":
            flops = step_flops(res["macs"], res["B"])
            best = max(r[1] for r in res["rows"] if r[1] is not None)
            print(f"    local step = {flops / 1e9:.2f} GFLOP; best backend achieves "
                  f"{best * flops / 1e9:.1f} GFLOP/s = {100 * best * flops / 1e9 / peak:.0f} % "
                  "of matmul peak")
        print()
    if device.type == "cpu" and hasattr(os, "getloadavg"):
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
