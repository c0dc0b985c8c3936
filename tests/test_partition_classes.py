"""The pathological split ``classes:k=2``: shards of single classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sfg.errors import SfgError
from sfg.sim.run import simulate
from sfg.util.rng import stream
from sfg.world.data import load_federated
from sfg.world.data.partition import class_shard_partition, label_histogram, parse_partition


def _labels(counts) -> np.ndarray:
    return np.repeat(np.arange(len(counts)), counts)


@pytest.mark.parametrize("n_clients,k,counts", [
    (100, 2, [500] * 10),             # CIFAR-10 shape: 200 shards of 250
    (50, 2, [60] * 100),              # CIFAR-100 shape: one shard per class, 100 shards
    (30, 2, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]),  # digits, uneven classes
    (12, 3, [40, 7, 33, 20, 50]),
])
def test_every_client_holds_exactly_k_classes_and_examples_are_a_cover(n_clients, k, counts):
    y = _labels(counts)
    rng = np.random.default_rng(3)
    y = y[rng.permutation(y.size)]
    groups = class_shard_partition(y, n_clients, k=k, rng=stream(1, "partition"))
    assert len(groups) == n_clients
    hist = label_histogram(y, groups, len(counts))
    assert ((hist > 0).sum(axis=1) == k).all()
    flat = np.concatenate(groups)
    assert np.array_equal(np.sort(flat), np.arange(y.size))  # disjoint, every example used
    # shards within a class are near-equal: a class's per-client counts differ by at most 1
    for c in range(len(counts)):
        held = hist[:, c][hist[:, c] > 0]
        assert held.max() - held.min() <= 1


def test_shards_are_shared_out_in_proportion_to_class_sizes():
    y = _labels([300, 100])  # 3:1, N·k = 8 shards -> 6 and 2
    groups = class_shard_partition(y, 4, k=2, rng=np.random.default_rng(0))
    hist = label_histogram(y, groups, 2)
    assert ((hist > 0).sum(axis=0) == [4, 4]).all()  # at most one shard per client per class
    y = _labels([300, 100, 100, 100])  # 8 shards -> 4, 2, 1, 1 (largest remainder, capped at N)
    hist = label_histogram(y, class_shard_partition(y, 4, k=2, rng=np.random.default_rng(0)), 4)
    assert ((hist > 0).sum(axis=0) == [4, 2, 1, 1]).all()
    assert sorted(hist[:, 0][hist[:, 0] > 0]) == [75] * 4


def test_deterministic_in_the_stream_and_impossible_requests_fail_with_the_fix():
    y = _labels([20] * 10)
    a = class_shard_partition(y, 8, k=2, rng=stream(5, "partition"))
    b = class_shard_partition(y, 8, k=2, rng=stream(5, "partition"))
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    with pytest.raises(SfgError, match="lower k"):
        class_shard_partition(y, 8, k=11, rng=stream(5, "partition"))
    with pytest.raises(SfgError, match="fewer clients"):  # 3 examples per class, 20 clients
        class_shard_partition(_labels([3] * 2), 20, k=2, rng=stream(5, "partition"))
    with pytest.raises(SfgError, match="min_train"):
        class_shard_partition(y, 8, k=2, min_size=100, rng=stream(5, "partition"))


def test_parse_partition():
    assert parse_partition("classes:k=2") == ("classes", {"k": 2})
    assert parse_partition("classes") == ("classes", {"k": 2})
    assert parse_partition("dirichlet") == ("dirichlet", {})
    for bad, msg in [("clases:k=2", "did you mean 'classes'"), ("classes:k=0", ">= 1"),
                     ("classes:n=2", "no parameter 'n'"), ("classes:k=2.5", "integer")]:
        with pytest.raises(SfgError, match=msg):
            parse_partition(bad)


def test_digits_with_classes_partition_and_femnist_refuses_it():
    data = load_federated("digits", n_clients=20, seed=2, partition="classes:k=2")
    counts = data.label_counts("train") + data.label_counts("val")
    assert ((counts > 0).sum(axis=1) == 2).all()
    # label-matched test sets follow the two classes
    assert ((data.label_counts("test") > 0).sum(axis=1) <= 2).all()
    assert data.meta["partition"] == "classes:k=2"
    with pytest.raises(SfgError, match="natural split"):
        load_federated("femnist", n_clients=2, seed=1, partition="classes:k=2",
                       data_root="/nonexistent")


def test_pairing_holds_across_rules_under_the_classes_partition():
    tiny = dict(dataset="digits", model="mlp", n_clients=12, rounds=4, local_steps=2,
                batch_size=8, eval_every=2, graph="knn:k=4", backend="batched",
                partition="classes:k=2")
    ref = simulate({**tiny, "process": "none", "rule": "dfedavg"})
    for rule in ["sfg", "sfg-l"]:
        res = simulate({**tiny, "process": "none", "rule": rule})
        assert torch.equal(res.params, ref.params), rule
        assert res.meta["minibatch_digest"] == ref.meta["minibatch_digest"]
    # and the partition differs from the Dirichlet one (the setting is really used)
    dirichlet = simulate({**tiny, "partition": "dirichlet", "process": "none", "rule": "dfedavg"})
    assert dirichlet.meta["minibatch_digest"] != ref.meta["minibatch_digest"]
