"""10,000 clients trained on the virtual clock, end to end in one command: wall time and peak memory.

CIFAR-10 from the shared JPEG tar, ``small-cnn``, near-equal shares (``--alpha 1000``,
``cifar10:min_train=4,test_per_client=50``), the async protocol with pull on return
(``--clock virtual --protocol async --on-return pull``), K = 5, 10 periods (``-T 10``), bursty
outages u = 0.8, ``dfedavg``. Each size runs ``sfg run`` in a fresh child process; its
progress bar goes to this terminal (stderr), its table is read for the accuracy, and its
whole peak resident set is ``ru_maxrss`` of that child (``os.wait4``). Targets at N = 10,000
on the 2-core development machine: within 60 minutes and 8 GB.

    .venv/bin/python benchmarks/bench_fleet_clock.py                      # N = 10,000 (~10 min)
    .venv/bin/python benchmarks/bench_fleet_clock.py --clients 500 2000   # the slope first

Several sizes print the growth of memory and time per client between consecutive sizes, and
what N = 10,000 would take at that slope. Options after ``--`` go to ``sfg run``; ``--src``
runs another source tree's sfg (PYTHONPATH) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_fleet_time import fleet_args

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9


def command(n: int, args: argparse.Namespace) -> list[str]:
    dataset = f"cifar10:min_train={args.min_train},test_per_client={args.test_per_client}"
    return [sys.executable, "-m", "sfg", "run", "--dataset", dataset, "--data-root",
            str(args.data_root), "--model", "small-cnn", "--clients", str(n), "--alpha", "1000",
            "-T", str(args.periods), "-K", str(args.local_steps), "-p", args.process,
            "--clock", "virtual", "--protocol", "async", "--on-return", args.on_return,
            *args.run_args]


def run_once(n: int, args: argparse.Namespace, out: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in bytes, exit status) of one ``sfg run`` in a child process;
    its stdout (the table) into ``out``, its stderr (the progress bar) to ours."""
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([str(args.src), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    with open(out, "w") as fh:
        proc = subprocess.Popen(command(n, args), stdout=fh, cwd=tempfile.gettempdir(),
                                env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_maxrss * 1024.0, os.waitstatus_to_exitcode(status)


def figure(table: str, name: str) -> str:
    """The value of the row ``name`` of ``sfg run``'s table ("" when absent)."""
    m = re.search(rf"{re.escape(name)}\s*[│|]?\s*([0-9.]+(?: h)?)", table)
    return m.group(1) if m else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10000])
    ap.add_argument("--periods", "-T", type=int, default=10)
    ap.add_argument("--local-steps", "-K", type=int, default=5)
    ap.add_argument("--on-return", default="pull")
    args = fleet_args(ap)
    print(f"sfg from {args.src or 'this checkout'}")
    print(" ".join(command(args.clients[0], args)[2:]).replace(str(args.data_root), "DATA"))
    print(f"{'clients':>8} {'wall s':>8} {'peak GB':>8} {'accuracy':>9} {'p10':>7} "
          f"{'s/client':>9} {'MB/client':>10}", flush=True)
    last = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.clients:
            log = Path(tmp) / f"run-{n}.txt"
            wall, peak, rc = run_once(n, args, log)
            table = log.read_text()
            if rc != 0:
                tail = table.strip().splitlines()[-1:] or [""]
                print(f"{n:>8} failed (exit {rc}): {tail[0]}", flush=True)
                continue
            slope = ("" if last is None else
                     f"{(wall - last[1]) / (n - last[0]):9.4f} "
                     f"{(peak - last[2]) / (n - last[0]) / 1e6:10.3f}")
            print(f"{n:>8} {wall:8.1f} {peak / GB:8.2f} {figure(table, 'mean accuracy'):>9} "
                  f"{figure(table, '10th percentile'):>7} {slope}", flush=True)
            if last is not None and n < 10000:
                k = 10000 - n
                print(f"{'':>8} at this slope N = 10,000 would take about "
                      f"{(wall + k * (wall - last[1]) / (n - last[0])) / 60:.0f} min and "
                      f"{(peak + k * (peak - last[2]) / (n - last[0])) / GB:.1f} GB", flush=True)
            last = (n, wall, peak)
    print("targets at N = 10,000: within 60 min and 8 GB")


if __name__ == "__main__":
    main()
