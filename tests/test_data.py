"""Tests for sfg.world.data: the registry, load_federated, FederatedData and the embedded digits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sfg.errors import SfgError
from sfg.util.rng import stream
from sfg.world.data import DATASETS, FederatedData, dataset_names, load_federated
from sfg.world.data.base import channel_stats
from sfg.world.data.digits import default_min_train, digits_pool, stratified_split


def _same(a: FederatedData, b: FederatedData) -> bool:
    return all(torch.equal(x, y) for f in ("train_x", "train_y", "val_x", "val_y", "test_x",
                                           "test_y")
               for x, y in zip(getattr(a, f), getattr(b, f), strict=True))


@pytest.fixture(scope="module")
def digits100():
    return load_federated("digits", n_clients=100, seed=1)


def test_registry_names():
    assert dataset_names() == ["cifar10", "cifar100", "digits", "femnist", "imagefolder"]
    assert "digits" in DATASETS


def test_digits_with_defaults_at_n100(digits100):
    d = digits100
    assert d.name == "digits" and d.n_clients == 100 and d.num_classes == 10
    assert d.input_shape == (1, 8, 8) and not d.augment_hflip
    assert d.meta["source"] == "sklearn.datasets.load_digits"  # embedded: no download
    assert d.meta["min_train"] == 3 and d.meta["alpha"] == 0.3
    own = d.sizes("train") + d.sizes("val")
    assert own.min() >= 3 and d.sizes("train").min() >= 1  # every client non-empty
    assert own.sum() == d.meta["train_pool"] == 1258 and d.meta["test_pool"] == 539
    assert np.all(d.sizes("val") >= 1)  # every client has at least 2 examples -> 1 held out
    assert 0.13 < d.sizes("val").sum() / own.sum() < 0.2
    assert np.all(d.sizes("test") == 50)
    for split in ("train", "val", "test"):
        for x, y in zip(getattr(d, f"{split}_x"), getattr(d, f"{split}_y"), strict=True):
            assert x.dtype == torch.float32 and x.shape[1:] == (1, 8, 8)
            assert y.dtype == torch.int64 and x.shape[0] == y.shape[0]
            assert int(y.min()) >= 0 and int(y.max()) <= 9


def test_digits_test_sets_follow_each_clients_labels(digits100):
    own = digits100.label_counts("train") + digits100.label_counts("val")
    test = digits100.label_counts("test")
    assert np.all(test[own == 0] == 0)  # never a class the client does not have
    tv = 0.5 * np.abs(own / own.sum(1, keepdims=True) - test / 50).sum(1)
    assert tv.max() <= 10 / (2 * 50) + 1e-12  # largest-remainder rounding bound
    assert tv.mean() < 0.05


def test_digits_label_skew_is_real(digits100):
    own = digits100.label_counts("train") + digits100.label_counts("val")
    assert (own.max(1) / own.sum(1)).mean() > 0.4  # IID would be ~0.2 at these sizes


def test_digits_normalised_with_fixed_constants(digits100):
    norm = digits100.meta["normalisation"]
    images = digits_pool(0).train_x  # any seed: constants come from all 1,797 images
    assert norm["scale"] == 16.0
    from sklearn.datasets import load_digits

    pixels = load_digits().images / 16.0
    assert np.isclose(norm["mean"][0], pixels.mean()) and np.isclose(norm["std"][0], pixels.std())
    x0 = digits100.train_x[0].numpy() * norm["std"][0] + norm["mean"][0]
    v = x0 * 16
    assert np.allclose(v, np.rint(v), atol=1e-4) and v.min() >= -1e-4 and v.max() <= 16 + 1e-4
    assert images.dtype == np.uint8


def test_digits_determinism_and_seed_dependence():
    a = load_federated("digits", n_clients=10, seed=4)
    b = load_federated("digits", n_clients=10, seed=4)
    c = load_federated("digits", n_clients=10, seed=5)
    assert _same(a, b)
    assert not _same(a, c)


def test_digits_pools_are_disjoint_and_stratified():
    y = np.repeat(np.arange(3), 10)
    train, test = stratified_split(y, 0.3, stream(0, "x"))
    assert np.intersect1d(train, test).size == 0 and train.size + test.size == 30
    np.testing.assert_array_equal(np.bincount(y[test]), [3, 3, 3])
    from sklearn.datasets import load_digits

    labels = load_digits().target
    train, test = stratified_split(labels, 0.3, stream(7, "digits-split"))
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1797))
    per_class = np.bincount(labels)
    np.testing.assert_array_equal(np.bincount(labels[test]), np.floor(0.3 * per_class + 0.5))
    pool = digits_pool(7)
    np.testing.assert_array_equal(pool.test_y, labels[test])
    np.testing.assert_array_equal(pool.train_y, labels[train])


def test_default_min_train_rule():
    assert default_min_train(1258, 10) == 5
    assert default_min_train(1258, 100) == 3
    assert default_min_train(1258, 200) == 1
    assert default_min_train(1258, 50) == 5


def test_digits_options():
    d = load_federated("digits:test_fraction=0.5,balance=false", n_clients=5, seed=0,
                       min_train=10, test_per_client=20, val_fraction=0.0)
    from sklearn.datasets import load_digits

    per_class = np.bincount(load_digits().target)
    assert d.meta["test_pool"] == np.floor(0.5 * per_class + 0.5).sum() and not d.meta["balance"]
    assert np.all(d.sizes("val") == 0) and np.all(d.sizes("test") == 20)
    assert d.sizes("train").min() >= 10


def test_channel_stats_exact_for_uint8():
    x = np.array([[[[0, 255]], [[10, 20]]]], np.uint8)  # [1, 2, 1, 2]
    mean, std = channel_stats(x, 255.0)
    np.testing.assert_allclose(mean, [0.5, 15 / 255])
    np.testing.assert_allclose(std, [0.5, 5 / 255])
    mean, std = channel_stats(np.zeros((3, 1, 2, 2), np.float32), 1.0)
    assert std[0] == 1.0  # constant channel: no division by zero


def test_federated_data_helpers():
    d = load_federated("digits", n_clients=3, seed=0)
    assert d.label_counts("test").shape == (3, 10)
    assert d.label_counts("test").sum() == 150
    with pytest.raises(SfgError, match="unknown split 'dev'"):
        d.sizes("dev")


# ------------------------------------------------------------------ bad input
def test_unknown_dataset_did_you_mean():
    with pytest.raises(SfgError, match="unknown dataset 'cifar1o'; did you mean 'cifar10'"):
        load_federated("cifar1O", n_clients=2, seed=0)
    with pytest.raises(SfgError, match="unknown dataset 'digitz'; did you mean 'digits'"):
        load_federated("digitz", n_clients=2, seed=0)


def test_unknown_option_did_you_mean():
    with pytest.raises(SfgError, match="unknown parameter 'limit' for dataset 'cifar10'"):
        load_federated("cifar10:limit=3", n_clients=2, seed=0)
    with pytest.raises(SfgError, match="unknown parameter 'test_fractoin'.*did you mean "
                                       "'test_fraction'"):
        load_federated("digits", n_clients=2, seed=0, test_fractoin=0.2)
    with pytest.raises(SfgError, match="takes no '\\+' modifiers"):
        load_federated("digits+flip", n_clients=2, seed=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_clients": 0}, "n_clients must be an integer >= 1"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"alpha": 0.0}, "alpha .* must be a positive number"),
    ({"alpha": float("inf")}, "alpha .* must be a positive number"),
    ({"val_fraction": 1.0}, r"val_fraction must be a number in \[0.0, 1.0\)"),
    ({"min_train": -2}, "min_train must be an integer >= 0"),
    ({"test_per_client": 0}, "test_per_client must be an integer >= 1"),
    ({"test_fraction": 0.0}, r"test_fraction must be a number in \(0.0, 1.0\)"),
    ({"balance": "maybe"}, "balance must be true or false"),
])
def test_bad_arguments(kwargs, match):
    kw = {"n_clients": 2, "seed": 0, **kwargs}
    with pytest.raises(SfgError, match=match):
        load_federated("digits", **kw)


def test_impossible_partition_is_a_one_line_error():
    with pytest.raises(SfgError) as info:  # more clients than digits' training examples
        load_federated("digits", n_clients=2000, seed=0)
    msg = str(info.value)
    assert "raise alpha" in msg or "fewer clients" in msg
    assert "\n" not in msg
    with pytest.raises(SfgError, match="lower the minimum"):
        load_federated("digits", n_clients=100, seed=0, min_train=20)


def test_registry_validates_config_strings():
    """The experiment config checks dataset strings with DATASETS.check_params."""
    assert DATASETS.check_params("cifar10", {"limit_per_class": 5})["limit_per_class"] == 5
    with pytest.raises(SfgError, match="did you mean 'limit_per_class'"):
        DATASETS.check_params("cifar10", {"limit_per_clas": 5})
