"""Memory proportional to the data: the readers and ``channel_stats`` under an address-space
limit, the blocked statistics against the whole-array ones, the streamed tar reader, and the
compact forms the streaming readers build (they must give the same arrays as before)."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sfg.world.data import base, files
from sfg.world.data.cifar import FORMATS, PickleSource, pickle_pool
from sfg.world.data.femnist import detect_leaf, read_leaf
from sfg.world.data.imagefolder import detect_image_folder, read_image_folder

MiB = 1 << 20


# ------------------------------------------------------------------ an address-space budget
def _write_jpeg_folder(root: Path, n_train: int, n_test: int, side: int) -> Path:
    """Smooth random RGB images (small JPEGs) in two classes."""
    rng = np.random.default_rng(7)
    for split, n in (("train", n_train), ("test", n_test)):
        for k in range(n):
            cls = root / split / f"c{k % 2}"
            cls.mkdir(parents=True, exist_ok=True)
            coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(coarse).resize((side, side), Image.BILINEAR).save(
                cls / f"{k:05d}.jpg", quality=90)
    return root


# The child: everything imported and every code path warmed up on a two-image folder, then
# RLIMIT_AS = its current address space (VmSize) + the budget, then the big folder is read
# (decoded, channel_stats, cached). One glibc arena per thread would reserve 64 MiB of address
# space each (MALLOC_ARENA_MAX=2 caps that); workers=1 decodes in this process: forked workers
# inherit the limit and the pool's threads reserve stacks, which would measure the pool.
CHILD = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    import numpy as np
    from sfg.world.data.imagefolder import detect_image_folder, read_image_folder
    big, warm, cache, budget = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    read_image_folder(detect_image_folder(warm), workers=1, cache_dir=cache + "-warm")
    def vm_size():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    start = vm_size()
    resource.setrlimit(resource.RLIMIT_AS, (start + budget, resource.getrlimit(resource.RLIMIT_AS)[1]))
    arrays, info = read_image_folder(detect_image_folder(big), workers=1, cache_dir=cache)
    used = vm_size() - start
    try:  # the limit bites: one more copy of the budget does not fit
        np.ones(budget, np.uint8)
        bites = False
    except MemoryError:
        bites = True
    print(json.dumps({"decoded": info["decoded"], "mean": arrays["mean"].tolist(),
                      "std": arrays["std"].tolist(), "used": used, "bites": bites}))
""")


