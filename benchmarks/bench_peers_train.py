"""What training with sampled peers costs: ``sfg run`` in rounds (digits, MLP, N = 100,
T = 300, K = 10, bursty u = 0.8, ``sfg-cut``: the defaults but the rule) with ``--peers
online:s=6`` (and ``epidemic:s=6``) against ``fixed`` (kNN k = 6: as many messages a round),
in this process, in turn (fixed, online, epidemic, fixed, ...), after one warm-up run of each.
Per run: the simulator's seconds (``meta.seconds``: data, set-up, the sampler and the round
loop) divided by the local steps the clients took (``meta.client_steps``, the same under
every ``peers``: who trains follows the availability only), and the ratio to ``fixed`` pair
by pair. Target (docs/concepts/peers.md#costs): online within 1.1x of fixed.

    .venv/bin/python benchmarks/bench_peers_train.py              # 3 rounds of the three
    .venv/bin/python benchmarks/bench_peers_train.py -n 200 -T 100 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

LIMIT = 1.1


def once(cfg: dict, peers: str) -> tuple[float, int, float]:
    """(seconds per useful client-step, the client-steps, the seconds of the sampler and the
    rounds' bookkeeping: ``meta.timings`` trace + rounds) of one run under ``peers``."""
    from sfg.sim.run import simulate

    res = simulate({**cfg, "peers": peers})
    steps = int(res.meta["client_steps"])
    own = res.meta["timings"].get("trace", 0.0) + res.meta["timings"].get("rounds", 0.0)
    return float(res.meta["seconds"]) / steps, steps, float(own)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("-T", type=int, default=300)
    ap.add_argument("-s", type=int, default=6)
    ap.add_argument("--rule", default="sfg-cut")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    here = Path(__file__).resolve()
    print(subprocess.run([sys.executable, str(here.parent / "machine.py")], check=True,
                         capture_output=True, text=True).stdout.strip(), flush=True)
    cfg = {"n_clients": args.n, "rounds": args.T, "rule": args.rule, "seed": 1}
    kinds = ("fixed", f"online:s={args.s}", f"epidemic:s={args.s}")
    for k in kinds:  # compile and load the caches, the data
        once({**cfg, "rounds": 20, "eval_every": 10}, k)
    got: dict[str, list[tuple[float, int, float]]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for k in kinds:
            got[k].append(once(cfg, k))
    base = got["fixed"]
    print(f"sfg run -n {args.n} -T {args.T} -r {args.rule}: seconds per useful client-step "
          f"(x 1e-6), {args.repeats} runs each, in turn")
    for k in kinds:
        per = [1e6 * x for x, _, _ in got[k]]
        ratio = [x / b for (x, _, _), (b, _, _) in zip(got[k], base, strict=True)]
        own = statistics.median(o for _, _, o in got[k])
        verdict = "" if k == "fixed" else (
            f"  ratio to fixed median {statistics.median(ratio):.3f} "
            f"({', '.join(f'{r:.3f}' for r in ratio)})"
            + (f" [target <= {LIMIT:g}: "
               f"{'met' if statistics.median(ratio) <= LIMIT else 'NOT MET'}]"
               if k.startswith("online") else ""))
        print(f"  {k:<16} median {statistics.median(per):8.2f}  client-steps "
              f"{got[k][0][1]}  sampler + rounds {own:.2f} s{verdict}", flush=True)


if __name__ == "__main__":
    main()
