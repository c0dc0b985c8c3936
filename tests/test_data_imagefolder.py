"""Tests for sfg.world.data.imagefolder: train/<class>/*, test/<class>/* folders (dir and tar.gz),
parallel decoding and the decode-once cache."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sfg.errors import SfgError
from sfg.world.data import load_federated
from sfg.world.data.imagefolder import decode_images, detect_image_folder, read_image_folder

CLASSES = ("b_class", "a_class", "c_class")  # written unsorted; labels follow sorted order


def write_folder(root: Path, *, train: int = 30, test: int = 10, size=(6, 6)) -> Path:
    """Images whose red pixel (0, 0) is 40·label + index (label = sorted class position)."""
    for split, n in (("train", train), ("test", test)):
        for cls in CLASSES:
            label = sorted(CLASSES).index(cls)
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                arr = np.full((size[1], size[0], 3), 7 * i % 256, np.uint8)
                arr[0, 0] = (40 * label + i % 40, 200, 9)
                Image.fromarray(arr).save(root / split / cls / f"{i:03d}.png")
    (root / "train" / "README.txt").write_text("not an image")
    return root


def red(data, split: str) -> np.ndarray:
    norm = data.meta["normalisation"]
    x = torch.cat(list(getattr(data, f"{split}_x"))).numpy()[:, 0, 0, 0].astype(np.float64)
    return np.rint((x * norm["std"][0] + norm["mean"][0]) * norm["scale"]).astype(np.int64)


def load(root, cache, **kw):
    kw = {"n_clients": 3, "seed": 1, "min_train": 5, "test_per_client": 10, **kw}
    return load_federated("imagefolder", data_root=root, cache_dir=cache, **kw)


def test_directory_folder(tmp_path):
    root = write_folder(tmp_path / "imgs")
    d = load(root, tmp_path / "cache")
    assert d.num_classes == 3 and d.input_shape == (3, 6, 6) and not d.augment_hflip
    assert d.meta["label_names"] == ["a_class", "b_class", "c_class"]
    for split in ("train", "val", "test"):
        y = torch.cat(getattr(d, f"{split}_y")).numpy()
        np.testing.assert_array_equal(red(d, split) // 40, y)
    assert (d.sizes("train") + d.sizes("val")).sum() == 90
    assert np.all(d.sizes("test") == 10)
    assert d.meta["decoded"] is True
    assert load(root, tmp_path / "cache", **{"hflip": True}).augment_hflip


def test_archive_with_prefix_equals_directory(tmp_path):
    root = write_folder(tmp_path / "myset")
    archive = tmp_path / "arch" / "myset.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(root, arcname="myset")
    src = detect_image_folder(archive)
    assert src is not None and src.archive and src.prefix == "myset/"
    a = load(root, tmp_path / "c1")
    b = load(archive, tmp_path / "c2")
    for f in ("train_x", "train_y", "val_y", "test_x", "test_y"):
        assert all(torch.equal(x, y) for x, y in zip(getattr(a, f), getattr(b, f), strict=True))


def test_decoded_once_then_cached_and_invalidated_by_edits(tmp_path):
    root = write_folder(tmp_path / "imgs")
    cache = tmp_path / "cache"
    first = load(root, cache)
    second = load(root, cache)
    assert first.meta["decoded"] and not second.meta["decoded"]
    assert first.meta["cache"] == second.meta["cache"] and Path(first.meta["cache"]).is_file()
    Image.new("RGB", (6, 6), (255, 0, 0)).save(root / "train" / "a_class" / "new.png")
    third = load(root, cache)
    assert third.meta["decoded"] and third.meta["train_pool"] == 91


def test_default_cache_lives_next_to_the_data(tmp_path, monkeypatch):
    monkeypatch.delenv("SFG_CACHE_DIR", raising=False)
    root = write_folder(tmp_path / "imgs")
    d = load(root, None)
    assert Path(d.meta["cache"]).parent == root / ".sfg-cache"
    assert not load(root, None).meta["decoded"]


def test_grayscale_resize_and_limit(tmp_path):
    root = write_folder(tmp_path / "imgs")
    gray = load(root, tmp_path / "c", grayscale=True)
    assert gray.input_shape == (1, 6, 6)
    small = load(root, tmp_path / "c", resize=4)
    assert small.input_shape == (3, 4, 4)
    few = load(root, tmp_path / "c", limit_per_class=7, min_train=2, test_per_client=5)
    assert few.meta["train_pool"] == 21 and few.meta["test_pool"] == 21
    own = few.label_counts("train") + few.label_counts("val")
    np.testing.assert_array_equal(own.sum(0), [7, 7, 7])
    # the first 7 files of each class by name: indices 0..6 in the red pixel
    assert set((red(few, "train") % 40).tolist()) <= set(range(7))


def test_mixed_sizes_need_resize(tmp_path):
    root = write_folder(tmp_path / "imgs")
    Image.new("RGB", (9, 5)).save(root / "train" / "c_class" / "zzz.png")
    with pytest.raises(SfgError, match=r"image .*zzz.png is 9x5 but the first image is 6x6; "
                                       "pass resize=S"):
        load(root, tmp_path / "c")
    assert load(root, tmp_path / "c", resize=6).meta["train_pool"] == 91


def test_corrupt_image_and_missing_train_class(tmp_path):
    root = write_folder(tmp_path / "imgs")
    (root / "test" / "a_class" / "bad.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(SfgError, match=r"cannot decode image .*bad.jpg"):
        load(root, tmp_path / "c")
    (root / "test" / "a_class" / "bad.jpg").unlink()
    (root / "test" / "zebra").mkdir()
    Image.new("RGB", (6, 6)).save(root / "test" / "zebra" / "0.png")
    with pytest.raises(SfgError, match=r"test classes \['zebra'\] have no training images"):
        load(root, tmp_path / "c")


def test_no_image_folder_found(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(SfgError, match=r"no image folder found at .*train/<class>/\*"):
        load(tmp_path, tmp_path / "c")


def test_parallel_decoding_equals_sequential():
    rng = np.random.default_rng(0)
    blobs, names = [], []
    for i in range(2100):  # more than one 2048-image chunk
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)).save(buf, "PNG")
        blobs.append(buf.getvalue())
        names.append(f"{i}.png")
    one = decode_images(blobs, names, workers=1)
    two = decode_images(blobs, names, workers=2)
    assert one.shape == (2100, 3, 3, 5) and one.dtype == np.uint8
    np.testing.assert_array_equal(one, two)
    expect = np.asarray(Image.open(io.BytesIO(blobs[2099]))).transpose(2, 0, 1)
    np.testing.assert_array_equal(two[2099], expect)


def test_read_image_folder_arrays(tmp_path):
    root = write_folder(tmp_path / "imgs", train=4, test=2)
    arrays, info = read_image_folder(detect_image_folder(root), cache_dir=tmp_path / "c")
    assert list(arrays["classes"]) == ["a_class", "b_class", "c_class"]
    np.testing.assert_array_equal(arrays["train_y"], np.repeat([0, 1, 2], 4))
    np.testing.assert_array_equal(arrays["train_x"][:, 0, 0, 0], 40 * np.repeat([0, 1, 2], 4)
                                  + np.tile(np.arange(4), 3))
    assert arrays["mean"].shape == (3,) and info["decoded"]


def test_images_over_the_pixel_budget_are_refused_before_decoding(tmp_path, monkeypatch):
    """Seven 81-megapixel PNGs (a few hundred KB each): refused at the first one's header,
    with the figure and the budget, before any of them is decoded (a folder's
    decode time is bounded like its memory)."""
    from PIL import ImageFile

    big = io.BytesIO()
    Image.new("L", (9000, 9000), 3).save(big, "PNG")
    root = write_folder(tmp_path / "imgs", train=3, test=2)
    for i in range(7):  # after the small ones (the first image sets the size)
        (root / "train" / "c_class" / f"zz{i}.png").write_bytes(big.getvalue())
    decoded = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load",
                        lambda im: (decoded.append(im.size), real(im))[1])
    with pytest.raises(SfgError, match=r"image .*zz0\.png is 9000x9000 = 81\.0 megapixels, "
                                       r"over the per-image budget of 33\.6 megapixels "
                                       r"\(SFG_MAX_PIXELS=32M; .*raise it with "
                                       r"SFG_MAX_PIXELS=128M"):
        read_image_folder(detect_image_folder(root), cache_dir=tmp_path / "c", workers=1)
    assert decoded and (9000, 9000) not in decoded  # the small ones only
    # the budget is read at each check: lowered, the 6x6 images are over it too
    monkeypatch.setenv("SFG_MAX_PIXELS", "35")
    with pytest.raises(SfgError, match=r"is 6x6 = 0\.0 megapixels, over the per-image budget "
                                       r"of 0\.0 megapixels \(SFG_MAX_PIXELS=35;"):
        decode_images([_png(6, 6)], ["a.png"], workers=1)
    monkeypatch.setenv("SFG_MAX_PIXELS", "36")
    assert decode_images([_png(6, 6)], ["a.png"], workers=1).shape == (1, 3, 6, 6)


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()
