"""Peak memory of a short training run against the number of clients (whole process).

CIFAR-10 from the shared JPEG tar (decoded once into the image cache), ``small-cnn``,
``sfg run -T 1 -K 2 --alpha 1000`` (near-equal shares, so 10,000 clients fit), evaluation at
the end; each size runs in a fresh process and its peak resident set (``ru_maxrss`` of that
child, ``os.wait4``) and wall time are printed with the increment per client between
consecutive sizes. The clients' examples are rows of one shared uint8 pool (60,000 CIFAR-10
images: 184 MB), so memory is that pool once plus N × (model, its copies in a round) plus a
constant; before, every client held its images as normalised floats (about 7.5 MB a client).

    .venv/bin/python benchmarks/bench_memory.py                 # N = 100, 1,000, 10,000
    .venv/bin/python benchmarks/bench_memory.py --clients 100 1000 --src /old/checkout/src

Options after ``--`` go to ``sfg run`` (``-- --clock virtual --protocol async``: the clock's
async engine). ``--src`` runs another source tree's sfg (PYTHONPATH) for a before/after
comparison;
``--min-train`` is the dataset parameter (``cifar10:min_train=K``, default 4: 10,000 clients
need at most 5 of the 50,000 training images each); ``--test-per-client`` the other one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import banner

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "cifar10-jpeg" / "cifar10_jpeg_q75_raw.tar.gz"


def run_once(n: int, args: argparse.Namespace, out: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit status) of one ``sfg run`` in a child process."""
    dataset = f"cifar10:min_train={args.min_train}"
    if args.test_per_client is not None:
        dataset += f",test_per_client={args.test_per_client}"
    cmd = [sys.executable, "-m", "sfg", "run", "--dataset", dataset, "--data-root",
           str(args.data_root), "--model", "small-cnn", "--clients", str(n), "-T",
           str(args.rounds), "-K", "2", "--alpha", "1000", "--eval-every", str(args.rounds),
           "--json", *args.run_args]
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([str(args.src), env.get("PYTHONPATH", "")])
        cmd[cmd.index(dataset)] = "cifar10"  # an older tree lacks the size parameters
    t0 = time.perf_counter()
    with open(out, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                cwd=tempfile.gettempdir())
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return wall, usage.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", "-T", type=int, default=1)
    ap.add_argument("--min-train", type=int, default=4)
    ap.add_argument("--test-per-client", type=int, default=None)
    ap.add_argument("--data-root", type=Path, default=DATA)
    ap.add_argument("--src", type=Path, default=None, help="another source tree's sfg")
    ap.add_argument("run_args", nargs="*", help="more `sfg run` options, after --, e.g. "
                                                "-- --clock virtual --protocol async")
    args = ap.parse_args()
    if not args.data_root.exists():
        sys.exit(f"error: no CIFAR-10 at {args.data_root}; pass --data-root")
    print(banner())
    dataset = "cifar10 (defaults)" if args.src else f"cifar10:min_train={args.min_train}"
    print(f"sfg from {args.src or 'this checkout'}; {dataset}, small-cnn, -T {args.rounds} "
          f"-K 2 --alpha 1000 {' '.join(args.run_args)}")
    print(f"{'clients':>8} {'wall s':>8} {'peak MB':>9} {'MB/client':>10}")
    last = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.clients:
            log = Path(tmp) / f"run-{n}.log"
            wall, peak, rc = run_once(n, args, log)
            if rc != 0:
                tail = log.read_text().strip().splitlines()[-1:] or [""]
                print(f"{n:>8} failed (exit {rc}): {tail[0]}")
                continue
            slope = "" if last is None else f"{(peak - last[1]) / (n - last[0]):10.3f}"
            print(f"{n:>8} {wall:8.1f} {peak:9.0f} {slope}", flush=True)
            last = (n, peak)


if __name__ == "__main__":
    main()