def test_image_folder_and_channel_stats_fit_in_two_and_a_half_times_the_data(tmp_path):
    """A folder of 1,400 128x128 RGB images (66 MiB decoded) is read, its statistics computed and
    cached in 2.5x its decoded size of address space. The whole-plane ``np.bincount`` that
    ``channel_stats`` once used (int64: 8 bytes a pixel, 175 MiB for this folder's training
    channel) and the stacked-then-transposed decode (two more copies) do not fit."""
    n_train, n_test, side = 1200, 200, 128
    big = _write_jpeg_folder(tmp_path / "big", n_train, n_test, side)
    warm = _write_jpeg_folder(tmp_path / "warm", 2, 2, 16)
    decoded = (n_train + n_test) * 3 * side * side
    budget = int(2.5 * decoded)
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", CHILD, str(big), str(warm),
                          str(tmp_path / "cache"), str(budget)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["decoded"] is True and out["bites"] is True
    assert out["used"] < budget
    # the statistics are those of the decoded training images, read back from the cache
    arrays, info = read_image_folder(detect_image_folder(big), cache_dir=tmp_path / "cache")
    assert info["decoded"] is False and arrays["train_x"].shape == (n_train, 3, side, side)
    x = arrays["train_x"].astype(np.float64) / 255.0
    np.testing.assert_allclose(out["mean"], x.mean(axis=(0, 2, 3)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["std"], x.std(axis=(0, 2, 3)), rtol=0, atol=1e-12)


# ------------------------------------------------------------------ blocked statistics
def _whole_plane_stats(x: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """channel_stats as it was: one histogram (uint8) or one float64 copy per whole channel."""
    mean, std = np.zeros(x.shape[1]), np.ones(x.shape[1])
    for c in range(x.shape[1]):
        plane = x[:, c]
        if plane.dtype == np.uint8:
            hist = np.bincount(plane.ravel(), minlength=256).astype(np.float64)
            values = np.arange(256, dtype=np.float64) / scale
            m = (hist @ values) / hist.sum()
            var = (hist @ (values - m) ** 2) / hist.sum()
        else:
            values = plane.astype(np.float64) / scale
            m, var = values.mean(), values.var()
        mean[c], std[c] = m, (np.sqrt(var) if var > 1e-12 else 1.0)
    return mean, std


@pytest.mark.parametrize("block", [1, 35, 36, 70, 71, 1000, 1 << 18])
def test_blocked_channel_stats_equal_the_whole_plane_ones(monkeypatch, block):
    rng = np.random.default_rng(block)
    x8 = rng.integers(0, 256, (37, 3, 5, 7), dtype=np.uint8)
    x8[:, 2] = 200  # a constant channel: std 1
    xf = rng.random((37, 2, 5, 7)).astype(np.float32) * 255
    monkeypatch.setattr(base, "_STATS_BLOCK", block)
    got8, want8 = base.channel_stats(x8, 255.0), _whole_plane_stats(x8, 255.0)
    assert np.array_equal(got8[0], want8[0]) and np.array_equal(got8[1], want8[1])  # exact
    assert got8[1][2] == 1.0
    gotf, wantf = base.channel_stats(xf, 255.0), _whole_plane_stats(xf, 255.0)
    np.testing.assert_allclose(gotf[0], wantf[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(gotf[1], wantf[1], rtol=0, atol=1e-12)
    if block >= 37 * 35:  # one block: the very same float operations
        assert np.array_equal(gotf[0], wantf[0]) and np.array_equal(gotf[1], wantf[1])


def test_channel_stats_temporaries_are_one_block_not_one_plane():
    x = np.random.default_rng(0).integers(0, 256, (4000, 3, 32, 32), dtype=np.uint8)  # 12 MiB
    tracemalloc.start()
    try:
        base.channel_stats(x, 255.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one whole plane widened to int64 would be 31 MiB; a block is 2 MiB (+ its ravel copy)
    assert peak < 4 * MiB, peak


# ------------------------------------------------------------------ the streamed tar reader
def _tar(path: Path, members: dict[str, bytes], mode: str, fmt=tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, mode, format=fmt) as tf:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(blob), 1.5e9 + 0.25  # a float mtime: a pax header each
            tf.addfile(info, io.BytesIO(blob))
    return path


@pytest.mark.parametrize("suffix, mode", [(".tar.gz", "w:gz"), (".tar", "w")])
def test_tar_members_are_streamed_one_at_a_time(tmp_path, suffix, mode):
    """40 MiB of members read with about one member (2 MiB) of memory, not the archive."""
    rng = np.random.default_rng(1)
    block = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    members = {f"d/{i:02d}.bin": (bytes([i]) + block) * 500 for i in range(20)}  # 2 MiB each
    path = _tar(tmp_path / f"a{suffix}", members, mode)
    tracemalloc.start()
    try:
        seen = {}
        for name, blob in files.iter_tar_files(path, lambda n: n.endswith(".bin")):
            seen[name] = (len(blob), blob[:8])
            del blob
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == {n: (len(b), b[:8]) for n, b in members.items()}
    assert peak < 8 * MiB, peak


def test_pax_and_gnu_headers_are_read_by_the_fast_reader(tmp_path, monkeypatch):
    """Python's tarfile writes a pax header for every member (float mtimes); GNU tar long
    names use 'L' blocks: both are read without falling back to tarfile, same result."""
    members = {"top/a.bin": b"a" * 700, "top/" + "x" * 150 + "/long.bin": b"long",
               "top/é.bin": b"e" * 513, "top/empty.bin": b""}
    opened = []
    real = tarfile.open

    def counting_open(*a, **k):
        opened.append(k.get("mode"))
        return real(*a, **k)

    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        path = _tar(tmp_path / f"f{fmt}.tar.gz", members, "w:gz", fmt)
        monkeypatch.setattr(files.tarfile, "open", counting_open)
        got = list(files.iter_tar_files(path, lambda n: True))
        monkeypatch.setattr(files.tarfile, "open", real)
        assert dict(got) == members and [n for n, _ in got] == list(members)
        assert opened == []
        with real(path) as tf:
            assert [m.name for m in tf.getmembers() if m.isfile()] == list(members)


def test_a_link_mid_archive_hands_the_rest_to_tarfile(tmp_path):
    path = tmp_path / "l.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, blob in (("a.bin", b"1" * 600), ("b.bin", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
            if name == "a.bin":
                link = tarfile.TarInfo("ln")
                link.type, link.linkname = tarfile.SYMTYPE, "a.bin"
                tf.addfile(link)
    assert dict(files.iter_tar_files(path, lambda n: True)) == {"a.bin": b"1" * 600,
                                                                "b.bin": b"2"}


def test_a_truncated_member_read_through_its_file_is_an_sfg_error(tmp_path):
    path = _tar(tmp_path / "t.tar", {"big.bin": bytes(range(256)) * 4096}, "w")
    raw = path.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(raw[:len(raw) // 3])
    with pytest.raises(files.SfgError, match=r"archive .*cut.tar is truncated \(member big.bin\)"):
        for _, _, fh in files.iter_tar_members(cut, lambda n: True):
            fh.read()


# ------------------------------------------------------------------ the compact forms
def _leaf(root: Path, docs: dict[str, dict]) -> Path:
    for rel, doc in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(doc))
    return root


def _shard(writers: dict[str, list[list[float]]]) -> dict:
    return {"users": list(writers), "num_samples": [len(x) for x in writers.values()],
            "user_data": {w: {"x": x, "y": [1] * len(x)} for w, x in writers.items()}}


def test_femnist_mixed_shards_keep_every_parsed_float(tmp_path):
    """One writer's pixels are exact k/255 (held as uint8 while reading), another's are not:
    the dataset is float32 and every value is the float32 json.loads gave, bit for bit."""
    rng = np.random.default_rng(3)
    exact = (rng.integers(0, 256, (4, 784)) / 255.0).tolist()
    other = rng.random((3, 784)).tolist()
    split_writer = (rng.integers(0, 256, (2, 784)) / 255.0).tolist()
    root = _leaf(tmp_path / "leaf", {
        "train/s0.json": _shard({"w1": exact, "w0": split_writer}),
        "train/s1.json": _shard({"w2": other, "w0": split_writer[::-1]}),
        "test/s0.json": _shard({"w1": exact[:1]})})
    arrays, _ = read_leaf(detect_leaf(root), cache_dir=tmp_path / "c")
    assert arrays["train_x"].dtype == np.float32 and float(arrays["scale"]) == 1.0
    want = np.asarray(split_writer + split_writer[::-1] + exact + other, np.float32)
    got = arrays["train_x"].reshape(-1, 784)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert list(arrays["train_writers"]) == ["w0", "w1", "w2"]
    assert arrays["train_offsets"].tolist() == [0, 4, 8, 11]


def test_femnist_near_exact_pixels_become_bytes(tmp_path):
    """Values within 1e-6 of k/255 but not its float32 are stored as rint(x * 255), as before."""
    rng = np.random.default_rng(4)
    k = rng.integers(0, 256, (3, 784))
    near = (k / 255.0 + 3e-7).tolist()
    root = _leaf(tmp_path / "leaf", {"train/s.json": _shard({"w": near}),
                                     "test/s.json": _shard({"w": (k[:1] / 255.0).tolist()})})
    arrays, _ = read_leaf(detect_leaf(root), cache_dir=tmp_path / "c")
    assert arrays["train_x"].dtype == np.uint8 and float(arrays["scale"]) == 255.0
    want = np.rint(np.asarray(near, np.float32) * 255).astype(np.uint8)
    assert np.array_equal(arrays["train_x"].reshape(-1, 784), want)
    assert np.array_equal(arrays["test_x"].reshape(-1, 784), k[:1].astype(np.uint8))


def _cifar_batch(seed: int, n: int) -> dict:
    rng = np.random.default_rng(seed)
    return {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, n).tolist()}


def test_cifar_batches_in_any_archive_order_and_a_repeated_member(tmp_path):
    """Batches are appended as they arrive; the split still follows data_batch_1..5 order and a
    member stored twice counts once (its last copy), as when every file was read first."""
    fmt = FORMATS[10]
    batches = {n: _cifar_batch(i, 3 + i) for i, n in enumerate(fmt.train + fmt.test)}
    path = tmp_path / "cifar-10-python.tar.gz"
    stale = _cifar_batch(99, 4)
    order = ["test_batch", "data_batch_3", "data_batch_1", "data_batch_5", "data_batch_2",
             "data_batch_4"]
    with tarfile.open(path, "w:gz") as tf:
        for i, n in enumerate(order + ["data_batch_3"]):
            blob = pickle.dumps(stale if i == 1 else batches[n], protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{n}")
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    pool = pickle_pool(PickleSource(path, "cifar-10-batches-py/", archive=True), fmt)
    want_x = np.concatenate([batches[n][b"data"] for n in fmt.train]).reshape(-1, 3, 32, 32)
    want_y = np.concatenate([batches[n][b"labels"] for n in fmt.train])
    assert np.array_equal(pool.train_x, want_x) and np.array_equal(pool.train_y, want_y)
    assert np.array_equal(pool.test_x, batches["test_batch"][b"data"].reshape(-1, 3, 32, 32))
    mean, std = base.channel_stats(want_x, 255.0)
    assert np.array_equal(pool.mean, mean) and np.array_equal(pool.std, std)
    # the same batches as a directory: the same pool
    d = tmp_path / "dir" / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for n, batch in batches.items():
        (d / n).write_bytes(pickle.dumps(batch, protocol=2))
    again = pickle_pool(PickleSource(d), fmt, limit_per_class=None)
    assert np.array_equal(again.train_x, pool.train_x) and np.array_equal(again.test_y,
                                                                          pool.test_y)


def test_gzip_members_concatenated_read_like_one(tmp_path):
    members = {f"m{i}.bin": bytes([i]) * (700_000 + i) for i in range(3)}
    raw = _tar(tmp_path / "a.tar", members, "w").read_bytes()
    path = tmp_path / "multi.tar.gz"
    path.write_bytes(gzip.compress(raw[:900_000]) + gzip.compress(raw[900_000:]) + bytes(64))
    assert dict(files.iter_tar_files(path, lambda n: True)) == members
