"""A fleet-sized trace file: loading a 136,000-device interval CSV (the clock at fleet scale).

Writes a synthetic trace in the standard interval form (``device,start,end``; ISO timestamps,
docs/reference/formats.md) for 136,000 devices -- the size of the FLASH smartphone study --
over 7 days: each device has between 2 and 38 online periods (20 on average; the FLASH subset
in ../shared/data has about 4.5 a day under the relaxed rule), of exponential lengths that
keep it online about a third of the time, at second resolution, rows in time order (devices
interleaved, as a fleet's log export would have them). Then, each in a fresh child process
(its wall time and peak resident set, ``ru_maxrss`` of that child by ``os.wait4``; the file is
written by another child and this process imports nothing large, since a child's peak counts
the parent's resident set at the fork):

1. ``import sfg.world.traces.tabular`` alone (the interpreter and numpy: the floor);
2. ``load_tabular(path)``: parse, validate, cut the 10-minute rounds (what ``-p trace:path=``
   builds). Target: at most 10 s and 1 GB;
3. ``sfg replay -p trace:path=FILE -r sfg-cut --seeds 1 -n N -T T`` on it (the whole command).

    .venv/bin/python benchmarks/bench_fleet_trace.py                  # 136,000 devices
    .venv/bin/python benchmarks/bench_fleet_trace.py --devices 10000 --minutes
    .venv/bin/python benchmarks/bench_fleet_trace.py --keep fleet.csv  # keep the file

``--minutes`` writes plain minutes instead of ISO timestamps; ``--src`` loads with another
source tree (PYTHONPATH) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT_S, LIMIT_MIB = 10.0, 1e9 / 2 ** 20  # 10 s and 1 GB


def write_fleet(path: Path, devices: int, days: float, *, minutes: bool, seed: int = 0) -> int:
    """Write the synthetic interval CSV; returns its number of data rows."""
    import numpy as np

    rng = np.random.default_rng(seed)
    W = days * 86400.0  # seconds
    n = rng.integers(2, 39, size=devices)  # online periods per device
    M = int(n.sum())
    dev = np.repeat(np.arange(devices), n)
    # each device's window cut into n cycles; in each cycle an online period of exponential
    # length (mean a third of the cycle) at a uniform place, so periods never overlap
    cyc = W / n[dev]
    k = np.arange(M) - np.repeat(np.cumsum(n) - n, n)
    on = np.minimum(rng.exponential(cyc / 3.0), cyc * 0.95)
    start = np.floor(k * cyc + rng.uniform(0.0, 1.0, M) * (cyc - on))
    end = np.maximum(np.floor(start + on), start + 1.0)
    order = np.argsort(start, kind="stable")
    dev, start, end = dev[order], start[order], end[order]
    ids = np.char.add("dev-", np.char.zfill(np.arange(devices).astype(str), 6))
    ids = ids[rng.permutation(devices)]
    if minutes:
        s_txt = np.char.mod("%.4f", start / 60.0)
        e_txt = np.char.mod("%.4f", end / 60.0)
    else:
        t0 = np.datetime64("2024-03-01T00:00:00", "s")
        s_txt = np.datetime_as_string(t0 + start.astype("timedelta64[s]"), unit="s")
        e_txt = np.datetime_as_string(t0 + end.astype("timedelta64[s]"), unit="s")
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write("device,start,end\n")
        step = 500_000
        for i in range(0, M, step):
            rows = np.char.add(np.char.add(np.char.add(np.char.add(
                ids[dev[i:i + step]], ","), s_txt[i:i + step]), ","), e_txt[i:i + step])
            fh.write("\n".join(rows.tolist()))
            fh.write("\n")
    return M


def child(code: str, env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MiB, exit status, output) of ``python -c code`` in a fresh process."""
    return command([sys.executable, "-c", code], env)


def command(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        fh.seek(0)
        out = fh.read()
    return wall, usage.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status), out


def start(src: Path | None) -> dict[str, str]:
    """Print the machine and its load; the environment of a child that runs ``src`` (a
    source tree; None: this checkout's)."""
    here = Path(__file__).resolve()
    print(subprocess.run([sys.executable, str(here.parent / "machine.py")], check=True,
                         capture_output=True, text=True).stdout.strip(), flush=True)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src or here.parents[1] / "src"),
                                         env.get("PYTHONPATH", "")])
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=136_000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--minutes", action="store_true", help="plain minutes, not ISO timestamps")
    ap.add_argument("--keep", type=Path, default=None, help="write the trace here and keep it")
    ap.add_argument("--src", type=Path, default=None, help="load with this source tree")
    ap.add_argument("--replay-clients", type=int, default=10_000,
                    help="N of the sfg replay on the trace (0: skip it)")
    ap.add_argument("--replay-rounds", type=int, default=300)
    ap.add_argument("--write", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write is not None:  # the child that writes the file
        print(write_fleet(args.write, args.devices, args.days, minutes=args.minutes))
        return
    here = Path(__file__).resolve()
    env = start(args.src)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "fleet.csv"
        t0 = time.perf_counter()
        made = subprocess.run([sys.executable, str(here), "--write", str(path), "--devices",
                               str(args.devices), "--days", str(args.days)]
                              + (["--minutes"] if args.minutes else []),
                              check=True, capture_output=True, text=True)
        rows = int(made.stdout.split()[-1])
        print(f"wrote {path.name}: {args.devices:,} devices, {rows:,} online periods over "
              f"{args.days:g} days ({'minutes' if args.minutes else 'ISO timestamps'}), "
              f"{path.stat().st_size / 1e6:.0f} MB, in {time.perf_counter() - t0:.1f} s",
              flush=True)
        wall, mb, rc, out = child("import sfg.world.traces.tabular", env)
        print(f"import alone:      {wall:6.2f} s  {mb:7.0f} MiB peak", flush=True)
        code = ("import time; t0 = time.perf_counter()\n"
                "from sfg.world.traces.tabular import load_tabular\n"
                f"tr = load_tabular({str(path)!r})\n"
                "print(tr.available.shape, round(float(tr.available.mean()), 4), "
                "round(time.perf_counter() - t0, 2))")
        wall, mb, rc, out = child(code, env)
        ok = rc == 0 and wall <= LIMIT_S and mb <= LIMIT_MIB
        print(f"load_tabular:      {wall:6.2f} s  {mb:7.0f} MiB peak  -> rounds x devices, "
              f"mean availability, in-process s: {out.strip()[-200:]}  "
              f"[target <= {LIMIT_S:g} s, 1 GB: {'met' if ok else 'NOT MET'}]",
              flush=True)
        if args.replay_clients:
            cmd = [sys.executable, "-m", "sfg", "replay", "-p", f"trace:path={path}",
                   "-r", "sfg-cut", "--seeds", "1", "-n", str(args.replay_clients),
                   "-T", str(args.replay_rounds)]
            wall, mb, rc, out = command(cmd, env)
            row = [ln for ln in out.splitlines() if "sfg-cut" in ln] or out.splitlines()[-3:]
            print(f"sfg replay N={args.replay_clients:,} T={args.replay_rounds}: {wall:6.2f} s "
                  f"{mb:7.0f} MiB peak (exit {rc})\n  {' '.join(row[-1].split())[:300]}",
                  flush=True)
        if args.keep is None:
            path.unlink()


if __name__ == "__main__":
    main()
