"""Kernels compiled ahead in a helper process on a cold numba cache (:mod:`sfg.round.compiled`).

Each test runs a fresh interpreter with its own empty ``NUMBA_CACHE_DIR`` (numba reads it once,
at import): the helper compiles the self-return's kernel into that cache and the process loads
it from there; a failing helper changes nothing but time; a warm cache starts no helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sfg.round.compiled import usable_cores

SRC = str(Path(__file__).resolve().parents[1] / "src")
SNIPPET = """
import json, sys
if sys.argv[1] == "fail":
    sys.executable = "/bin/false"  # the helper exits at once, having compiled nothing
from sfg.modelfree.horizon import KERNEL
KERNEL.ahead()
helper = KERNEL._helper is not None
d = KERNEL.get()
print(json.dumps({"helper": helper, "hits": sum(d.stats.cache_hits.values()),
                  "misses": sum(d.stats.cache_misses.values())}))
"""


def _run(cache: Path, mode: str = "ok") -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, "-c", SNIPPET, mode], env=env, capture_output=True,
                         text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(usable_cores() < 2, reason="the helper runs only with two usable cores")
def test_the_helper_fills_the_cache_and_the_process_loads_from_it(tmp_path):
    assert _run(tmp_path) == {"helper": True, "hits": 1, "misses": 0}
    # warm: no helper, loaded from the cache
    assert _run(tmp_path) == {"helper": False, "hits": 1, "misses": 0}


@pytest.mark.skipif(usable_cores() < 2, reason="the helper runs only with two usable cores")
def test_a_failing_helper_leaves_the_compile_to_the_process(tmp_path):
    assert _run(tmp_path, "fail") == {"helper": True, "hits": 0, "misses": 1}
