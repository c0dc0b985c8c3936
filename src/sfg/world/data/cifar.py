"""CIFAR-10 and CIFAR-100 (docs/concepts/training.md#the-training-protocol) from their standard python archives or an image folder.

Accepted at ``--data-root`` (or up to two directory levels below it):

* ``cifar-10-batches-py/`` (``data_batch_1`` … ``data_batch_5``, ``test_batch``, optional
  ``batches.meta``) or the ``cifar-10-python.tar.gz`` that contains it; for CIFAR-100
  ``cifar-100-python/`` (``train``, ``test``, optional ``meta``; ``fine_labels`` by default,
  ``labels=coarse`` for the 20 superclasses) or ``cifar-100-python.tar.gz``. The pickles are
  read with a restricted unpickler (:mod:`sfg.world.data.safe_pickle`) and ``encoding="bytes"``.
* an image folder ``train/<class>/*``, ``test/<class>/*`` (directory or tar(.gz)), decoded
  once and cached (:mod:`sfg.world.data.imagefolder`); class folders sorted = label order.

Protocol: Dirichlet label skew (alpha 0.3; NIID-bench form with self-balancing,
``balance=false`` for the plain per-class Dirichlet) over the training split with at least 20
images per client, 15 % validation hold-out, 300 test images per client drawn from the test split
with the client's label distribution, random horizontal flips in training. Images are
standardised per channel with the training split's mean and std. ``limit_per_class=k`` keeps
the first k images of every class in each split (quick runs and tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sfg.errors import SfgError, check
from sfg.world.data.base import (
    DATASETS,
    FederatedData,
    ImagePool,
    channel_stats,
    federate_label_skew,
    option_bool,
)
from sfg.world.data.files import is_tar, iter_tar_members, locate, normalized_name, tar_file_names
from sfg.world.data.imagefolder import (
    ImageFolderSource,
    detect_image_folder,
    folder_options,
    image_folder_pool,
)
from sfg.world.data.safe_pickle import load_cifar_pickle


@dataclass(frozen=True)
class CifarFormat:
    """File names and keys of one CIFAR python archive."""

    classes: int
    directory: str
    archive: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    hint: str
    url: str


FORMATS = {
    10: CifarFormat(10, "cifar-10-batches-py", "cifar-10-python.tar.gz",
                    tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",),
                    "batches.meta", r"cifar10(?!0)",
                    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    100: CifarFormat(100, "cifar-100-python", "cifar-100-python.tar.gz", ("train",), ("test",),
                     "meta", r"cifar100", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}
LABEL_KEYS = {"fine": ("fine_labels", "fine_label_names", 100),
              "coarse": ("coarse_labels", "coarse_label_names", 20)}


@dataclass(frozen=True)
class PickleSource:
    """A CIFAR python archive: a directory, or a tar(.gz) with member ``prefix``."""

    path: Path
    prefix: str = ""
    archive: bool = False


def _looked_for(fmt: CifarFormat) -> str:
    files = ", ".join((fmt.train[0] + (f"..{fmt.train[-1][-1]}" if len(fmt.train) > 1 else ""),)
                      + fmt.test)
    return (f"{fmt.directory}/ ({files}) or {fmt.archive}, or an image folder "
            "train/<class>/*, test/<class>/* as a directory or .tar.gz")


def detector(fmt: CifarFormat):
    """``accept(path)`` for :func:`sfg.world.data.files.locate`: a pickle source or image folder."""
    needed = fmt.train + fmt.test

    def accept(path: Path) -> PickleSource | ImageFolderSource | None:
        if path.is_dir():
            present = [name for name in needed if (path / name).is_file()]
            if len(present) == len(needed):
                return PickleSource(path)
            if present or normalized_name(path.name) == normalized_name(fmt.directory):
                missing = [n for n in needed if n not in present]
                raise SfgError(f"CIFAR-{fmt.classes} directory {path} lacks {', '.join(missing)}; "
                               f"re-extract {fmt.archive}")
            return detect_image_folder(path)
        if is_tar(path):
            for name in tar_file_names(path):
                head, _, base = name.rpartition("/")
                parent = head.rpartition("/")[2]
                if base in needed and (fmt.classes == 10 or parent == fmt.directory):
                    return PickleSource(path, head + "/" if head else "", archive=True)
            return detect_image_folder(path)
        return None

    return accept


def first_per_class(labels: np.ndarray, limit: int | None) -> np.ndarray:
    """Indices (ascending) of the first ``limit`` examples of every class; all if None."""
    if limit is None:
        return np.arange(labels.size)
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels)
    rank = np.arange(labels.size) - np.repeat(np.concatenate([[0], np.cumsum(counts)[:-1]]),
                                              counts)
    return np.sort(order[rank < limit])


def _iter_files(source: PickleSource, names: tuple[str, ...]):
    """(name, where, binary file) for the wanted batch files of a pickle source, one at a
    time (archive order, or ``names`` order for a directory; missing ones are skipped). Each
    file is read where it stands (by the unpickler), never held whole as bytes."""
    if source.archive:
        wanted = {source.prefix + n: n for n in names}
        for member, _, fh in iter_tar_members(source.path, lambda m: m in wanted):
            yield wanted[member], f"{source.path}:{member}", fh
    else:
        for n in names:
            file = source.path / n
            if file.is_file():
                with open(file, "rb") as fh:
                    yield n, str(file), fh


def _text_key(d: dict) -> dict:
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in d.items()}


def _batch(where: str, blob: bytes | BinaryIO, label_key: str,
           n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(x uint8 [n, 3, 32, 32], y int64 [n]) of one batch file (bytes or a binary file),
    validated."""
    d = load_cifar_pickle(blob, source=where)
    check(isinstance(d, dict), f"{where} is not a CIFAR batch (expected a dict, got "
                               f"{type(d).__name__})")
    d = _text_key(d)
    check("data" in d and label_key in d,
          f"{where} is not a CIFAR batch: keys {sorted(d)} lack 'data' or {label_key!r}")
    x = d["data"]
    check(isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 2
          and x.shape[1] == 3072, f"{where}: 'data' must be a uint8 array [n, 3072], got "
                                  f"{getattr(x, 'dtype', type(x).__name__)} "
                                  f"{getattr(x, 'shape', '')}")
    try:
        y = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        raise SfgError(f"{where}: {label_key!r} must be a list of integers in the int64 "
                       "range") from None
    check(y.size == x.shape[0], f"{where}: {x.shape[0]} images but {y.size} labels")
    check(y.size == 0 or (y.min() >= 0 and y.max() < n_classes),
          f"{where}: labels must lie in 0..{n_classes - 1}")
    return x.reshape(-1, 3, 32, 32), y


