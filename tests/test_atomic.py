"""Atomic writes in one utility (sfg.util.atomic), and every writer of sfg that replaces a file
goes through it: a write that fails part-way (a callback that raises, an ``fsync`` that fails)
leaves the previous file whole and no temporary file; the rename happens only after the
data's ``fsync``, and the folder is synced after it. (The checkpoints' SIGKILL and
file-size-limit cases: tests/test_net_checkpoint.py.)"""

from __future__ import annotations

import errno
import os
import stat
import threading

import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.util import atomic


def _fail_fsync(monkeypatch, calls: list[str]):
    def fsync(fd):
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        raise OSError(errno.EIO, "injected fsync failure")

    monkeypatch.setattr(os, "fsync", fsync)


def test_write_bytes_replaces_and_syncs_the_file_then_the_folder(tmp_path, monkeypatch):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    order: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        order.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(a, b):
        order.append("replace")
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic.write_bytes(path, b"new content")
    assert order == ["fsync file", "replace", "fsync dir"]
    assert path.read_bytes() == b"new content"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


@pytest.mark.parametrize("fault", ["callback", "fsync"])
def test_a_failed_write_keeps_the_previous_file_and_no_temp_file(tmp_path, monkeypatch, fault):
    path = tmp_path / "a.bin"
    path.write_bytes(b"previous")

    def half_then_raise(f):
        f.write(b"half of the new")
        raise RuntimeError("injected write failure")

    calls: list[str] = []
    if fault == "fsync":
        _fail_fsync(monkeypatch, calls)
    with pytest.raises((RuntimeError, OSError), match="injected"):
        atomic.write_via(path, half_then_raise if fault == "callback" else
                         (lambda f: f.write(b"the whole new content")))
    assert calls == ([] if fault == "callback" else ["file"])
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_threads_write_through_temporary_files_of_their_own(tmp_path):
    path = tmp_path / "a.bin"
    names = [atomic.temp_path(path).name]
    th = threading.Thread(target=lambda: names.append(atomic.temp_path(path).name))
    th.start()
    th.join()
    assert names[0] == f".a.bin.tmp{os.getpid()}"
    assert names[1].startswith(names[0] + ".") and names[1] != names[0]


def _checkpoint(path):
    from sfg.net.checkpoints import write_atomic

    write_atomic(path, b"new checkpoint")


def _data_cache(path):
    from sfg.world.data.files import save_cached

    save_cached(path, {"x": np.arange(3)})


def _pretrained(path):
    import torch

    from sfg.sim.pretrain import _atomic_save

    _atomic_save({"w": torch.ones(2)}, path, {"epoch": "1"})


@pytest.mark.parametrize("writer,error", [(_checkpoint, OSError), (_data_cache, SfgError),
                                          (_pretrained, OSError)])
def test_every_writer_is_atomic(tmp_path, monkeypatch, writer, error):
    """An ``fsync`` that fails after the whole write: the previous file stays, whole, and no
    temporary file is left (a writer that wrote in place, or renamed before the data's
    ``fsync``, fails this)."""
    pytest.importorskip("safetensors") if writer is _pretrained else None
    path = tmp_path / "target"
    path.write_bytes(b"previous")
    calls: list[str] = []
    _fail_fsync(monkeypatch, calls)
    with pytest.raises(error, match="injected fsync failure"):
        writer(path)
    monkeypatch.undo()
    assert calls == ["file"]
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["target"]
    writer(path)  # and the same write goes through without the fault
    assert path.read_bytes() != b"previous"


def test_tensorboard_export_is_atomic(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from sfg.experiments.report.export import ExportRun, to_tensorboard

    run = ExportRun(run_id="ab" * 32, grid="g", dataset="d", process="none", rule="sfg",
                    seed=1, config={"kind": "replay"}, metrics={"x": 1.0},
                    curves={"round": [0, 1], "mean_age": [0.0, 0.5]}, finished=1.0)
    calls: list[str] = []
    _fail_fsync(monkeypatch, calls)
    with pytest.raises(SfgError, match="injected fsync failure"):
        to_tensorboard([run], tmp_path / "tb")
    monkeypatch.undo()
    assert calls == ["file"]
    assert [p for p in (tmp_path / "tb").rglob("*") if p.is_file()] == []
    assert to_tensorboard([run], tmp_path / "tb").written == 1
