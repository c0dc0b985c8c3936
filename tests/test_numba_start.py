"""numba's cached machine code kept fresh across files (sfg.util.numba_start.fresh_caches):
numba keys a cached function by the text of its own file only, so sfg removes its cached
code when the text of any file whose functions numba caches has changed."""

from __future__ import annotations

import re
from pathlib import Path

from sfg.util import numba_start
from sfg.util.numba_start import COMPILED, STAMP, fresh_caches, sources_digest

SRC = Path(numba_start.__file__).resolve().parent.parent


def test_the_list_is_every_file_whose_functions_numba_caches():
    """Every sfg file with an ``njit(cache=True)`` (sfg's own njit, numba's, or the lazy one
    of sfg.round.jit) is in COMPILED, and nothing else is."""
    found = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if re.search(r"(?m)^[^#`\n]*\bnjit\([^\n]*\bcache\s*=\s*True", p.read_text("utf-8")))
    assert found == sorted(COMPILED)


def _package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    for rel in ("a/one.py", "a/two.py", "b/three.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    return root


FILES = ("a/one.py", "a/two.py", "b/three.py")


def _cached(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.nb[ic]"))


def _cache(root: Path) -> None:
    for d in ("a", "b"):
        (root / d / "__pycache__").mkdir(exist_ok=True)
        (root / d / "__pycache__" / f"{d}.f-10.py311.nbi").write_bytes(b"index")
        (root / d / "__pycache__" / f"{d}.f-10.py311.1.nbc").write_bytes(b"code")


def test_cached_code_is_kept_while_the_sources_stay_and_removed_when_one_changes(tmp_path):
    root = _package(tmp_path)
    fresh_caches(root, FILES)  # first start: the stamps are written (nothing cached yet)
    assert (root / "a" / "__pycache__" / STAMP).read_text().strip() == sources_digest(root, FILES)
    _cache(root)
    assert fresh_caches(root, FILES) == [] and len(_cached(root)) == 4  # unchanged: kept
    (root / "b" / "three.py").write_text("# b/three.py, edited\n")  # one file changes
    cleared = fresh_caches(root, FILES)
    # every folder's cached code goes: a function in a/ may call one in b/three.py
    assert cleared == [root / "a" / "__pycache__", root / "b" / "__pycache__"]
    assert _cached(root) == []
    _cache(root)  # compiled afresh, cached again: kept from now on
    assert fresh_caches(root, FILES) == [] and len(_cached(root)) == 4


def test_the_digest_follows_the_text_not_the_times(tmp_path):
    import os

    root = _package(tmp_path)
    before = sources_digest(root, FILES)
    os.utime(root / "a" / "one.py", (1, 1))  # touched, not changed (a checkout, a copy)
    assert sources_digest(root, FILES) == before
    (root / "a" / "one.py").write_text("# a/one.py\nx = 1\n")
    assert sources_digest(root, FILES) != before


def test_a_folder_that_cannot_be_made_is_left_as_it_is(tmp_path):
    root = _package(tmp_path)
    _cache(root)
    for f in (root / "b" / "__pycache__").iterdir():
        f.unlink()
    (root / "b" / "__pycache__").rmdir()
    (root / "b" / "__pycache__").write_text("not a folder")  # cannot hold a cache
    assert fresh_caches(root, FILES) == [root / "a" / "__pycache__"]
    assert _cached(root) == []
