"""``precision`` (fp32 | tf32 | bf16, :mod:`sfg.sim.precision`): the default changes nothing,
bf16 trains close to fp32, bad values are one line."""

from __future__ import annotations

import pytest
import torch
from badinput import Case, check_case

from sfg.errors import SfgError
from sfg.experiments.config import make_config, run_id
from sfg.sim.backends import make_backend
from sfg.sim.precision import PRECISIONS, autocast_scope, check_precision, device_precision
from sfg.sim.run import simulate

TINY = dict(dataset="digits", n_clients=10, rounds=6, eval_every=3, graph="ring:k=1",
            process="bursty:u=0.5", rule="sfg-cut", seed=2)


def test_run_ids_without_precision_are_unchanged():
    """Ids computed before the key existed (tests/test_clock.py pins the same)."""
    before = {"396d260db915acde": dict(kind="train", dataset="digits", model="mlp", rule="sfg",
                                       process="bursty:u=0.6", n_clients=12, rounds=6,
                                       eval_every=6, seed=3),
              "fedea88c70eef9bd": {}}
    for rid, cfg in before.items():
        assert run_id(make_config(cfg)) == rid
        assert run_id(make_config({**cfg, "precision": "fp32"})) == rid
        others = {run_id(make_config({**cfg, "precision": p})) for p in ("tf32", "bf16")}
        assert len(others) == 2 and rid not in others


@pytest.mark.crosspath
@pytest.mark.parametrize("model", ["mlp", "small-cnn"])
def test_fp32_and_cpu_tf32_are_the_default_run_bit_for_bit(model):
    base = simulate(TINY, model=model)
    for p in ("fp32", "tf32"):  # tf32 touches CUDA's switches only: nothing on CPU
        got = simulate(TINY, model=model, precision=p)
        assert torch.equal(got.params, base.params), p
        assert got.metrics == base.metrics and got.curves == base.curves


def test_bf16_differs_from_fp32_but_learns_as_well():
    """digits, N = 20, T = 30: bf16 autocast changes every model a little and the accuracy
    hardly (measured over three seeds at T = 60, sfg-cut: mlp 0.945 vs 0.945, small-cnn
    0.954 vs 0.954 mean accuracy; docs/howto/gpu.md)."""
    cfg = {**TINY, "n_clients": 20, "rounds": 30, "eval_every": 10}
    fp32 = simulate(cfg)
    bf16 = simulate(cfg, precision="bf16")
    assert bf16.params.dtype == torch.float32
    assert not torch.equal(bf16.params, fp32.params)
    assert abs(bf16.metrics["acc_mean"] - fp32.metrics["acc_mean"]) <= 0.03
    assert bf16.metrics["acc_mean"] > 0.7


def test_bf16_autocast_reaches_every_worker_thread():
    """Autocast is thread-local: a client trained by a worker thread gets it too, so the loop
    gives every client the same bits whether it trains alone or in another thread's chunk."""
    from test_backends import problem

    model, P, xs, ys = problem("small-cnn", n=4, K=2, B=8, seed=3)
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    be = make_backend("loop:workers=2", model, precision="bf16")
    together = be.train(P, xs, ys, **kw)
    alone = make_backend("loop:workers=1", model, precision="bf16").train(P[3:], xs[3:],
                                                                          ys[3:], **kw)
    assert torch.equal(together[3:], alone)
    fp32 = make_backend("loop:workers=2", model).train(P, xs, ys, **kw)
    assert not torch.equal(together[3:], fp32[3:])  # the second thread ran in bf16


def test_the_cuda_switches_are_set_inside_and_restored_after():
    """TF32 on for tf32, off for fp32 and bf16, only for CUDA devices; restored afterwards
    (torch's switches can be set without a GPU)."""
    from sfg.sim.precision import _tf32_flags

    def state():
        return [getattr(obj, attr) for obj, attr, _ in _tf32_flags()]

    before = state()
    for p in PRECISIONS:
        with device_precision(p, "cuda"):
            want = [on if p == "tf32" else off for _, _, (off, on) in _tf32_flags()]
            assert state() == want
        assert state() == before
        with device_precision(p, "cpu"):
            assert state() == before
    assert isinstance(autocast_scope("bf16", "cpu"), torch.autocast)
    assert not isinstance(autocast_scope("fp32", "cpu"), torch.autocast)


def test_bad_precision_is_refused():
    with pytest.raises(SfgError, match="precision must be one of fp32, tf32, bf16"):
        check_precision("fp16")
    model = make_model_cheap()
    with pytest.raises(SfgError, match="precision must be one of"):
        make_backend("loop", model, precision="half")
    with pytest.raises(SfgError, match="did you mean 'bf16'"):
        make_config(precision="fp16")
    with pytest.raises(SfgError, match="model-free replay"):
        make_config(kind="replay", precision="bf16")
    for protocol in ("lockstep", "async", "event"):
        assert make_config(clock="virtual", protocol=protocol, precision="bf16").precision \
            == "bf16"


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_the_clocks_training_takes_precision(protocol):
    """The async and event protocols train through the same backend: bf16 changes the models
    (and learns as well), fp32 is the default run bit for bit."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    cfg = dict(dataset="digits", model="mlp", n_clients=8, rounds=6, local_steps=2,
               process="bursty:u=0.5", graph="knn:k=3", seed=2, eval_every=3, clock="virtual",
               protocol=protocol, compute="const:value=30", rule="sfg-cut")
    plain = simulate_events(resolve_config(cfg))
    fp32 = simulate_events(resolve_config({**cfg, "precision": "fp32"}))
    bf16 = simulate_events(resolve_config({**cfg, "precision": "bf16"}))
    assert torch.equal(plain["params"], fp32["params"])
    assert not torch.equal(plain["params"], bf16["params"])
    assert abs(bf16["metrics"]["acc_mean"] - plain["metrics"]["acc_mean"]) < 0.1


def make_model_cheap():
    from sfg.world.models import make_model

    return make_model("mlp", input_shape=(64,), num_classes=10)


@pytest.mark.parametrize("value, match", [("fp16", "precision 'fp16' is not one of fp32, tf32, "
                                                   "bf16; did you mean 'bf16'"),
                                          ("", "precision '' is not valid; choose one of: bf16, fp32, tf32")])
def test_cli_bad_precision_is_one_error_line(tmp_path, value, match):
    check_case(Case(f"precision-{value}", lambda f: ["run", "--precision", value, "--clients",
                                                     "4", "--rounds", "2"], match), tmp_path)


def test_grid_key_precision():
    from sfg.experiments.grid import parse_grid

    grid = parse_grid("base: {rounds: 4, eval_every: 2, n_clients: 6, precision: bf16}\n"
                      "rules: [dfedavg, sfg-cut]\n")
    assert [c.precision for c in grid.configs] == ["bf16", "bf16"]
    with pytest.raises(SfgError, match="precision"):
        parse_grid("base: {precision: fp8}\n")
