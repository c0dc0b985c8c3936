"""Tests for sfg.world.data.files: locating data, the fast tar reader, the decoded-array cache."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.world.data.files import (
    _parse_ustar,
    cache_directory,
    cache_path,
    iter_tar_files,
    load_cached,
    locate,
    normalized_name,
    save_cached,
    source_fingerprint,
)


def _write_tar(path: Path, files: dict[str, bytes], *, fmt=tarfile.USTAR_FORMAT, mode="w:gz"):
    with tarfile.open(path, mode, format=fmt) as tf:
        dirs = sorted({str(Path(n).parent) for n in files} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        for name, blob in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))


FILES = {"top/train/cat/0.bin": b"abc", "top/train/dog/1.bin": b"x" * 700,
         "top/test/cat/2.bin": b"", "top/readme.txt": b"hello" * 300}


@pytest.mark.parametrize("suffix, mode", [(".tar.gz", "w:gz"), (".tar", "w")])
def test_fast_reader_agrees_with_tarfile(tmp_path, suffix, mode):
    path = tmp_path / f"a{suffix}"
    _write_tar(path, FILES, mode=mode)
    got = dict(iter_tar_files(path, lambda n: True))
    assert got == FILES
    only = dict(iter_tar_files(path, lambda n: n.endswith(".bin")))
    assert set(only) == {n for n in FILES if n.endswith(".bin")}


def test_fast_parser_matches_tarfile_offsets(tmp_path):
    path = tmp_path / "a.tar"
    _write_tar(path, FILES, mode="w")
    raw = path.read_bytes()
    entries = _parse_ustar(raw)
    with tarfile.open(path) as tf:
        expected = [(m.name, m.offset_data, m.size) for m in tf.getmembers() if m.isfile()]
    assert entries == expected


def test_long_names_fall_back_to_tarfile(tmp_path):
    long_name = "d/" + "x" * 150 + "/file.bin"
    files = {long_name: b"long", "d/short.bin": b"s"}
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"long{fmt}.tar.gz"
        _write_tar(path, files, fmt=fmt)
        assert dict(iter_tar_files(path, lambda n: True)) == files


def test_bad_checksum_falls_back_and_broken_archive_is_an_sfg_error(tmp_path):
    path = tmp_path / "a.tar"
    _write_tar(path, FILES, mode="w")
    raw = bytearray(path.read_bytes())
    raw[0] = ord("T")  # header 0 no longer matches its checksum
    assert _parse_ustar(bytes(raw)) is None
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(SfgError, match="cannot decompress archive"):
        list(iter_tar_files(broken, lambda n: True))


# ------------------------------------------------------------------ locate
def _accept_marker(path: Path):
    return path if (path / "MARKER").is_file() else None


def test_locate_searches_two_levels_below_with_a_name_hint(tmp_path):
    target = tmp_path / "mnist-stuff" / "inner"
    target.mkdir(parents=True)
    (target / "MARKER").write_text("")
    decoy = tmp_path / "other" / "inner"
    decoy.mkdir(parents=True)
    (decoy / "MARKER").write_text("")
    found = locate(tmp_path, _accept_marker, what="X", looked_for="MARKER", hint="mnist")
    assert found == target
    assert locate(target, _accept_marker, what="X", looked_for="MARKER", hint="nomatch") == target


def test_locate_stops_at_depth_two(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "MARKER").write_text("")
    with pytest.raises(SfgError) as info:
        locate(tmp_path, _accept_marker, what="X data", looked_for="a MARKER file", fix="fix it")
    msg = str(info.value)
    assert msg.startswith(f"no X data found at {tmp_path} (looked for a MARKER file")
    assert msg.endswith("; fix it") and "\n" not in msg


def test_locate_missing_root_and_no_root():
    with pytest.raises(SfgError, match="data root /no/such/dir does not exist; point --data-root at M"):
        locate("/no/such/dir", _accept_marker, what="X", looked_for="M")
    with pytest.raises(SfgError, match="X needs a data root"):
        locate(None, _accept_marker, what="X", looked_for="M")


def test_normalized_name():
    assert normalized_name("CIFAR-10_jpeg q75") == "cifar10jpegq75"


# ------------------------------------------------------------------ cache
def test_cache_directory_prefers_the_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv("SFG_CACHE_DIR", raising=False)
    (tmp_path / "data.tar.gz").write_bytes(b"")
    assert cache_directory(tmp_path / "data.tar.gz") == tmp_path / ".sfg-cache"
    assert cache_directory(tmp_path) == tmp_path / ".sfg-cache"
    explicit = tmp_path / "elsewhere"
    assert cache_directory(tmp_path, explicit) == explicit and explicit.is_dir()
    monkeypatch.setenv("SFG_CACHE_DIR", str(tmp_path / "env"))
    assert cache_directory(tmp_path) == tmp_path / "env"


def test_unusable_local_cache_falls_back_to_home(tmp_path, monkeypatch):
    monkeypatch.delenv("SFG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    root = tmp_path / "root"
    root.mkdir()
    (root / ".sfg-cache").write_text("a file, not a directory")  # cannot be used
    assert cache_directory(root) == tmp_path / "home-cache" / "sfg"


def test_unwritable_explicit_cache_dir_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SfgError, match="is not a writable directory"):
        cache_directory(tmp_path, blocker / "sub")


def test_cache_round_trip_and_key_follows_the_source(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"one")
    key1 = cache_path(tmp_path, "k", src, {"limit": 1})
    assert cache_path(tmp_path, "k", src, {"limit": 1}) == key1
    assert cache_path(tmp_path, "k", src, {"limit": 2}) != key1
    arrays = {"x": np.arange(6, dtype=np.uint8).reshape(2, 3), "names": np.array(["a", "b"])}
    save_cached(key1, arrays)
    back = load_cached(key1)
    assert set(back) == {"x", "names"}
    np.testing.assert_array_equal(back["x"], arrays["x"])
    src.write_bytes(b"changed!")  # new size (and mtime): a new key
    assert cache_path(tmp_path, "k", src, {"limit": 1}) != key1
    key1.write_bytes(b"truncated")
    assert load_cached(key1) is None  # unreadable cache -> decode again
    assert load_cached(tmp_path / "missing.npz") is None


def test_directory_fingerprint_ignores_hidden_cache(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    before = source_fingerprint(tmp_path)
    (tmp_path / ".sfg-cache").mkdir()
    (tmp_path / ".sfg-cache" / "big.npz").write_bytes(b"x" * 100)
    assert source_fingerprint(tmp_path) == before
    (tmp_path / "b.txt").write_text("bb")
    assert source_fingerprint(tmp_path)["files"] == 2
