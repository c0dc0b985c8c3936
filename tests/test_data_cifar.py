"""Tests for sfg.world.data.cifar: CIFAR python archives (dir and tar.gz), CIFAR-100, the real
CIFAR-10 JPEG image folder in ../shared/data."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from shared_data import CIFAR10_JPEG, DATA, require

from sfg.errors import SfgError
from sfg.world.data import load_federated
from sfg.world.data.imagefolder import detect_image_folder, image_folder_pool


# ------------------------------------------------------------------ tiny archives
def _batch(n: int, seed: int, label_key: str = "labels", n_classes: int = 10,
           extra: dict | None = None) -> dict:
    """A CIFAR batch whose red pixel (0, 0) encodes the label: v = 2·label + (i % 2)."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) * 7 + seed) % n_classes
    data = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
    data[:, 0] = 2 * labels + np.arange(n) % 2
    data[:, 1024] = 250  # green pixel (0, 0)
    data[:, 2048] = 5  # blue pixel (0, 0)
    batch = {b"batch_label": f"batch {seed}".encode(), label_key.encode(): labels.tolist(),
             b"data": data, b"filenames": [f"{i}.png".encode() for i in range(n)]}
    batch.update(extra or {})
    return batch


def write_cifar10(root: Path, *, per_batch: int = 40, n_test: int = 100,
                  protocol: int = 2) -> Path:
    """A tiny ``cifar-10-batches-py`` (5 × ``per_batch`` train images) under ``root``."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for i in range(1, 6):
        (d / f"data_batch_{i}").write_bytes(pickle.dumps(_batch(per_batch, i), protocol=protocol))
    (d / "test_batch").write_bytes(pickle.dumps(_batch(n_test, 9), protocol=protocol))
    names = [n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer", "dog",
                                  "frog", "horse", "ship", "truck")]
    (d / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}, protocol=protocol))
    return d


def write_cifar100(root: Path, *, per_class: int = 6, test_per_class: int = 3) -> Path:
    d = root / "cifar-100-python"
    d.mkdir(parents=True)
    for name, k, seed in (("train", per_class, 1), ("test", test_per_class, 2)):
        b = _batch(100 * k, seed, "fine_labels", 100)
        b[b"coarse_labels"] = [f // 5 for f in b[b"fine_labels"]]
        b[b"data"][:, 0] = b[b"fine_labels"]  # red pixel encodes the fine label
        (d / name).write_bytes(pickle.dumps(b, protocol=2))
    meta = {b"fine_label_names": [f"f{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"c{i}".encode() for i in range(20)]}
    (d / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    return d


def tar_directory(src: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src, arcname=src.name)
    return archive


def _pixels(data, split: str, channel: int) -> np.ndarray:
    """Un-normalised value of pixel (channel, 0, 0) for every image of ``split``, in 0..255."""
    norm = data.meta["normalisation"]
    x = torch.cat(list(getattr(data, f"{split}_x"))).numpy()[:, channel, 0, 0].astype(np.float64)
    v = (x * norm["std"][channel] + norm["mean"][channel]) * norm["scale"]
    assert np.allclose(v, np.rint(v), atol=1e-3)
    return np.rint(v).astype(np.int64)


def _labels(data, split: str) -> np.ndarray:
    return torch.cat(getattr(data, f"{split}_y")).numpy()


def _tv(data) -> np.ndarray:
    """Total-variation distance between each client's train+val and test label histograms."""
    own = data.label_counts("train") + data.label_counts("val")
    test = data.label_counts("test")
    return 0.5 * np.abs(own / own.sum(1, keepdims=True) - test / test.sum(1, keepdims=True)).sum(1)


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for f in ("train_x", "train_y", "val_x", "val_y", "test_x",
                                           "test_y")
               for x, y in zip(getattr(a, f), getattr(b, f), strict=True))


# ------------------------------------------------------------------ CIFAR-10 pickles
@pytest.fixture()
def cifar10_dir(tmp_path):
    return write_cifar10(tmp_path / "root")