def pickle_pool(source: PickleSource, fmt: CifarFormat, *, labels: str = "fine",
                limit_per_class: int | None = None) -> ImagePool:
    """An :class:`ImagePool` from a CIFAR python archive (scale 255, train-split stats)."""
    label_key, names_key, n_classes = (("labels", "label_names", 10) if fmt.classes == 10
                                       else LABEL_KEYS[labels])
    wanted = fmt.train + fmt.test
    if not source.archive:
        missing = [n for n in wanted if not (source.path / n).is_file()]
        check(not missing, f"CIFAR-{fmt.classes} archive {source.path} lacks "
                           f"{', '.join(source.prefix + m for m in missing)}")
    # each batch is unpickled from its file as it is read and appended to its split's array,
    # grown in place (realloc; no stacked copy; a split of one batch keeps the unpickled array
    # itself): memory stays near the decoded data plus one batch
    split_of = {n: split for split, names in (("train", fmt.train), ("test", fmt.test))
                for n in names}
    xs: dict[str, np.ndarray] = {}
    ys: dict[str, np.ndarray] = {}
    found: dict[str, tuple[int, int]] = {}  # batch -> its rows in its split (last copy)
    meta_file = None
    for n, where, fh in _iter_files(source, wanted + (fmt.meta,)):
        if n == fmt.meta:
            meta_file = (where, fh.read())
            continue
        bx, by = _batch(where, fh, label_key, n_classes)
        split = split_of[n]
        if split not in xs:
            xs[split], ys[split], rows = bx, by, 0
        else:
            x, y = xs.pop(split), ys.pop(split)
            if not (x.flags.owndata and y.flags.owndata):  # a view of the unpickled batch
                x, y = x.copy(), y.copy()
            rows = y.size
            x.resize((rows + by.size, 3, 32, 32), refcheck=False)
            y.resize(rows + by.size, refcheck=False)
            x[rows:], y[rows:] = bx, by
            xs[split], ys[split] = x, y
            del x, y
        found[n] = (rows, rows + by.size)
        del bx, by
    missing = [n for n in wanted if n not in found]
    check(not missing, f"CIFAR-{fmt.classes} archive {source.path} lacks "
                       f"{', '.join(source.prefix + m for m in missing)}")
    splits = {}
    for split, names in (("train", fmt.train), ("test", fmt.test)):
        x, y = xs.pop(split), ys.pop(split)
        spans = [found[n] for n in names]
        if [a for a, _ in spans] != [0] + [b for _, b in spans[:-1]] or spans[-1][1] != y.size:
            # archive order differs from the names' (or a name came twice: the last counts)
            rows = np.concatenate([np.arange(a, b) for a, b in spans])
            x, y = x[rows], y[rows]
        if limit_per_class is not None:
            keep = first_per_class(y, limit_per_class)
            x, y = x[keep], y[keep]
        splits[split] = (x, y)
    label_names = [str(i) for i in range(n_classes)]
    if meta_file is not None:
        meta = _text_key(load_cifar_pickle(meta_file[1], source=meta_file[0]))
        raw = meta.get(names_key)
        if isinstance(raw, list) and len(raw) == n_classes:
            label_names = [v.decode("latin1") if isinstance(v, bytes) else str(v) for v in raw]
    mean, std = channel_stats(splits["train"][0], 255.0)
    return ImagePool(train_x=splits["train"][0], train_y=splits["train"][1],
                     test_x=splits["test"][0], test_y=splits["test"][1], num_classes=n_classes,
                     scale=255.0, mean=mean, std=std,
                     meta={"source": str(source.path), "format": "cifar-python",
                           "prefix": source.prefix, "label_names": label_names,
                           "labels": labels if fmt.classes == 100 else "labels",
                           "limit_per_class": limit_per_class})


