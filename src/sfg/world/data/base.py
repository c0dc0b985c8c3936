"""The federated dataset type, the dataset registry and the shared label-skew assembly (docs/concepts/training.md#the-training-protocol).

A loader turns a dataset in its standard format into an :class:`ImagePool` (the pooled train
and test splits, undecided who gets what); :func:`federate_label_skew` then partitions it
(Dirichlet label skew), holds out validation data and draws per-client test sets with each
client's own label distribution. FEMNIST has a natural writer split and assembles its
:class:`FederatedData` itself from the same pieces.

Normalisation: every image is scaled to [0, 1] (``/ scale``) and standardised per channel with
the mean and standard deviation of the dataset's whole training split (all 50k CIFAR training
images, all loaded FEMNIST training samples, all 1,797 digits); these constants do not depend
on the seed or the partition and are reported in ``meta["normalisation"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sfg.errors import SfgError, check
from sfg.util.components import Component, Registry, parse_component
from sfg.util.rng import stream
from sfg.world.data.partition import (
    label_histogram,
    label_matched_test_indices,
    make_partition,
    parse_partition,
    split_holdout,
)


@dataclass
class FederatedData:
    """Per-client train/validation/test tensors of one dataset under one seed (docs/concepts/training.md#the-training-protocol).

    ``train_x[i]``: float32 [n_i, *input_shape], normalised; ``train_y[i]``: int64 [n_i];
    likewise ``val_*`` (the 15 % hold-out of the client's data) and ``test_*`` (the client's
    own test set). ``augment_hflip``: training should flip images horizontally at random.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    train_x: list[torch.Tensor]
    train_y: list[torch.Tensor]
    val_x: list[torch.Tensor]
    val_y: list[torch.Tensor]
    test_x: list[torch.Tensor]
    test_y: list[torch.Tensor]
    augment_hflip: bool
    meta: dict = field(default_factory=dict)

    @property
    def n_clients(self) -> int:
        return len(self.train_y)

    def sizes(self, split: str = "train") -> np.ndarray:
        """Examples per client in ``split`` ("train", "val" or "test"): int64 [N]."""
        check(split in ("train", "val", "test"), f"unknown split {split!r}; use train, val or test")
        return np.array([len(y) for y in getattr(self, f"{split}_y")], np.int64)

    def label_counts(self, split: str = "train") -> np.ndarray:
        """Label histogram per client in ``split``: int64 [N, num_classes]."""
        check(split in ("train", "val", "test"), f"unknown split {split!r}; use train, val or test")
        ys = getattr(self, f"{split}_y")
        return np.stack([np.bincount(y.numpy(), minlength=self.num_classes) for y in ys])


@dataclass
class ImagePool:
    """A dataset's pooled splits before federation.

    ``train_x``/``test_x``: [n, C, H, W] uint8 (or float32) in ``0..scale``; ``*_y``: int64 [n].
    ``mean``/``std``: float64 [C] per-channel statistics of ``train_x / scale``.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    scale: float
    mean: np.ndarray
    std: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.train_x.shape[1:])


DATASETS = Registry("dataset")


# ------------------------------------------------------------------------ normalisation
def channel_stats(x: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of ``x / scale`` over all images: float64 [C] each.

    ``x``: [n, C, ...]; uint8 input is counted exactly with a histogram (no float copy).
    Memory is bounded whatever ``n``: the images are visited in blocks of about
    ``_STATS_BLOCK`` values per channel (``np.bincount`` widens its input to int64, and the float
    path needs float64 values, so one whole plane at a time would cost 9 bytes a pixel of it —
    0.43 GiB of temporaries for CIFAR-10's 50,000 training images, three times their 0.14 GiB;
    a block costs 2 MiB). A float input that fits in one block gives exactly
    ``values.mean()``/``values.var()``; larger ones the same two-pass mean and variance summed
    block by block.
    """
    channels = x.shape[1]
    per_image = int(np.prod(x.shape[2:], dtype=np.int64))
    step = max(1, _STATS_BLOCK // max(per_image, 1))
    n = x.shape[0]
    mean, std = np.zeros(channels), np.ones(channels)
    for c in range(channels):
        blocks = [x[i:i + step, c] for i in range(0, n, step)]
        if x.dtype == np.uint8:
            hist = np.zeros(256, np.float64)
            for b in blocks:
                hist += np.bincount(b.ravel(), minlength=256)
            values = np.arange(256, dtype=np.float64) / scale
            total = hist.sum()
            m = (hist @ values) / total
            var = (hist @ (values - m) ** 2) / total
        elif n <= step:  # one block (or none: NaN, as numpy's mean of nothing)
            values = x[:, c].astype(np.float64) / scale
            m, var = values.mean(), values.var()
        else:
            total = n * per_image
            m = sum(float((b.astype(np.float64) / scale).sum()) for b in blocks) / total
            var = sum(float(((b.astype(np.float64) / scale - m) ** 2).sum())
                      for b in blocks) / total
        mean[c] = m
        std[c] = np.sqrt(var) if var > 1e-12 else 1.0
    return mean, std


# values per channel in one block of channel_stats (int64/float64 temporaries: 8 bytes each,
# 2 MiB a block; smaller blocks are no slower: 0.23 s for 50,000 32x32 RGB images)
_STATS_BLOCK = 1 << 18


def normalised_tensor(x: np.ndarray, index: np.ndarray, *, scale: float, mean: np.ndarray,
                      std: np.ndarray) -> torch.Tensor:
    """float32 [k, C, ...] = (x[index] / scale − mean) / std, one gather for all clients."""
    out = torch.from_numpy(np.ascontiguousarray(x[index])).to(torch.float32)
    shape = (1, -1) + (1,) * (out.dim() - 2)
    mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    out.mul_(torch.tensor(1.0 / (scale * std), dtype=torch.float32).reshape(shape))
    out.sub_(torch.tensor(mean / std, dtype=torch.float32).reshape(shape))
    return out


def client_tensors(x: np.ndarray, y: np.ndarray, groups: list[np.ndarray], *, scale: float,
                   mean: np.ndarray, std: np.ndarray) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-client (x, y) tensors for index ``groups`` (views of one gathered tensor each)."""
    sizes = [int(g.size) for g in groups]
    flat = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
    xs = normalised_tensor(x, flat, scale=scale, mean=mean, std=std)
    ys = torch.from_numpy(y[flat].astype(np.int64))
    return list(torch.split(xs, sizes)), list(torch.split(ys, sizes))


# ------------------------------------------------------------------------ label skew
def federate_label_skew(pool: ImagePool, *, name: str, n_clients: int, seed: int, alpha: float,
                        min_train: int, test_per_client: int, val_fraction: float,
                        augment_hflip: bool, balance: bool = True,
                        meta: dict | None = None, partition: str = "dirichlet") -> FederatedData:
    """Dirichlet label skew over ``pool.train``, validation hold-out, label-matched test sets.

    docs/concepts/training.md#the-training-protocol: each client's share of the training split (at least ``min_train`` examples,
    counted before the hold-out) loses ``val_fraction`` of its examples to validation; its
    test set has ``test_per_client`` images from ``pool.test`` with the label distribution
    of its share (:func:`label_matched_test_indices`). Streams: ``"partition"``,
    ``"validation"``, ``"test-sets"`` under ``seed``. ``partition``: ``"dirichlet"`` (label
    skew with ``alpha``) or ``"classes:k=2"`` (every client exactly k classes,
    :func:`~sfg.world.data.partition.class_shard_partition`).
    """
    groups = make_partition(partition, pool.train_y, n_clients, alpha=alpha,
                            min_size=min_train, rng=stream(seed, "partition"), balance=balance)
    hist = label_histogram(pool.train_y, groups, pool.num_classes)
    train, val = split_holdout(groups, val_fraction, stream(seed, "validation"))
    tests = label_matched_test_indices(pool.test_y, hist, test_per_client,
                                       stream(seed, "test-sets"))
    norm = {"scale": pool.scale, "mean": pool.mean, "std": pool.std}
    train_x, train_y = client_tensors(pool.train_x, pool.train_y, train, **norm)
    val_x, val_y = client_tensors(pool.train_x, pool.train_y, val, **norm)
    test_x, test_y = client_tensors(pool.test_x, pool.test_y, tests, **norm)
    repeats = int(sum(t.size - np.unique(t).size for t in tests))
    info = dict(pool.meta)
    info.update(meta or {})
    info.update({
        "alpha": float(alpha), "balance": bool(balance), "partition": str(partition), "min_train": int(min_train),
        "test_per_client": int(test_per_client), "val_fraction": float(val_fraction),
        "train_pool": int(pool.train_y.size), "test_pool": int(pool.test_y.size),
        "test_repeats": repeats,
        "normalisation": {"scale": float(pool.scale), "mean": [float(v) for v in pool.mean],
                          "std": [float(v) for v in pool.std]},
    })
    return FederatedData(name=name, num_classes=pool.num_classes, input_shape=pool.input_shape,
                         train_x=train_x, train_y=train_y, val_x=val_x, val_y=val_y,
                         test_x=test_x, test_y=test_y, augment_hflip=augment_hflip, meta=info)


# ------------------------------------------------------------------------ options
def option_int(value: Any, name: str, *, minimum: int = 1, allow_none: bool = True) -> int | None:
    """A validated integer option (``None``/``"none"`` allowed when ``allow_none``)."""
    if allow_none and (value is None or (isinstance(value, str) and value.lower() in ("none", ""))):
        return None
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum
    check(ok, f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def option_bool(value: Any, name: str) -> bool:
    check(isinstance(value, (bool, np.bool_)), f"{name} must be true or false, got {value!r}")
    return bool(value)


def option_fraction(value: Any, name: str, *, low: float = 0.0, high: float = 1.0,
                    low_open: bool = False) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    ok = ok and np.isfinite(value) and (value > low if low_open else value >= low) and value < high
    bracket = "(" if low_open else "["
    check(ok, f"{name} must be a number in {bracket}{low}, {high}), got {value!r}")
    return float(value)


# ------------------------------------------------------------------------ the entry point
def dataset_names() -> list[str]:
    """Names of the registered datasets."""
    return DATASETS.names()


def load_federated(name: str | Component, *, n_clients: int, seed: int,
                   data_root: str | None = None, alpha: float = 0.3,
                   min_train: int | None = None, test_per_client: int | None = None,
                   val_fraction: float = 0.15, partition: str | None = None,
                   **options: Any) -> FederatedData:
    """Load dataset ``name`` split over ``n_clients`` clients for ``seed`` (docs/concepts/training.md#the-training-protocol).

    ``name`` is a dataset id or a component string carrying dataset options
    (``"cifar10:limit_per_class=100"``); ``options`` are the same options as keywords.
    ``min_train`` (examples per client before the validation hold-out) and
    ``test_per_client`` default per dataset: CIFAR and image folders 20 and 300 (docs/concepts/training.md#the-training-protocol);
    digits 5 (lowered to ⌊pool / 4N⌋, at least 1, for many clients: 3 at N = 100) and 50;
    FEMNIST 250 (its ``min_samples``) and the writer's whole test split. ``alpha`` is the
    Dirichlet concentration (unused by FEMNIST, whose split is by writer). ``partition``:
    ``"dirichlet"`` (default) or ``"classes:k=2"`` (each client exactly k classes; datasets
    with a natural split such as FEMNIST take none).
    """
    comp = name if isinstance(name, Component) else parse_component(str(name), kind="dataset")
    if comp.modifiers:
        raise SfgError(f"dataset {comp.text!r} takes no '+' modifiers")
    entry = DATASETS.entry(comp.name)
    opts = DATASETS.check_params(comp.name, {**comp.params, **options})
    n_clients = option_int(n_clients, "n_clients", allow_none=False)
    seed = option_int(seed, "seed", minimum=0, allow_none=False)
    check(isinstance(alpha, (int, float, np.floating)) and not isinstance(alpha, bool)
          and bool(np.isfinite(alpha)) and alpha > 0,
          f"alpha (Dirichlet concentration) must be a positive number, got {alpha!r}")
    min_train = option_int(min_train, "min_train", minimum=0)
    test_per_client = option_int(test_per_client, "test_per_client")
    val_fraction = option_fraction(val_fraction, "val_fraction")
    kind, _ = parse_partition(partition)
    if kind != "dirichlet":
        check("natural-split" not in entry.tags,
              f"dataset {comp.name!r} has a natural split (one client per writer); it takes no "
              f"partition {partition!r}")
        options = {**opts, "partition": str(partition)}
    else:
        options = opts
    return entry.factory(n_clients=n_clients, seed=seed, data_root=data_root, alpha=float(alpha),
                         min_train=min_train, test_per_client=test_per_client,
                         val_fraction=val_fraction, **options)