def test_cifar10_directory(cifar10_dir):
    d = load_federated("cifar10", n_clients=5, seed=1, data_root=cifar10_dir, test_per_client=30)
    assert d.name == "cifar10" and d.num_classes == 10 and d.input_shape == (3, 32, 32)
    assert d.n_clients == 5 and d.augment_hflip
    assert d.meta["format"] == "cifar-python" and d.meta["label_names"][0] == "airplane"
    for split in ("train", "val", "test"):
        for x, y in zip(getattr(d, f"{split}_x"), getattr(d, f"{split}_y"), strict=True):
            assert x.dtype == torch.float32 and y.dtype == torch.int64
            assert x.shape[1:] == (3, 32, 32) and x.shape[0] == y.shape[0]
            assert int(y.min()) >= 0 and int(y.max()) <= 9
        # images stay with their labels and channels keep their order (R, G, B planes)
        np.testing.assert_array_equal(_pixels(d, split, 0) // 2, _labels(d, split))
        assert np.all(_pixels(d, split, 1) == 250) and np.all(_pixels(d, split, 2) == 5)
    own = d.sizes("train") + d.sizes("val")
    assert own.sum() == 200 and own.min() >= 20
    assert np.all(d.sizes("test") == 30)
    assert abs(d.sizes("val").sum() / own.sum() - 0.15) < 0.02
    assert _tv(d).mean() < 0.05
    # normalised with the statistics of the whole training split
    pooled = torch.cat(d.train_x + d.val_x)
    assert torch.allclose(pooled.mean((0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(pooled.std((0, 2, 3), correction=0), torch.ones(3), atol=1e-4)


def test_cifar10_archive_equals_directory_and_is_found_from_a_parent(cifar10_dir, tmp_path):
    archive_root = tmp_path / "downloads" / "cifar"
    archive_root.mkdir(parents=True)
    tar_directory(cifar10_dir, archive_root / "cifar-10-python.tar.gz")
    kw = {"n_clients": 4, "seed": 3, "test_per_client": 20}
    from_dir = load_federated("cifar10", data_root=cifar10_dir.parent, **kw)  # parent of the dir
    from_tar = load_federated("cifar10", data_root=tmp_path / "downloads", **kw)  # two levels up
    assert from_tar.meta["source"].endswith("cifar-10-python.tar.gz")
    assert from_tar.meta["prefix"] == "cifar-10-batches-py/"
    assert _same(from_dir, from_tar)


def test_cifar10_determinism_and_seed_dependence(cifar10_dir):
    kw = {"n_clients": 4, "data_root": cifar10_dir, "test_per_client": 20}
    a = load_federated("cifar10", seed=5, **kw)
    b = load_federated("cifar10", seed=5, **kw)
    c = load_federated("cifar10", seed=6, **kw)
    assert _same(a, b)
    assert not _same(a, c)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_pickle_protocols(tmp_path, protocol):
    d = write_cifar10(tmp_path, protocol=protocol)
    data = load_federated("cifar10", n_clients=2, seed=0, data_root=d, test_per_client=10)
    assert (data.sizes("train") + data.sizes("val")).sum() == 200


def test_cifar10_limit_per_class(cifar10_dir):
    d = load_federated("cifar10:limit_per_class=5", n_clients=2, seed=0, data_root=cifar10_dir,
                       min_train=5, test_per_client=10)
    own = d.label_counts("train") + d.label_counts("val")
    np.testing.assert_array_equal(own.sum(0), [5] * 10)
    assert d.meta["train_pool"] == 50 and d.meta["test_pool"] == 50


def test_code_executing_batch_is_refused(cifar10_dir, tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (cifar10_dir / "data_batch_2").write_bytes(pickle.dumps(
        {b"data": np.zeros((1, 3072), np.uint8), b"labels": Evil()}, protocol=2))
    with pytest.raises(SfgError, match=r"refusing to unpickle \w+\.system from .*data_batch_2: "
                                       "CIFAR archives contain only arrays"):
        load_federated("cifar10", n_clients=2, seed=0, data_root=cifar10_dir)
    assert not marker.exists()


def test_missing_and_malformed_batches(cifar10_dir):
    (cifar10_dir / "data_batch_3").unlink()
    with pytest.raises(SfgError, match="lacks data_batch_3; re-extract cifar-10-python.tar.gz"):
        load_federated("cifar10", n_clients=2, seed=0, data_root=cifar10_dir)
    (cifar10_dir / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((2, 100),
                                                                               np.uint8),
                                                             b"labels": [0, 1]}))
    with pytest.raises(SfgError, match=r"data_batch_3: 'data' must be a uint8 array \[n, 3072\]"):
        load_federated("cifar10", n_clients=2, seed=0, data_root=cifar10_dir)
    (cifar10_dir / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072),
                                                                               np.uint8),
                                                             b"labels": [0, 10]}))
    with pytest.raises(SfgError, match="data_batch_3: labels must lie in 0..9"):
        load_federated("cifar10", n_clients=2, seed=0, data_root=cifar10_dir)
    (cifar10_dir / "data_batch_3").write_bytes(b"\x80\x02}q\x00")
    with pytest.raises(SfgError, match="cannot read .*data_batch_3 as a CIFAR python pickle"):
        load_federated("cifar10", n_clients=2, seed=0, data_root=cifar10_dir)