def cifar_pool(data_root, classes: int, *, labels: str = "fine", limit_per_class=None,
               workers=None, cache_dir=None) -> ImagePool:
    """Find and read CIFAR-``classes`` under ``data_root`` (see the module docstring)."""
    fmt = FORMATS[classes]
    check(labels in LABEL_KEYS, f"labels must be 'fine' or 'coarse', got {labels!r}")
    opts = folder_options(limit_per_class, workers, False, None)
    source = locate(data_root, detector(fmt), what=f"CIFAR-{classes} data",
                    looked_for=_looked_for(fmt), hint=fmt.hint,
                    fix=f"download {fmt.url} or fix --data-root")
    if isinstance(source, PickleSource):
        return pickle_pool(source, fmt, labels=labels, limit_per_class=opts["limit_per_class"])
    check(labels == "fine", "labels=coarse needs the CIFAR-100 python archive (an image folder "
                            "has one label per class folder)")
    pool = image_folder_pool(source, cache_dir=cache_dir, **opts)
    check(pool.num_classes == classes,
          f"image folder {source.path} has {pool.num_classes} class folders, CIFAR-{classes} "
          f"needs {classes}; use the 'imagefolder' dataset for other folders")
    return pool


def _factory(classes: int):
    def load_cifar_federated(*, n_clients: int, seed: int, data_root, alpha: float,
                             min_train: int | None, test_per_client: int | None,
                             val_fraction: float, cache_dir=None, limit_per_class=None,
                             workers=None, balance: bool = True,
                             labels: str = "fine", partition: str = "dirichlet") -> FederatedData:
        pool = cifar_pool(data_root, classes, labels=labels, limit_per_class=limit_per_class,
                          workers=workers, cache_dir=cache_dir)
        return federate_label_skew(
            pool, name=f"cifar{classes}", n_clients=n_clients, seed=seed, alpha=alpha,
            min_train=20 if min_train is None else min_train,
            test_per_client=300 if test_per_client is None else test_per_client,
            val_fraction=val_fraction, augment_hflip=True,
            balance=option_bool(balance, "balance"), partition=partition)

    load_cifar_federated.__doc__ = f"Federated CIFAR-{classes} (docs/concepts/training.md#the-training-protocol; module docstring)."
    return load_cifar_federated


_COMMON = {"cache_dir": None, "limit_per_class": None, "workers": None, "balance": True,
           "min_train": 20, "test_per_client": 300}
DATASETS.register("cifar10", _factory(10), params=dict(_COMMON),
                  doc="CIFAR-10: cifar-10-batches-py (dir or tar.gz) or an image folder",
                  tags=("image", "file"))
DATASETS.register("cifar100", _factory(100), params={**_COMMON, "labels": "fine"},
                  doc="CIFAR-100: cifar-100-python (dir or tar.gz) or an image folder",
                  tags=("image", "file"))
