"""A worker process of ``sfg swarm``: runs some of the swarm's nodes in one asyncio loop.

``python -m sfg.net.worker SWARM.json --nodes 0,4,8 [--resume]``. Prints one JSON line per node
round (``{"event": "round", ...}``) and one per finished node (``{"event": "done", ...}``)
on stdout; errors as one ``error: ...`` line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sfg.net.worker")
    ap.add_argument("spec")
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from sfg.errors import SfgError
    from sfg.net.certify import keys_for
    from sfg.net.cuts import Cut
    from sfg.net.eventlog import EventLog
    from sfg.net.node import NodeConfig
    from sfg.net.swarm import run_nodes
    from sfg.net.transport import TlsFiles
    from sfg.net.world import build_world
    from sfg.plugins import load

    spec = json.loads(Path(a.spec).read_text())
    ids = [int(x) for x in a.nodes.split(",")]
    try:
        # the plugins' rules, datasets, models (entry points; SFG_PLUGINS, inherited); a
        # broken one is named where the world needs one of its names
        load(strict=False)
        world = build_world(spec["cfg"])
        parts = tuple(Cut.parse_rounds(p) for p in spec["partitions"])
        addresses = {i: f"127.0.0.1:{p}" for i, p in enumerate(spec["ports"])}

        def on_round(i, r, available, acc):
            print(json.dumps({"event": "round", "node": i, "round": r,
                              "available": bool(available), "acc": acc}), flush=True)

        def make_config(i: int) -> NodeConfig:
            tls = TlsFiles.load(spec["tls_dir"], i) if spec.get("tls_dir") else None
            return NodeConfig(mode=spec["mode"], port=spec["ports"][i], period=spec["period"],
                              jitter=spec["jitter"], window=spec["window"],
                              deadline=spec["deadline"], checkpoint_dir=Path(spec["checkpoint_dir"]),
                              resume=a.resume, tls=tls, partitions=parts,
                              on_round=on_round,
                              keys=keys_for(world, spec.get("tls_dir"), i),
                              peers=spec.get("peers"),
                              events=EventLog(Path(spec["events_dir"]) / f"node-{i}.jsonl")
                              if spec.get("events_dir") else None)

        async def ready(ports) -> float:
            print(json.dumps({"event": "ready", "nodes": ids}), flush=True)
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            if not line.strip():
                raise SfgError("the swarm controller went away before the start")
            return float(line)

        results = asyncio.run(run_nodes(world, ids, make_config, addresses, ready=ready))
    except SfgError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    for r in results:
        print(json.dumps({"event": "done", "node": r["node"], "result": r}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