def test_wrong_path_lists_what_was_looked_for(tmp_path):
    with pytest.raises(SfgError) as info:
        load_federated("cifar10", n_clients=2, seed=0, data_root=tmp_path)
    msg = str(info.value)
    assert "no CIFAR-10 data found at" in msg and "cifar-10-batches-py/" in msg
    assert "cifar-10-python.tar.gz" in msg and "image folder" in msg and "\n" not in msg
    with pytest.raises(SfgError, match="does not exist"):
        load_federated("cifar10", n_clients=2, seed=0, data_root=tmp_path / "nope")
    with pytest.raises(SfgError, match="cifar10 needs a data root|CIFAR-10 data needs a data"):
        load_federated("cifar10", n_clients=2, seed=0)


def test_impossible_partition_is_one_line(cifar10_dir):
    with pytest.raises(SfgError) as info:
        load_federated("cifar10", n_clients=20, seed=0, data_root=cifar10_dir)  # 200 < 20·20
    assert "lower the minimum (the dataset parameter min_train, e.g. cifar10:min_train=5) or use fewer clients" in str(info.value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ CIFAR-100
def test_cifar100_fine_and_coarse(tmp_path):
    d = write_cifar100(tmp_path)
    tar_directory(d, tmp_path / "cifar-100-python.tar.gz")
    fine = load_federated("cifar100", n_clients=3, seed=2, data_root=d, test_per_client=300)
    assert fine.num_classes == 100 and fine.meta["label_names"][7] == "f7"
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(_pixels(fine, split, 0), _labels(fine, split))
    assert (fine.sizes("train") + fine.sizes("val")).min() >= 20
    assert fine.meta["test_repeats"] > 0  # 3 test images per class: some drawn twice
    assert _tv(fine).mean() < 0.05
    coarse = load_federated("cifar100:labels=coarse", n_clients=3, seed=2,
                            data_root=tmp_path / "cifar-100-python.tar.gz", test_per_client=60)
    assert coarse.num_classes == 20 and coarse.meta["label_names"][3] == "c3"
    np.testing.assert_array_equal(_pixels(coarse, "train", 0) // 5, _labels(coarse, "train"))
    with pytest.raises(SfgError, match="labels must be 'fine' or 'coarse'"):
        load_federated("cifar100:labels=medium", n_clients=3, seed=2, data_root=d)


def test_cifar10_is_not_confused_with_cifar100(tmp_path):
    write_cifar100(tmp_path)
    with pytest.raises(SfgError, match="no CIFAR-10 data found"):
        load_federated("cifar10", n_clients=2, seed=0, data_root=tmp_path)


def test_image_folder_with_wrong_class_count(tmp_path):
    for split in ("train", "test"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            Image.new("RGB", (4, 4), (1, 2, 3)).save(tmp_path / split / cls / "0.png")
    with pytest.raises(SfgError, match="has 2 class folders, CIFAR-10 needs 10"):
        load_federated("cifar10", n_clients=1, seed=0, data_root=tmp_path,
                       cache_dir=tmp_path / "cache")


# ------------------------------------------------------------------ the real CIFAR-10 JPEGs
LIMIT = 250  # first 250 images per class and split: 2,500 train, 2,500 test (keeps tests fast)


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sfg-cifar-cache")


@pytest.fixture(scope="session")
def real_cifar(real_cache):
    require(CIFAR10_JPEG)
    return load_federated(f"cifar10:limit_per_class={LIMIT}", n_clients=20, seed=1,
                          data_root=DATA, cache_dir=real_cache)


def test_real_cifar10_jpeg(real_cifar):
    d = real_cifar
    assert d.meta["source"].endswith("cifar10_jpeg_q75_raw.tar.gz")
    assert d.meta["format"] == "image-folder"
    assert d.meta["label_names"] == ["airplane", "automobile", "bird", "cat", "deer", "dog",
                                     "frog", "horse", "ship", "truck"]
    assert d.input_shape == (3, 32, 32) and d.num_classes == 10 and d.augment_hflip
    own = d.sizes("train") + d.sizes("val")
    assert own.sum() == 10 * LIMIT and own.min() >= 20
    assert np.all(d.sizes("test") == 300)
    assert abs(d.sizes("val").sum() / own.sum() - 0.15) < 0.01
    assert _tv(d).mean() < 0.01  # stratified: only rounding separates the two
    y = torch.cat(d.train_y)
    assert y.dtype == torch.int64 and int(y.min()) == 0 and int(y.max()) == 9
    assert all(x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32) for x in d.test_x)
    # label skew: the average client's largest class is far above 10 %
    shares = (d.label_counts("train") + d.label_counts("val")) / own[:, None]
    assert shares.max(1).mean() > 0.3


def test_real_cifar10_cached_reload_is_identical(real_cifar, real_cache):
    again = load_federated(f"cifar10:limit_per_class={LIMIT}", n_clients=20, seed=1,
                           data_root=DATA, cache_dir=real_cache)
    assert again.meta["decoded"] is False  # read from the cache, not decoded again
    assert _same(real_cifar, again)
    other = load_federated(f"cifar10:limit_per_class={LIMIT}", n_clients=20, seed=2,
                           data_root=DATA, cache_dir=real_cache)
    assert not _same(real_cifar, other)


def test_real_cifar10_pixels_match_pillow(real_cifar, real_cache):
    source = detect_image_folder(CIFAR10_JPEG)
    pool = image_folder_pool(source, limit_per_class=LIMIT, cache_dir=real_cache)
    assert pool.train_x.shape == (10 * LIMIT, 3, 32, 32) and pool.train_x.dtype == np.uint8
    wanted = {"train/airplane/0000.jpg": 0, f"train/airplane/{LIMIT - 1:04d}.jpg": LIMIT - 1,
              "train/automobile/0000.jpg": LIMIT}  # position in the pool (sorted, limited)
    found = {}
    with tarfile.open(CIFAR10_JPEG, "r|gz") as tf:  # independent reader: the stdlib's
        for member in tf:
            if member.name in wanted:
                found[member.name] = tf.extractfile(member).read()
                if len(found) == len(wanted):
                    break
    assert len(found) == len(wanted)
    for name, row in wanted.items():
        expect = np.asarray(Image.open(io.BytesIO(found[name])).convert("RGB")).transpose(2, 0, 1)
        np.testing.assert_array_equal(pool.train_x[row], expect)
    assert pool.train_y[LIMIT - 1] == 0 and pool.train_y[LIMIT] == 1
    assert pool.meta["decoded"] is False  # the session cache was reused
