"""Tests for sfg.world.data.femnist: LEAF JSON shards (dir and tar.gz), writer split, the real
5 % FEMNIST sample in ../shared/data."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import DATA, FEMNIST, needs

from sfg.errors import SfgError
from sfg.world.data import load_federated
from sfg.world.data.femnist import detect_leaf, read_leaf

# writer -> (index, train samples, test samples); None = absent from that split
WRITERS = {"f0001_01": (1, 30, 5), "f0002_02": (2, 12, 4), "f0003_03": (3, 8, 3),
           "f0004_04": (4, 25, 6), "f0005_05": (5, 40, 2), "f0006_06": (6, 20, None),
           "f0007_07": (7, None, 7)}
SHARDS = {"train": [["f0001_01", "f0002_02", "f0003_03", "f0006_06"], ["f0004_04", "f0005_05"]],
          "test": [["f0001_01", "f0002_02", "f0003_03", "f0004_04"], ["f0005_05", "f0007_07"]]}


def _samples(index: int, n: int, seed: int, exact: bool = True):
    """x: pixel 0 = label/255, pixel 1 = writer index/255, rest random multiples of 1/255."""
    rng = np.random.default_rng(seed)
    y = (index * 10 + np.arange(n)) % 62
    x = rng.integers(0, 256, (n, 784)) / 255.0
    if not exact:
        x = rng.random((n, 784))
    x[:, 0] = y / 255.0
    x[:, 1] = index / 255.0
    return x.tolist(), y.tolist()


def write_leaf(root: Path, *, exact: bool = True) -> Path:
    for split, shards in SHARDS.items():
        (root / split).mkdir(parents=True)
        for k, writers in enumerate(shards):
            users, nums, data = [], [], {}
            for w in writers:
                index, n_train, n_test = WRITERS[w]
                n = n_train if split == "train" else n_test
                x, y = _samples(index, n, index * 2 + (split == "test"), exact)
                users.append(w)
                nums.append(n)
                data[w] = {"x": x, "y": y}
            doc = {"users": users, "num_samples": nums, "user_data": data}
            (root / split / f"all_data_{k}_niid_05_keep_0_{split}_9.json").write_text(
                json.dumps(doc))
    return root


def pixel(data, split: str, k: int) -> list[np.ndarray]:
    norm = data.meta["normalisation"]
    return [np.rint((x.numpy()[:, 0, 0, k] * norm["std"][0] + norm["mean"][0]) * norm["scale"])
            .astype(np.int64) for x in getattr(data, f"{split}_x")]


@pytest.fixture()
def leaf_dir(tmp_path):
    return write_leaf(tmp_path / "femnist" / "data")


def load(root, cache, **kw):
    kw = {"n_clients": 3, "seed": 0, "min_samples": 10, **kw}
    return load_federated("femnist", data_root=root, cache_dir=cache, **kw)


def test_writer_split(leaf_dir, tmp_path):
    d = load(leaf_dir, tmp_path / "c")
    assert d.name == "femnist" and d.num_classes == 62 and d.input_shape == (1, 28, 28)
    assert not d.augment_hflip and d.n_clients == 3
    assert d.meta["skipped_writers"] == 2 and d.meta["eligible_writers"] == 4
    assert d.meta["writers_with_both_splits"] == 5
    chosen = d.meta["writers"]
    assert len(set(chosen)) == 3 and set(chosen) <= {"f0001_01", "f0002_02", "f0004_04",
                                                     "f0005_05"}
    own = d.sizes("train") + d.sizes("val")
    for i, w in enumerate(chosen):
        index, n_train, n_test = WRITERS[w]
        assert own[i] == n_train and d.sizes("test")[i] == n_test
        for split in ("train", "val", "test"):
            # every sample of client i is its own writer's, with its own label
            assert np.all(pixel(d, split, 1)[i] == index)
            np.testing.assert_array_equal(pixel(d, split, 0)[i],
                                          getattr(d, f"{split}_y")[i].numpy())
    assert np.all(d.sizes("val") == np.floor(0.15 * own + 0.5))
    for split in ("train", "val", "test"):
        for x, y in zip(getattr(d, f"{split}_x"), getattr(d, f"{split}_y"), strict=True):
            assert x.dtype == torch.float32 and y.dtype == torch.int64
            assert x.shape[1:] == (1, 28, 28)


def test_archive_with_leaf_layout_equals_directory(leaf_dir, tmp_path):
    archive = tmp_path / "femnist_leaf.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(leaf_dir.parent.parent, arcname="leaf")  # leaf/femnist/data/{train,test}
    src = detect_leaf(archive)
    assert src is not None and src.prefix == "leaf/femnist/data/"
    a = load(leaf_dir.parent, tmp_path / "c1")  # found one level below
    b = load(tmp_path, tmp_path / "c2")  # the archive, found below tmp_path
    assert b.meta["source"].endswith("femnist_leaf.tar.gz")
    assert a.meta["writers"] == b.meta["writers"]
    for f in ("train_x", "train_y", "val_x", "test_x", "test_y"):
        assert all(torch.equal(x, y) for x, y in zip(getattr(a, f), getattr(b, f), strict=True))


def test_determinism_and_seed_dependence(leaf_dir, tmp_path):
    cache = tmp_path / "c"
    first = load(leaf_dir, cache, n_clients=2)
    again = load(leaf_dir, cache, n_clients=2)
    assert again.meta["decoded"] is False
    assert first.meta["writers"] == again.meta["writers"]
    assert all(torch.equal(x, y) for x, y in zip(first.val_x, again.val_x, strict=True))
    draws = {tuple(load(leaf_dir, cache, n_clients=2, seed=s).meta["writers"]) for s in range(8)}
    assert len(draws) > 1


def test_too_few_writers_says_how_many_and_the_fix(leaf_dir, tmp_path):
    with pytest.raises(SfgError, match="only 4 writers have at least 10 training samples and a "
                                       "test split, 5 clients requested; lower min_samples"):
        load(leaf_dir, tmp_path / "c", n_clients=5)
    with pytest.raises(SfgError, match="only 0 writers have at least 250"):
        load_federated("femnist", n_clients=1, seed=0, data_root=leaf_dir,
                       cache_dir=tmp_path / "c")


def test_min_train_is_an_alias_of_min_samples(leaf_dir, tmp_path):
    d = load_federated("femnist", n_clients=1, seed=0, data_root=leaf_dir, min_train=26,
                       cache_dir=tmp_path / "c")
    assert d.meta["writers"] == ["f0005_05"] and d.meta["min_samples"] == 26
    with pytest.raises(SfgError, match="min_samples=10 and min_train=12 disagree"):
        load(leaf_dir, tmp_path / "c", min_train=12)


def test_test_per_client_subsamples_the_writers_test_split(leaf_dir, tmp_path):
    d = load(leaf_dir, tmp_path / "c", test_per_client=3)
    for i, w in enumerate(d.meta["writers"]):
        assert d.sizes("test")[i] == min(3, WRITERS[w][2])


def test_non_byte_pixels_are_kept_as_floats(tmp_path):
    root = write_leaf(tmp_path / "leaf", exact=False)
    arrays, _ = read_leaf(detect_leaf(root), cache_dir=tmp_path / "c")
    assert arrays["train_x"].dtype == np.float32 and float(arrays["scale"]) == 1.0
    d = load(root, tmp_path / "c")
    assert d.meta["normalisation"]["scale"] == 1.0
    exact, _ = read_leaf(detect_leaf(write_leaf(tmp_path / "exact")), cache_dir=tmp_path / "c")
    assert exact["train_x"].dtype == np.uint8 and float(exact["scale"]) == 255.0


@pytest.mark.parametrize("doc, match", [
    ("{not json", "LEAF shard .*bad.json: invalid JSON"),
    (json.dumps({"users": []}), "has no 'user_data' object"),
    (json.dumps({"user_data": {"w": {"x": [[0.5] * 783], "y": [1]}}}), "lists of 784 values"),
    (json.dumps({"user_data": {"w": {"x": [[0.5] * 784], "y": [62]}}}), "labels outside 0..61"),
    (json.dumps({"user_data": {"w": {"x": [[0.5] * 784], "y": [1, 2]}}}), "1 images but 2 labels"),
    (json.dumps({"user_data": {"w": {"x": [[0.5] * 784]}}}), "lacks 'x' or 'y'"),
])
def test_malformed_shards(leaf_dir, tmp_path, doc, match):
    (leaf_dir / "train" / "bad.json").write_text(doc)
    with pytest.raises(SfgError, match=match):
        load(leaf_dir, tmp_path / "c")


def test_wrong_path(tmp_path):
    (tmp_path / "femnist").mkdir()
    with pytest.raises(SfgError, match=r"no FEMNIST \(LEAF\) data found at .*train/\*.json"):
        load(tmp_path, tmp_path / "c")


# ------------------------------------------------------------------ the real LEAF sample
@pytest.fixture(scope="session")
def real_femnist_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sfg-femnist-cache")


@needs(FEMNIST)
def test_real_femnist(real_femnist_cache):
    d = load_federated("femnist", n_clients=20, seed=1, data_root=DATA, min_samples=100,
                       cache_dir=real_femnist_cache)
    # README: train 105 writers (all with test data), test 184 writers -> 79 test-only
    assert d.meta["writers_with_both_splits"] == 105 and d.meta["skipped_writers"] == 79
    assert 20 <= d.meta["eligible_writers"] <= 105
    arrays, info = read_leaf(detect_leaf(Path(d.meta["source"])), cache_dir=real_femnist_cache)
    assert info["decoded"] is False
    assert arrays["train_x"].shape == (14708, 1, 28, 28) and arrays["test_y"].size == 4088
    assert np.unique(np.concatenate([arrays["train_y"], arrays["test_y"]])).size == 62
    writers = list(arrays["test_writers"])
    offsets = arrays["test_offsets"]
    own = d.sizes("train") + d.sizes("val")
    assert own.min() >= 100
    assert abs(d.sizes("val").sum() / own.sum() - 0.15) < 0.01
    for i, w in enumerate(d.meta["writers"]):
        k = writers.index(w)
        expected = arrays["test_y"][offsets[k]:offsets[k + 1]]
        np.testing.assert_array_equal(d.test_y[i].numpy(), expected)  # its own test split
    y = torch.cat(d.train_y)
    assert int(y.min()) >= 0 and int(y.max()) <= 61
    other = load_federated("femnist", n_clients=20, seed=2, data_root=DATA, min_samples=100,
                           cache_dir=real_femnist_cache)
    assert other.meta["writers"] != d.meta["writers"]
