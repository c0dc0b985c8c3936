"""A node checkpoint is replaced atomically (docs/concepts/nodes.md#wire-format-and-trust): a save that fails or is killed part-way
leaves the previous checkpoint loadable, bit for bit.

The faults are real: a write past the process's file-size limit (``RLIMIT_FSIZE``, the kernel
fails it with ``EFBIG`` after writing up to the limit), an ``fsync`` that fails after the bytes
were written, and a child process SIGKILLed while it is in the middle of a save (it tells the
parent where it stands through its stdout, then waits to be killed).
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sfg.net.checkpoints import NodeState, load_checkpoint, save_checkpoint
from sfg.net.wire import Layout, encode_params

D = 1 << 18  # 1 MiB of float32: the half-written file is clearly short of a whole checkpoint
LAYOUT = Layout(names=("w.weight", "w.bias"), shapes=((D - 8, 1), (8,)))
PREV = (np.random.default_rng(0).standard_normal(D).astype(np.float32),
        NodeState(t=3, age=1, lag=1.5, count=2, local_count=2, q_hat=[0.25, 0.75]),
        {"t0": 1.0})
NEW = (np.random.default_rng(1).standard_normal(D).astype(np.float32),
       NodeState(t=4, age=0, lag=0.0, count=3, local_count=3, q_hat=[0.5, 0.8]),
       {"t0": 2.0})


def _new_size() -> int:
    import json

    meta = {"state": json.dumps(NEW[1].as_dict()), "extra": json.dumps(NEW[2])}
    return len(encode_params(NEW[0], LAYOUT, metadata=meta))


def _previous(tmp_path):
    path = tmp_path / "node-0.safetensors"
    save_checkpoint(path, PREV[0], LAYOUT, PREV[1], PREV[2])
    return path


def _assert_previous_loads(path) -> None:
    x, st, extra = load_checkpoint(path, LAYOUT)
    assert np.array_equal(x, PREV[0]) and st == PREV[1] and extra == PREV[2]


def test_failed_fsync_keeps_the_previous_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = _previous(tmp_path)
    written: list[int] = []

    def failing_fsync(fd):
        written.append(os.fstat(fd).st_size)  # the new bytes are in the temporary file
        raise OSError(errno.EIO, "injected fsync failure")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="injected fsync failure"):
        save_checkpoint(path, NEW[0], LAYOUT, NEW[1], NEW[2])
    monkeypatch.undo()
    assert written == [_new_size()]  # it failed after the whole write, before the rename
    _assert_previous_loads(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the temporary file is removed


_CHILD_HEAD = """
import os, sys, time
import numpy as np
import sfg.net.checkpoints as S
import sfg.util.atomic as A
from sfg.net.checkpoints import NodeState
from sfg.net.wire import Layout
D = {D}
layout = Layout(names=("w.weight", "w.bias"), shapes=((D - 8, 1), (8,)))
x = np.random.default_rng(1).standard_normal(D).astype(np.float32)
st = NodeState(t=4, age=0, lag=0.0, count=3, local_count=3, q_hat=[0.5, 0.8])
path, where = sys.argv[1], sys.argv[2]
"""


def _child(code: str, *args: str) -> subprocess.Popen:
    src = _CHILD_HEAD.format(D=D) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", src, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_write_failing_part_way_keeps_the_previous_checkpoint_and_no_temp_file(tmp_path):
    """The child's file-size limit is half the new checkpoint: the kernel writes up to it and
    fails the rest with EFBIG (Python ignores SIGXFSZ), so the save raises part-way."""
    path = _previous(tmp_path)
    limit = _new_size() // 2
    proc = _child("""
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(where), resource.RLIM_INFINITY))
        try:
            S.save_checkpoint(path, x, layout, st, {"t0": 2.0})
        except OSError as e:
            print("raised", e.errno, flush=True)
        else:
            print("saved", flush=True)
    """, str(path), str(limit))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["raised", str(errno.EFBIG)]
    _assert_previous_loads(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("where", ["mid-write", "at-fsync"])
def test_sigkill_part_way_through_a_save_keeps_the_previous_checkpoint(tmp_path, where):
    """The child stops (and says so) after writing half the bytes, or at the ``fsync`` after the
    whole write (before any rename); the parent SIGKILLs it there."""
    path = _previous(tmp_path)
    proc = _child("""
        import builtins

        def stop(reason):
            print(reason, flush=True)
            time.sleep(60)  # killed here

        class HalfThenStop:
            def __init__(self, f):
                self.f = f
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                self.f.close()
            def write(self, data):
                self.f.write(data[:len(data) // 2])
                self.f.flush()
                os.fsync(self.f.fileno())
                stop(f"written {len(data) // 2} of {len(data)}")
            def __getattr__(self, name):
                return getattr(self.f, name)

        if where == "mid-write":
            A.open = lambda p, mode: HalfThenStop(builtins.open(p, mode))
        else:
            os.fsync = lambda fd: stop(f"fsync {os.fstat(fd).st_size}")
        S.save_checkpoint(path, x, layout, st, {"t0": 2.0})
        print("saved", flush=True)
    """, str(path), where)
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout=60), "the child never reached the point to be killed at"
        line = proc.stdout.readline().split()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    size = _new_size()
    assert line == (["written", str(size // 2), "of", str(size)] if where == "mid-write"
                    else ["fsync", str(size)]), line
    _assert_previous_loads(path)
    # only the killed process's temporary file is left beside it, and the next save works
    tmp = tmp_path / f".{path.name}.tmp{proc.pid}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, tmp.name])
    assert tmp.stat().st_size == (size // 2 if where == "mid-write" else size)
    save_checkpoint(path, NEW[0], LAYOUT, NEW[1], NEW[2])
    x, st, extra = load_checkpoint(path, LAYOUT)
    assert np.array_equal(x, NEW[0]) and st == NEW[1] and extra == NEW[2]
