"""Time per useful client-step at N = 100 and N = 10,000, part by part (whole ``sfg run``).

CIFAR-10 from the shared JPEG tar, ``small-cnn``, near-equal shares (``--alpha 1000``,
``cifar10:min_train=4,test_per_client=50``), bursty u = 0.8, ``dfedavg``, the same rounds,
local steps and evaluations at every size; each size runs ``sfg run --json`` in a fresh child
process. A useful client-step is one local SGD step of an online client (the run's
``client_steps``); the run reports its seconds per part in ``meta['timings']``:

* ``data``: the dataset's pool (from the image cache) and its partition into the clients' shares;
* ``graph``: the graph and its slots; ``trace``: the availability trace;
* ``setup``: the initial models, the backend, the clients' data, the minibatch streams;
* ``rounds``: the rounds' bookkeeping (who is online, the rule's weights, the staleness, gossip);
* ``train``: the minibatches drawn and gathered and the local SGD steps;
* ``evaluate``: every evaluation (one batched pass over the N clients' test sets);
* ``other``: the rest of the run (settings, result); ``start-up``: the interpreter and
  imports, the child's wall time less the run's.

Target (the fleet at scale): the total per useful client-step at N = 10,000 within 1.2× of
N = 100's.

    .venv/bin/python benchmarks/bench_fleet_time.py                       # N = 100 and 10,000
    .venv/bin/python benchmarks/bench_fleet_time.py --clients 100 2000 -T 5 -K 5

Options after ``--`` go to ``sfg run``; ``--src`` runs another source tree's sfg.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import banner

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "cifar10-jpeg" / "cifar10_jpeg_q75_raw.tar.gz"
PARTS = ("data", "graph", "trace", "setup", "rounds", "train", "evaluate", "other", "start-up")


def run_once(n: int, args: argparse.Namespace) -> dict:
    """The parts' seconds and the useful client-steps of one ``sfg run`` at N = n."""
    dataset = f"cifar10:min_train={args.min_train},test_per_client={args.test_per_client}"
    cmd = [sys.executable, "-m", "sfg", "run", "--dataset", dataset, "--data-root",
           str(args.data_root), "--model", "small-cnn", "--clients", str(n), "--alpha", "1000",
           "-T", str(args.rounds), "-K", str(args.local_steps), "-p", args.process,
           "--eval-every", str(args.eval_every or args.rounds), "--json", *args.run_args]
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([str(args.src), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        sys.exit(f"N = {n}: sfg run failed (exit {proc.returncode}): {tail[0]}")
    meta = json.loads(proc.stdout)["meta"]
    parts = {k: float(v) for k, v in meta.get("timings", {}).items()}
    parts["other"] = float(meta["seconds"]) - sum(parts.values())
    parts["start-up"] = wall - float(meta["seconds"])
    return {"parts": parts, "steps": int(meta["client_steps"]), "wall": wall,
            "acc": json.loads(proc.stdout)["metrics"]["acc_mean"]}


def fleet_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """The fleet benchmarks' shared options (the world, the data, another source tree), parsed;
    the machine printed."""
    ap.add_argument("--process", "-p", default="bursty:u=0.8")
    ap.add_argument("--min-train", type=int, default=4)
    ap.add_argument("--test-per-client", type=int, default=50)
    ap.add_argument("--data-root", type=Path, default=DATA)
    ap.add_argument("--src", type=Path, default=None, help="another source tree's sfg")
    ap.add_argument("run_args", nargs="*", help="more `sfg run` options, after --")
    args = ap.parse_args()
    if not args.data_root.exists():
        sys.exit(f"error: no CIFAR-10 at {args.data_root}; pass --data-root")
    print(banner())
    return args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 10000])
    ap.add_argument("--rounds", "-T", type=int, default=10)
    ap.add_argument("--local-steps", "-K", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=0, help="default: at the end only")
    args = fleet_args(ap)
    print(f"sfg from {args.src or 'this checkout'}; cifar10:min_train={args.min_train},"
          f"test_per_client={args.test_per_client}, small-cnn, --alpha 1000 -T {args.rounds} "
          f"-K {args.local_steps} -p {args.process} {' '.join(args.run_args)}", flush=True)
    got = {}
    for n in args.clients:
        got[n] = r = run_once(n, args)
        print(f"N = {n}: {r['wall']:.1f} s, {r['steps']} useful client-steps, mean accuracy "
              f"{r['acc']:.4f}", flush=True)
    first, last = args.clients[0], args.clients[-1]
    head = "".join(f" {f'N={n} s':>11} {'ms/step':>8}" for n in args.clients)
    print(f"{'part':>9}{head} {f'{last}/{first}':>10}")
    for part in (*PARTS, "total", "run"):
        row, per = f"{part:>9}", {}
        for n in args.clients:
            p, steps = got[n]["parts"], got[n]["steps"]
            s = (sum(p.values()) if part == "total" else
                 sum(v for k, v in p.items() if k != "start-up") if part == "run" else
                 p.get(part, 0.0))
            per[n] = 1e3 * s / steps
            row += f" {s:11.2f} {per[n]:8.3f}"
        ratio = per[last] / per[first] if per[first] > 0 else float("nan")
        print(f"{row} {ratio:10.2f}")
    print("total: the whole child process; run: without start-up. "
          "Target: total ratio at most 1.2")


if __name__ == "__main__":
    main()
