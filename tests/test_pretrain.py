"""`sfg pretrain` (docs/concepts/training.md#the-training-protocol pretrained backbone): one epoch on a tiny image folder, the backbone
loads into `sfg run` with a fresh head, resuming after a kill continues from the saved epoch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from sfg.errors import SfgError
from sfg.sim.params import ParamSpec
from sfg.sim.pretrain import checkpoint_path, one_cycle_lr, pretrain
from sfg.sim.run import simulate
from sfg.world.models import make_model

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    """Single-threaded kernels: tiny models on a shared machine stall with two threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def image_folder(root: Path, classes: int = 4, per_class: int = 6, size: int = 32) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", 3)):
        for c in range(classes):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                base = np.zeros((size, size, 3), np.uint8)
                base[..., c % 3] = 60 * (c + 1)  # a class colour plus noise
                img = np.clip(base + rng.integers(0, 60, base.shape), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(d / f"{i}.png")
    return root


def test_one_cycle_schedule():
    total = 100
    lrs = [one_cycle_lr(s, total, 0.1) for s in range(total)]
    assert lrs[0] == pytest.approx(0.1 / 25) and max(lrs) == pytest.approx(0.1)
    assert int(np.argmax(lrs)) == 30 and lrs[-1] < 0.1 / 25
    assert all(a >= b for a, b in zip(lrs[30:], lrs[31:], strict=False))


def test_one_epoch_backbone_loads_into_sfg_run_with_a_fresh_head(tmp_path):
    root = image_folder(tmp_path / "imgs", per_class=24, size=8)
    out = tmp_path / "backbone.safetensors"
    res = pretrain(dataset="imagefolder", model="resnet18-gn:width=8", data_root=str(root), out=out,
                   epochs=1, batch_size=32, seed=0)
    assert res["out"] == str(out) and res["epochs_done"] == 1 and np.isfinite(res["loss"])
    assert not checkpoint_path(out).exists()
    saved = load_file(str(out))
    init = make_model("resnet18-gn:width=8", input_shape=(3, 8, 8), num_classes=4)
    assert set(saved) == {n for n, _ in init.named_parameters()}
    # sfg run: every client starts from the body; the head is the run's own fresh head
    cfg = dict(dataset="imagefolder", data_root=str(root), model="resnet18-gn:width=8", n_clients=4,
               rounds=1, local_steps=1, batch_size=4, eval_every=1, graph="knn:k=1",
               process="none", backend="loop", observer_rounds=0)
    cfg.pop("observer_rounds")
    seen = {}
    simulate({**cfg, "backbone_from": str(out)},
             observer=lambda r: seen.setdefault("X", r["X"].clone()) if r["t"] == 0 else None)
    plain = {}
    simulate(cfg, observer=lambda r: plain.setdefault("X", r["X"].clone()) if r["t"] == 0
             else None)
    spec = ParamSpec.from_module(init)
    views = spec.unflatten(seen["X"])
    for name in ("conv1.weight", "layer4.1.conv2.weight", "bn1.weight"):
        assert torch.equal(views[name][0], saved[name]) and torch.equal(views[name][1], saved[name])
    for name in ("fc.weight", "fc.bias"):  # re-initialised: the run's seeded head, not the saved
        assert not torch.equal(views[name][0], saved[name])
        assert torch.equal(views[name], spec.unflatten(plain["X"])[name])
    assert not torch.equal(views["conv1.weight"], spec.unflatten(plain["X"])["conv1.weight"])


@pytest.mark.crosspath
def test_resume_continues_from_the_saved_epoch_and_matches_an_uninterrupted_run(tmp_path):
    root = image_folder(tmp_path / "imgs", size=8)
    kw = dict(dataset="imagefolder", model="small-cnn", data_root=str(root), epochs=3,
              batch_size=8, seed=1)
    full = pretrain(out=tmp_path / "a.safetensors", **kw)
    part = pretrain(out=tmp_path / "b.safetensors", max_epochs_now=1, **kw)
    assert part["out"] is None and checkpoint_path(tmp_path / "b.safetensors").exists()
    rest = pretrain(out=tmp_path / "b.safetensors", **kw)
    assert rest["resumed"] and rest["start_epoch"] == 1 and rest["epochs_done"] == 3
    a, b = load_file(str(tmp_path / "a.safetensors")), load_file(str(tmp_path / "b.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert rest["loss"] == full["loss"]
    # another setting with a checkpoint present is refused, with the fix
    pretrain(out=tmp_path / "c.safetensors", max_epochs_now=1, **kw)
    with pytest.raises(SfgError, match="other settings .*lr"):
        pretrain(out=tmp_path / "c.safetensors", **{**kw, "lr": 0.2})


def test_kill_then_rerun_resumes(tmp_path):
    root = image_folder(tmp_path / "imgs", size=8)
    out = tmp_path / "k.safetensors"
    cmd = [sys.executable, "-m", "sfg.cli.main", "pretrain", "--dataset", "imagefolder", "--model",
           "small-cnn", "--data-root", str(root), "--out", str(out), "--epochs", "100",
           "--batch-size", "8"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ckpt = checkpoint_path(out)
    deadline = time.monotonic() + 120
    while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert ckpt.exists(), proc.communicate()[1].decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not out.exists()
    from safetensors import safe_open

    with safe_open(str(ckpt), framework="pt") as f:
        saved_epoch = int(f.metadata()["epoch"])
    assert 1 <= saved_epoch < 100
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    # the kill may land after a later checkpoint than the one read above: never before it
    resumed_from = int(res.stdout.split("resumed after epoch ")[1].split()[0])
    assert resumed_from >= saved_epoch and out.exists() and not ckpt.exists()
    assert "100 epochs" in res.stdout


def test_bad_input(tmp_path):
    with pytest.raises(SfgError, match="must end in .safetensors"):
        pretrain(dataset="digits", model="mlp", out=tmp_path / "x.pt", epochs=1)
    with pytest.raises(SfgError, match="pretrain supports"):
        pretrain(dataset="femnist", model="mlp", out=tmp_path / "x.safetensors", epochs=1)
