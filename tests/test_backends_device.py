"""The fused backends (``vmap``, ``batched``) equal the per-client ``loop`` on one device.

The device is ``SFG_TEST_DEVICE`` (default ``cpu``): ``benchmarks/bench_gpu.py`` runs this file
with ``SFG_TEST_DEVICE=cuda`` on a GPU machine, the CUDA test subset. Nothing here
is skipped: a device that is asked for and missing fails the tests. Needs torch and pytest only
(no pydantic: the device machine has none).

Same minibatches, momentum 0.9 (buffers compared too), float32 (``precision="fp32"``, which on
CUDA switches TF32 off). The CNNs agree to 1e-5 over three steps (measured on the AVX2 CPU:
at most 3e-8 on the parameters, 1.5e-7 on the buffers). ResNet-18-GN agrees to 1e-5 after one
step (1.2e-7); over three steps (random labels, lr 0.01, momentum 0.9) its GroupNorm
amplifies roundings until no two orderings of the same sums agree to 1e-5 -- not even the
loop's own NCHW and channels_last formats (B = 8: 1e-4 apart, 0.12 % of the update in L2;
vmap: 0.5-0.75 %) -- so there the bound is relative to the update.
"""

from __future__ import annotations

import os

import pytest
import torch
from test_backends import SHAPES, problem

from sfg.errors import SfgError
from sfg.sim.backends import make_backend

DEVICE = os.environ.get("SFG_TEST_DEVICE", "cpu")
KW = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)


@pytest.fixture(scope="module")
def device():
    dev = torch.device(DEVICE)
    assert dev.type != "cuda" or torch.cuda.is_available(), \
        f"SFG_TEST_DEVICE={DEVICE} but CUDA is not available here"
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # single-threaded kernels (see test_backends.py)
    yield dev
    torch.set_num_threads(before)


def trained(backend, model, P, xs, ys, device, **kw):
    """(models, momentum buffers) after ``backend``'s K steps, on ``device``."""
    be = make_backend(backend, model, device=str(device), precision=kw.pop("precision", "fp32"))
    buf = torch.zeros(P.shape, device=device)
    out = be.train(P.to(device), xs.to(device), ys.to(device), momentum_buf=buf, **{**KW, **kw})
    assert out.device.type == device.type and buf.device.type == device.type
    return out.cpu(), buf.cpu()


@pytest.mark.parametrize("fused", ["vmap", "batched"])
@pytest.mark.parametrize("name", ["small-cnn", "cnn"])
def test_fused_cnn_equals_loop_over_three_steps(device, name, fused):
    model, P, xs, ys = problem(name, n=4, K=3, B=8, seed=5)
    want, want_buf = trained("loop", model, P, xs, ys, device)
    got, got_buf = trained(fused, model, P, xs, ys, device)
    assert (want - P).abs().max() > 1e-3  # it trained
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_buf, want_buf, atol=1e-5, rtol=0)


def test_resnet18_gn_vmap_equals_loop(device):
    model, P, xs, ys = problem("resnet18-gn", n=2, K=1, B=4, seed=5)
    want, want_buf = trained("loop", model, P, xs, ys, device)
    got, got_buf = trained("vmap", model, P, xs, ys, device)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_buf, want_buf, atol=1e-5, rtol=0)


def test_resnet18_gn_vmap_follows_loop_over_three_steps(device, monkeypatch):
    # CIFAR's 32x32: at 16x16 the last GroupNorm normalises 1x1 maps and is ill-conditioned
    monkeypatch.setitem(SHAPES, "resnet18-gn", (3, 32, 32))
    model, P, xs, ys = problem("resnet18-gn", n=2, K=3, B=4, seed=5)
    want, _ = trained("loop", model, P, xs, ys, device, lr=0.01)
    got, _ = trained("vmap", model, P, xs, ys, device, lr=0.01)
    step = want - P
    assert (got - want).norm() <= 2e-2 * step.norm()            # measured 7.5e-3
    assert (got - want).abs().max() <= 2e-2 * step.abs().max()  # measured 4.8e-3


def test_batched_refuses_resnet18_gn_in_one_line(device):
    model = make_model_for("resnet18-gn")
    with pytest.raises(SfgError) as err:
        make_backend("batched", model, device=str(device))
    msg = str(err.value)
    assert "\n" not in msg and "cannot run model 'resnet18-gn'" in msg and "'vmap'" in msg


def make_model_for(name):
    from sfg.world.models import make_model

    return make_model(name, input_shape=SHAPES[name], num_classes=10)


@pytest.mark.parametrize("backend", ["vmap", "batched"])
def test_fused_evaluation_equals_loop(device, backend):
    model, P, xs, ys = problem("cnn", n=5, K=1, B=16, seed=2)
    test_x, test_y = xs[:, 0].to(device), ys[:, 0].to(device)
    want = make_backend("loop", model, device=str(device)).evaluate(P.to(device), test_x, test_y)
    got = make_backend(backend, model, device=str(device)).evaluate(P.to(device), test_x, test_y)
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", ["loop", "vmap", "batched"])
def test_reduced_precisions_train_close_to_fp32(device, backend):
    """tf32 is fp32 itself off CUDA (bit for bit) and within TF32's rounding on CUDA; bf16
    autocast trains (parameters stay float32) within bf16's rounding of fp32."""
    model, P, xs, ys = problem("cnn", n=3, K=2, B=8, seed=1)
    fp32, _ = trained(backend, model, P, xs, ys, device)
    tf32, _ = trained(backend, model, P, xs, ys, device, precision="tf32")
    bf16, _ = trained(backend, model, P, xs, ys, device, precision="bf16")
    step = (fp32 - P).norm()
    if device.type == "cuda":
        assert (tf32 - fp32).norm() <= 2e-2 * step
    else:
        assert torch.equal(tf32, fp32)
    assert bf16.dtype == torch.float32 and bool(torch.isfinite(bf16).all())
    assert 0 < (bf16 - fp32).norm() <= 0.15 * step  # measured 0.02-0.05 on the CPU
