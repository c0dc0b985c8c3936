"""FEMNIST from LEAF's JSON shards, one client per writer (docs/concepts/training.md#the-training-protocol).

Input: ``train/*.json`` and ``test/*.json`` (LEAF's ``data/femnist/data`` layout) in a
directory or a tar(.gz), at ``--data-root`` or up to two levels below it. Each shard is
``{"users": [...], "num_samples": [...], "user_data": {writer: {"x": [[784 floats]],
"y": [int]}}}``; x is a row-major 28×28 image in [0, 1] (1 = white background), y in 0..61.

Per seed (stream ``"writers"``) N writers are drawn without replacement among those with at
least ``min_samples`` training samples (default 250, docs/concepts/training.md#the-training-protocol) and a test split; each client
trains on its writer's training samples (15 % held out for validation) and is evaluated on
the same writer's test split (all of it, or ``test_per_client`` drawn from it). Writers present
in only one split are skipped; ``meta["skipped_writers"]`` counts them. Images are
standardised with the mean/std of all loaded training samples.

Parsed shards are cached as one ``.npz`` (uint8 when every value is a multiple of 1/255, as
in LEAF's output, else float32), keyed like the image cache (:mod:`sfg.world.data.files`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sfg.errors import SfgError, check
from sfg.util.rng import stream
from sfg.util.safety import check_memory, human_bytes, loads_json
from sfg.world.data.base import (
    DATASETS,
    FederatedData,
    channel_stats,
    client_tensors,
    option_int,
)
from sfg.world.data.files import (
    cache_directory,
    cache_path,
    is_tar,
    iter_tar_files,
    load_cached,
    locate,
    save_cached,
    tar_file_names,
)
from sfg.world.data.partition import split_holdout

NUM_CLASSES = 62
SPLITS = ("train", "test")
LOOKED_FOR = "LEAF FEMNIST shards train/*.json and test/*.json (a directory or .tar.gz)"
FIX = ("generate them with LEAF's femnist preprocess.sh (github.com/TalwalkarLab/leaf) "
       "or fix --data-root")


@dataclass(frozen=True)
class LeafSource:
    """LEAF shards: a directory holding train/ and test/, or an archive with ``prefix``."""

    path: Path
    prefix: str = ""
    archive: bool = False


def _has_json(directory: Path) -> bool:
    return directory.is_dir() and any(p.suffix == ".json" for p in directory.iterdir())


def detect_leaf(path: Path) -> LeafSource | None:
    """A :class:`LeafSource` if ``path`` holds LEAF shards, else None."""
    if path.is_dir():
        if _has_json(path / "train") and _has_json(path / "test"):
            return LeafSource(path)
        return None
    if is_tar(path):
        splits: dict[str, str] = {}
        for name in tar_file_names(path, limit=4096):
            parts = [p for p in name.split("/") if p and p != "."]
            if len(parts) >= 2 and parts[-2] in SPLITS and parts[-1].endswith(".json"):
                prefix = "/".join(parts[:-2])
                splits.setdefault(parts[-2], prefix + "/" if prefix else "")
        if len(splits) == 2 and splits["train"] == splits["test"]:
            return LeafSource(path, splits["train"], archive=True)
    return None


# ------------------------------------------------------------------------ parsing
def _shards(source: LeafSource):
    """(split, where, bytes) for every shard, one at a time (archive order for an archive,
    sorted names for a directory): only the shard being parsed is in memory."""
    if source.archive:
        depth = len([p for p in source.prefix.split("/") if p])

        def keep(name: str) -> bool:
            parts = [p for p in name.split("/") if p and p != "."]
            return (len(parts) == depth + 2 and "/".join(parts[:depth]) == source.prefix.rstrip("/")
                    and parts[depth] in SPLITS and parts[-1].endswith(".json"))

        for name, blob in iter_tar_files(source.path, keep):
            parts = [p for p in name.split("/") if p and p != "."]
            yield parts[depth], f"{source.path}:{name}", blob
            del blob
        return
    files = [(split, f) for split in SPLITS for f in sorted((source.path / split).glob("*.json"))]
    total = sum(f.stat().st_size for _, f in files if f.is_file())
    check_memory(total, f"LEAF shards at {source.path} hold {human_bytes(total)}",
                 fix="use fewer shards")
    for _, f in files:
        check(f.is_file(), f"LEAF shard {f} is not a regular file")
    for split, f in files:
        yield split, str(f), f.read_bytes()


class _FloatCache(dict):
    """``parse_float`` for one shard: a repeated number text is one shared float object.

    LEAF pixels are a few hundred distinct texts (``k/255``), so a shard's lists hold pointers
    to shared floats instead of a float object per pixel (a quarter of the memory, and faster).
    ``float(text)`` is what :func:`json.loads` does itself, so the values are the same; at most
    4,096 texts are kept, whatever the input.
    """

    def __missing__(self, text: str) -> float:
        value = float(text)
        if len(self) < 4096:
            self[text] = value
        return value


def _parse_shard(where: str, blob: bytes) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """writer -> (x float32 [k, 784], y int64 [k]) of one shard, validated."""
    # parsed into Python lists of floats: ~12 bytes of memory per byte of JSON
    check_memory(12.0 * len(blob), f"parsing LEAF shard {where} ({human_bytes(len(blob))})",
                 fix="split the shard")
    doc = loads_json(blob, where, what="LEAF shard", parse_float=_FloatCache().__getitem__)
    check(isinstance(doc, dict) and isinstance(doc.get("user_data"), dict),
          f"LEAF shard {where} has no 'user_data' object; expected "
          "{'users': [...], 'num_samples': [...], 'user_data': {...}}")
    out = {}
    for writer, data in doc["user_data"].items():
        check(isinstance(data, dict) and "x" in data and "y" in data,
              f"LEAF shard {where}: writer {writer!r} lacks 'x' or 'y'")
        try:
            x = np.asarray(data["x"], dtype=np.float32)
            y = np.asarray(data["y"], dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise SfgError(f"LEAF shard {where}: writer {writer!r} has non-numeric, ragged or "
                           "out-of-range 'x'/'y'") from None
        if x.size == 0:
            x = x.reshape(0, 784)
        check(x.ndim == 2 and x.shape[1] == 784,
              f"LEAF shard {where}: writer {writer!r} images must be lists of 784 values, got "
              f"shape {x.shape}")
        check(y.ndim == 1 and y.size == x.shape[0],
              f"LEAF shard {where}: writer {writer!r} has {x.shape[0]} images but {y.size} labels")
        check(y.size == 0 or (y.min() >= 0 and y.max() < NUM_CLASSES),
              f"LEAF shard {where}: writer {writer!r} has labels outside 0..61")
        check(bool(np.isfinite(x).all()), f"LEAF shard {where}: writer {writer!r} has "
                                          "non-finite pixel values")
        out[str(writer)] = (x, y)
    return out


# float32 k/255 for k = 0..255: the values LEAF writes (Python's repr of k/255)
_BYTE_VALUES = (np.arange(256) / 255.0).astype(np.float32)


def _compact(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """One writer's float32 pixels as ``(array, exact)``, kept small as soon as parsed.

    ``exact``: every value is within 1e-6 of a multiple of 1/255 (then the dataset is stored
    as uint8 ``rint(x * 255)``). An exact array whose float32 values are exactly
    ``_BYTE_VALUES[u]`` is returned as that uint8 ``u`` (lossless either way it is stored);
    any other is kept as float32.
    """
    exact = bool(np.abs(np.rint(x * 255) / 255 - x).max(initial=0) < 1e-6)
    if exact:
        u = np.rint(x * 255).astype(np.uint8)
        if np.array_equal(_BYTE_VALUES[u].view(np.uint32), x.view(np.uint32)):
            return u, True
    return x, exact


def _as_stored(x: np.ndarray, exact: bool) -> np.ndarray:
    """A :func:`_compact` array in the dataset's stored form (uint8 when ``exact``, else float32)."""
    if x.dtype == np.uint8:
        return x if exact else _BYTE_VALUES[x]
    return np.rint(x * 255).astype(np.uint8) if exact else x


