"""Trace pipelines on the real files in ../shared/data (issue: seconds, not minutes).

Times parsing the FLASH subset and building all rounds for both rules, and the STUNner
session files with both window variants.

Run: ``.venv/bin/python benchmarks/bench_traces.py``
"""

from __future__ import annotations

import time
from pathlib import Path

from machine import banner

from sfg.world.traces.flash import flash_trace, parse_flash
from sfg.world.traces.stunner import parse_sessions, stunner_trace

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def main() -> None:
    print(banner(), flush=True)
    t0 = time.perf_counter()
    states = parse_flash(DATA / "flash" / "flash_state_traces_subset.json")
    t_parse = time.perf_counter() - t0
    for rule in ("strict", "relaxed"):
        t1 = time.perf_counter()
        tr = flash_trace(states, rule=rule)
        print(f"FLASH subset {rule:<7}: {tr.available.shape[1]:>3} eligible devices, "
              f"{time.perf_counter() - t1:.3f} s to build 300 rounds")
    print(f"FLASH subset parse ({states.n_events} events): {t_parse:.2f} s")
    for name in ("peersim_session_100.txt", "peersim_session_80.txt"):
        t0 = time.perf_counter()
        sessions = parse_sessions(DATA / "stunner" / name)
        t_parse = time.perf_counter() - t0
        for variant in ("10min", "6day"):
            t1 = time.perf_counter()
            tr = stunner_trace(sessions, variant=variant)
            print(f"STUNner {name} {variant:<5}: {tr.available.shape[1]:>3} eligible users, parse "
                  f"{t_parse:.2f} s, windows {time.perf_counter() - t1:.2f} s")


if __name__ == "__main__":
    main()
