"""Backbones (docs/concepts/training.md#the-training-protocol) and anatomy modes (docs/concepts/outages.md#anatomy-modes) on the async (and event) protocols (sfg.clock.train): personal-head,
dfedavgm and ditto train there as in rounds. Each check can fail: a head that mixed, a
momentum that differs from the explicit one, a ditto that changed the shared models or
evaluated them instead of the personal ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sfg.clock.train import simulate_events
from sfg.sim.params import ParamSpec
from sfg.sim.run import resolve_config
from sfg.world.models import make_model

BASE = dict(dataset="digits", model="mlp", n_clients=16, rounds=16, local_steps=2,
            process="bursty:u=0.5", graph="knn:k=4", seed=4, eval_every=8, clock="virtual",
            compute="const:value=30", latency="const:value=5", jitter=0.5, rule="dfedavg")


def _run(**over):
    cfg = {**BASE, **over}
    if cfg.get("protocol") == "event":  # no timer: the event protocol refuses a jitter
        cfg.pop("jitter")
    return simulate_events(resolve_config(cfg))


def _head_mask() -> np.ndarray:
    m = make_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    return ParamSpec.from_module(m).head_mask.numpy()


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_personal_head_never_mixes_the_head(protocol, monkeypatch):
    """Devices started from different models and (almost) no training, so that a model
    changes only by aggregation: under personal-head every device's head stays its initial
    head while the rest of the model mixes as under the full backbone."""
    import sfg.sim.params as params

    common = params.init_params

    def distinct(factory, n, *, seed):
        X = common(factory, n, seed=seed)
        g = torch.Generator().manual_seed(seed)
        return X + 0.1 * torch.randn(X.shape, generator=g)

    monkeypatch.setattr(params, "init_params", distinct)
    tiny = dict(protocol=protocol, lr=1e-30)
    mixed = _run(**tiny, backbone="personal-head")["params"].numpy()
    full = _run(**tiny)["params"].numpy()
    init = _run(**tiny, rule="local")["params"].numpy()  # nobody aggregates: the initial models
    head = _head_mask()
    assert head.any() and not head.all()
    assert np.abs(mixed[:, head] - init[:, head]).max() < 1e-20
    assert np.abs(mixed[:, ~head] - init[:, ~head]).max() > 1e-3  # the body mixed
    assert np.abs(mixed[:, ~head] - full[:, ~head]).max() < 1e-6  # as under the full backbone
    assert np.abs(full[:, head] - init[:, head]).max() > 1e-3     # the full backbone mixes it


def test_dfedavgm_is_momentum_0_9_and_differs_from_plain_sgd():
    a = _run(protocol="async", backbone="dfedavgm")
    b = _run(protocol="async", momentum=0.9)
    c = _run(protocol="async")
    assert torch.equal(a["params"], b["params"])
    assert (a["params"] - c["params"]).abs().max() > 1e-4


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_ditto_keeps_the_shared_models_and_evaluates_the_personal_ones(protocol):
    """Ditto's personal models train beside the shared ones without feeding back: the shared
    models are those of the full backbone, bit for bit; the accuracies are the personal
    models' (they differ), and a larger lambda pulls the personal models to the shared."""
    full = _run(protocol=protocol)
    ditto = _run(protocol=protocol, backbone="ditto")
    assert torch.equal(ditto["params"], full["params"])
    assert ditto["accuracy"].tolist() != full["accuracy"].tolist()
    assert ditto["meta"]["schedule_digest"] == full["meta"]["schedule_digest"]
    again = _run(protocol=protocol, backbone="ditto")
    assert again["accuracy"].tolist() == ditto["accuracy"].tolist()


@pytest.mark.parametrize("protocol", ["async", "event"])
@pytest.mark.parametrize("mode", ["cannot-communicate", "cannot-train-shares",
                                  "cannot-train-adopts"])
def test_anatomy_modes_train_on_the_clock_paired_and_deterministic(mode, protocol):
    """Every rule of a seed shares the mode's schedule (its own digest, not full's); the same
    seed gives the same models; cannot-communicate trains while offline (more client-steps),
    the cannot-train modes exactly as many as full (instant uplinks: an offline tick's sends
    never delay the next online round)."""
    a = _run(protocol=protocol, anatomy=mode, rule="sfg-cut")
    b = _run(protocol=protocol, anatomy=mode, rule="sfg-cut")
    d = _run(protocol=protocol, anatomy=mode)
    full = _run(protocol=protocol, rule="sfg-cut")
    assert torch.equal(a["params"], b["params"])
    assert a["meta"]["schedule_digest"] == d["meta"]["schedule_digest"]
    assert a["meta"]["schedule_digest"] != full["meta"]["schedule_digest"]
    assert (a["params"] - full["params"]).abs().max() > 1e-4
    if mode == "cannot-communicate":
        assert a["meta"]["client_steps"] > full["meta"]["client_steps"]
    else:
        assert a["meta"]["client_steps"] == full["meta"]["client_steps"]
