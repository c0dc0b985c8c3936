"""``SFG_REPRODUCIBLE=1``: the same bits whatever the CPU (:mod:`sfg.reproducible`).

A machine with another instruction set cannot be had in a test, so the test lowers the
instruction sets this machine's libraries may use in ways the switch does not set itself — MKL
capped at AVX or SSE4.2 (``MKL_ENABLE_INSTRUCTIONS``), glibc's libm without its AVX2/FMA
variants (``GLIBC_TUNABLES``) — and checks that a training run
under the switch gives the same parameters bit for bit in every case, while without the switch
lowering torch's kernels (``ATEN_CPU_CAPABILITY=default``) changes them (so the comparison can
fail). The switch itself pins torch, MKL's branch, oneDNN, numba and numpy to the baseline
x86-64 code that every CPU runs; the replay (numba, float64, no fast-math) gives the same bits
with and without it.

Each case is a fresh process (the settings are read when the libraries load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sfg import reproducible
from sfg.errors import SfgError

PROBE = r"""
import sfg  # first: SFG_REPRODUCIBLE pins the libraries before they load
import hashlib, json
import numpy as np
import torch
from numba.core import config
from sfg.modelfree import replay
from sfg.sim.run import simulate

def digest(t):
    return hashlib.blake2b(t.detach().numpy().tobytes(), digest_size=12).hexdigest()

base = dict(dataset="digits", n_clients=12, rounds=6, local_steps=2, batch_size=8, eval_every=3,
            graph="knn:k=4", process="bursty:u=0.6", seed=3, rule="sfg-cut")
out = {name: digest(simulate({**base, "model": name}).params) for name in ("mlp", "small-cnn")}
rows = replay(["bursty:u=0.8"], ["sfg-cut"], [1], n=60, T=80, horizon=10)
out["replay"] = hashlib.blake2b(json.dumps(rows, sort_keys=True, default=str).encode(),
                                digest_size=12).hexdigest()
out["exp"] = hashlib.blake2b(np.exp(np.linspace(-5, 5, 1001)).tobytes(), digest_size=12).hexdigest()
out["capability"] = torch.backends.cpu.get_cpu_capability()
out["threads"] = torch.get_num_threads()
out["numba_cpu"] = config.CPU_NAME
print("PROBE " + json.dumps(out))
"""

KNOBS = ("SFG_REPRODUCIBLE", "SFG_REPRODUCIBLE_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
         *reproducible.SETTINGS, "MKL_ENABLE_INSTRUCTIONS", "GLIBC_TUNABLES")


def probe(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in KNOBS}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("PROBE ")][-1]
    return json.loads(line[6:])


@pytest.fixture(scope="module")
def pinned():
    return probe(SFG_REPRODUCIBLE="1")


def test_switch_pins_the_libraries(pinned):
    assert pinned["capability"] == "DEFAULT"
    assert pinned["threads"] == 1
    assert pinned["numba_cpu"] == "generic"


@pytest.mark.parametrize("machine", [
    {"MKL_ENABLE_INSTRUCTIONS": "AVX"},
    {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F"},
    # this project's other kind of machine, as far as one process can play it: no AVX-512
    # in MKL or libm (what the switch does not set itself; numpy's dispatch it pins)
    {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"},
], ids=["mkl-avx", "mkl-sse42", "libm-no-fma", "avx2-machine"])
def test_switch_gives_the_same_bits_on_a_lowered_machine(pinned, machine):
    got = probe(SFG_REPRODUCIBLE="1", **machine)
    for key in ("mlp", "small-cnn", "replay", "exp"):
        assert got[key] == pinned[key], (key, machine)


def test_the_thread_count_does_not_change_the_bits(pinned):
    """sfg runs every training kernel on one intra-op thread, on blocks of clients that depend
    on N only (sfg.sim.backends._run_chunks): SFG_REPRODUCIBLE_THREADS=2 runs two workers and
    gives the bits of one, on a lowered machine too."""
    two = probe(SFG_REPRODUCIBLE="1", SFG_REPRODUCIBLE_THREADS="2")
    assert two["threads"] == 2
    assert all(two[k] == pinned[k] for k in ("mlp", "small-cnn", "replay", "exp"))
    lowered = probe(SFG_REPRODUCIBLE="1", SFG_REPRODUCIBLE_THREADS="2",
                    MKL_ENABLE_INSTRUCTIONS="AVX", GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX2,-FMA")
    assert all(lowered[k] == two[k] for k in ("mlp", "small-cnn", "replay", "exp"))


def test_without_the_switch_the_instruction_set_changes_the_bits(pinned):
    native = probe()
    lowered = probe(ATEN_CPU_CAPABILITY="default")
    assert native["mlp"] != lowered["mlp"]  # the comparison above can fail
    assert native["mlp"] != pinned["mlp"]  # the switch is a different (pinned) path...
    assert native["replay"] == pinned["replay"] == lowered["replay"]  # ...the replay is not


def test_apply_sets_only_what_is_unset_and_only_when_asked():
    env = {"SFG_REPRODUCIBLE": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = reproducible.apply(env)
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and "ONEDNN_MAX_CPU_ISA" not in done
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["OMP_NUM_THREADS"] == "1"
    off = {"SFG_REPRODUCIBLE": "0"}
    assert reproducible.apply(off) == [] and off == {"SFG_REPRODUCIBLE": "0"}


def test_switch_after_numpy_is_loaded_is_an_error(monkeypatch):
    import numpy  # noqa: F401 - loaded before the switch is read

    monkeypatch.setenv("SFG_REPRODUCIBLE", "1")
    with pytest.raises(SfgError, match="before numpy"):
        reproducible.apply()


def test_bad_thread_count_is_one_error_line():
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    done = subprocess.run([sys.executable, "-m", "sfg", "rules"], capture_output=True, text=True,
                          env={**env, "SFG_REPRODUCIBLE": "1", "SFG_REPRODUCIBLE_THREADS": "0"},
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: SFG_REPRODUCIBLE_THREADS='0' is no thread count; give a whole number from 1 to 256"]