def _assemble(per_writer: dict[str, list[tuple[tuple, np.ndarray, np.ndarray]]],
              exact: bool) -> dict[str, np.ndarray]:
    """One split's arrays, writers sorted, each writer's parts in shard order.

    Written into one preallocated array, each writer's parts dropped once copied.
    """
    writers = sorted(per_writer)
    for w in writers:
        per_writer[w].sort(key=lambda part: part[0])
    counts = np.array([sum(p[2].size for p in per_writer[w]) for w in writers], np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    x = np.empty((int(offsets[-1]), 784), np.uint8 if exact else np.float32)
    y = np.empty(int(offsets[-1]), np.int64)
    row = 0
    for w in writers:
        for _, xs, ys in per_writer.pop(w):
            x[row:row + ys.size] = _as_stored(xs, exact)
            y[row:row + ys.size] = ys
            row += ys.size
    return {"x": x, "y": y, "writers": np.array(writers, dtype=str), "offsets": offsets}


def read_leaf(source: LeafSource, *, cache_dir=None) -> tuple[dict[str, np.ndarray], dict]:
    """Both splits as arrays (from the cache or parsed now, then cached).

    Arrays: ``{split}_x`` [n, 1, 28, 28] (uint8 0..255 or float32 0..1), ``{split}_y`` int64
    [n], ``{split}_writers`` str [W] sorted, ``{split}_offsets`` int64 [W+1] (writer w owns
    rows offsets[w]:offsets[w+1]), ``scale`` [] float, ``mean``/``std`` [1].
    """
    started = time.perf_counter()
    directory = cache_directory(source.path, cache_dir)
    path = cache_path(directory, "leaf", source.path, {"prefix": source.prefix})
    arrays = load_cached(path)
    if arrays is not None:
        return arrays, {"cache": str(path), "decoded": False,
                        "seconds": time.perf_counter() - started}
    # each shard is parsed as it is read and its writers' pixels made compact at once, so
    # memory is the decoded data plus one shard, not the JSON text or its float lists
    per_split: dict[str, dict[str, list]] = {s: {} for s in SPLITS}
    n_shards = dict.fromkeys(SPLITS, 0)
    exact = True
    for split, where, blob in _shards(source):
        n_shards[split] += 1
        parsed = _parse_shard(where, blob)
        del blob
        for writer, (x, y) in parsed.items():
            small, writer_exact = _compact(x)
            exact = exact and writer_exact
            per_split[split].setdefault(writer, []).append(((split, where), small, y))
        del parsed
    check(n_shards["train"] > 0 and n_shards["test"] > 0,
          f"LEAF data at {source.path} needs shards in both train/ and test/ "
          f"(found {n_shards['train']} and {n_shards['test']})")
    scale = 255.0 if exact else 1.0
    arrays = {}
    for split in SPLITS:
        for key, value in _assemble(per_split[split], exact).items():
            arrays[f"{split}_{key}"] = value
        arrays[f"{split}_x"] = arrays[f"{split}_x"].reshape(-1, 1, 28, 28)
    arrays["scale"] = np.array(scale)
    arrays["mean"], arrays["std"] = channel_stats(arrays["train_x"], scale)
    save_cached(path, arrays)
    return arrays, {"cache": str(path), "decoded": True, "seconds": time.perf_counter() - started}


# ------------------------------------------------------------------------ federation
def writer_table(arrays: dict[str, np.ndarray]) -> dict[str, tuple[int, int, int, int]]:
    """writer -> (train start, train stop, test start, test stop) for writers in both splits."""
    spans = {}
    for split in SPLITS:
        off = arrays[f"{split}_offsets"]
        for i, w in enumerate(arrays[f"{split}_writers"]):
            spans.setdefault(str(w), {})[split] = (int(off[i]), int(off[i + 1]))
    return {w: s["train"] + s["test"] for w, s in spans.items() if len(s) == 2}


def load_femnist_federated(*, n_clients: int, seed: int, data_root, alpha: float,
                           min_train: int | None, test_per_client: int | None,
                           val_fraction: float, min_samples=None,
                           cache_dir=None) -> FederatedData:
    """Federated FEMNIST, one writer per client (see the module docstring)."""
    min_samples = option_int(min_samples, "min_samples", minimum=0)
    if min_samples is not None and min_train is not None and min_samples != min_train:
        raise SfgError(f"min_samples={min_samples} and min_train={min_train} disagree; "
                       "FEMNIST uses one threshold, give only one of them")
    threshold = next((v for v in (min_samples, min_train) if v is not None), 250)
    key = "min_samples" if min_samples is not None else "min_train"  # as the user named it
    source = locate(data_root, detect_leaf, what="FEMNIST (LEAF) data", looked_for=LOOKED_FOR,
                    hint=r"femnist|leaf", fix=FIX)
    arrays, info = read_leaf(source, cache_dir=cache_dir)
    table = writer_table(arrays)
    all_writers = {str(w) for s in SPLITS for w in arrays[f"{s}_writers"]}
    skipped = len(all_writers) - len(table)
    eligible = sorted(w for w, (a, b, c, d) in table.items()
                      if b - a >= max(threshold, 1) and d > c)
    if len(eligible) < n_clients:
        raise SfgError(
            f"FEMNIST at {source.path}: only {len(eligible)} writers have at least {threshold} "
            f"training samples and a test split, {n_clients} clients requested; "
            + (f"lower {key} (e.g. femnist:{key}={max(threshold // 2, 1)}) or " if threshold > 1
               else "")
            + f"use at most {len(eligible)} clients")
    chosen = [eligible[i] for i in stream(seed, "writers").choice(len(eligible), n_clients,
                                                                   replace=False)]
    spans = np.array([table[w] for w in chosen], np.int64)  # [N, 4]
    groups = [np.arange(a, b) for a, b in spans[:, :2]]
    train, val = split_holdout(groups, val_fraction, stream(seed, "validation"))
    tests = [np.arange(a, b) for a, b in spans[:, 2:]]
    if test_per_client is not None:
        rng = stream(seed, "test-sets")
        tests = [t if t.size <= test_per_client else np.sort(rng.choice(t, test_per_client,
                                                                        replace=False))
                 for t in tests]
    scale = float(arrays["scale"])
    norm = {"scale": scale, "mean": arrays["mean"], "std": arrays["std"]}
    train_x, train_y = client_tensors(arrays["train_x"], arrays["train_y"], train, **norm)
    val_x, val_y = client_tensors(arrays["train_x"], arrays["train_y"], val, **norm)
    test_x, test_y = client_tensors(arrays["test_x"], arrays["test_y"], tests, **norm)
    meta = {"source": str(source.path), "format": "leaf-json", "prefix": source.prefix,
            "writers": chosen, "min_samples": threshold, "eligible_writers": len(eligible),
            "skipped_writers": skipped, "writers_with_both_splits": len(table),
            "alpha": None, "val_fraction": val_fraction, "test_per_client": test_per_client,
            "normalisation": {"scale": scale, "mean": [float(v) for v in arrays["mean"]],
                              "std": [float(v) for v in arrays["std"]]}, **info}
    return FederatedData(name="femnist", num_classes=NUM_CLASSES, input_shape=(1, 28, 28),
                         train_x=train_x, train_y=train_y, val_x=val_x, val_y=val_y,
                         test_x=test_x, test_y=test_y, augment_hflip=False, meta=meta)


DATASETS.register(
    "femnist", load_femnist_federated,
    params={"min_samples": None, "cache_dir": None, "min_train": None, "test_per_client": None},
    doc="FEMNIST from LEAF JSON shards (directory or .tar.gz), one client per writer",
    tags=("image", "file", "natural-split"))
