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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

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


class ClientImages(Sequence[torch.Tensor]):
    """Every client's examples of one split as rows of one shared image array, normalised when
    read (docs/concepts/training.md#the-training-protocol).

    ``images``: the pooled split as stored ([n, C, ...] uint8, or float32), shared by every
    client and never copied or written; ``rows``: int64 [sum of sizes], each client's rows of
    ``images`` in turn (client i's are ``rows[offsets[i]:offsets[i + 1]]``). Memory is the
    pool once plus 8 bytes an example, whatever the number of clients; minibatches and
    evaluation batches are gathered as stored and normalised per batch (:meth:`take`), with the
    formula of :func:`normalised_tensor` (same dtype, same operations: the same floats).
    ``normalise=False``: ``images`` are already the examples (float32; a
    :class:`FederatedData` made from per-client tensors, :meth:`of`).

    A sequence: ``xs[i]`` is client i's examples, float32 [n_i, C, ...], made on each read.
    """

    def __init__(self, images: np.ndarray | torch.Tensor, rows: np.ndarray, sizes: np.ndarray,
                 *, scale: float = 1.0, mean: np.ndarray | None = None,
                 std: np.ndarray | None = None, normalise: bool = True):
        self.images = images
        self.rows = np.ascontiguousarray(rows, np.int64)
        self.sizes = np.asarray(sizes, np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.normalises = bool(normalise)
        channels = int(images.shape[1]) if images.ndim >= 2 else 1
        mean = np.zeros(channels) if mean is None else np.asarray(mean, np.float64)
        std = np.ones(channels) if std is None else np.asarray(std, np.float64)
        self.scale, self.mean, self.std = float(scale), mean, std
        shape = (-1,) + (1,) * max(images.ndim - 2, 0)
        # the constants exactly as normalised_tensor computes them
        self._mul = torch.tensor(1.0 / (float(scale) * std), dtype=torch.float32).reshape(shape)
        self._sub = torch.tensor(mean / std, dtype=torch.float32).reshape(shape)
        self._on: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_groups(cls, images: np.ndarray, groups: list[np.ndarray], *, scale: float,
                    mean: np.ndarray, std: np.ndarray) -> ClientImages:
        """Client i's examples = ``images[groups[i]]``."""
        sizes = np.array([int(g.size) for g in groups], np.int64)
        rows = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
        return cls(images, rows, sizes, scale=scale, mean=mean, std=std)

    @classmethod
    def of(cls, xs: Any) -> ClientImages:
        """``xs`` itself, or a list of per-client float tensors as one (concatenated once)."""
        if isinstance(xs, ClientImages):
            return xs
        parts = [torch.as_tensor(x) for x in xs]
        sizes = np.array([int(x.shape[0]) for x in parts], np.int64)
        images = (torch.cat(parts).to(torch.float32) if parts
                  else torch.zeros((0, 1), dtype=torch.float32))
        return cls(images, np.arange(int(sizes.sum()), dtype=np.int64), sizes, normalise=False)

    # -- the sequence of per-client tensors
    def __len__(self) -> int:
        return int(self.sizes.size)

    @overload
    def __getitem__(self, i: int) -> torch.Tensor: ...

    @overload
    def __getitem__(self, i: slice) -> list[torch.Tensor]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        k = int(i) + len(self) if int(i) < 0 else int(i)
        if not 0 <= k < len(self):
            raise IndexError(f"client {i} out of range for {len(self)} clients")
        return self.take(self.rows[self.offsets[k]:self.offsets[k + 1]])

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self[k] for k in range(len(self)))

    def __add__(self, other: Any) -> list[torch.Tensor]:
        return list(self) + list(other)

    def __radd__(self, other: Any) -> list[torch.Tensor]:
        return list(other) + list(self)

    # -- gathering and normalising
    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.images.shape[1:])

    def client_rows(self, i: int) -> np.ndarray:
        """Client i's rows of ``images``: int64 [n_i] (a view)."""
        return self.rows[self.offsets[i]:self.offsets[i + 1]]

    def subset(self, clients: Sequence[int] | np.ndarray) -> ClientImages:
        """The examples of ``clients`` (in that order), sharing the images."""
        clients = np.asarray(clients, np.int64).reshape(-1)
        rows = [self.client_rows(int(i)) for i in clients]
        out = ClientImages.__new__(ClientImages)
        out.__dict__.update(self.__dict__)
        out.rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        out.sizes = self.sizes[clients]
        out.offsets = np.concatenate([[0], np.cumsum(out.sizes)]).astype(np.int64)
        return out

    def on(self, device: torch.device | str | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(images, multiplier, offset) as tensors on ``device`` (made once per device; on
        the CPU the images share the array's memory)."""
        key = str(torch.device("cpu") if device is None else torch.device(device))
        got = self._on.get(key)
        if got is None:
            images = self.images
            if isinstance(images, np.ndarray):
                if not (images.flags.writeable and images.flags.c_contiguous):
                    images = np.array(images)  # torch shares only a writable, C-ordered array
                images = torch.from_numpy(images)
            got = (images.to(key), self._mul.to(key), self._sub.to(key))
            self._on[key] = got
        return got

    def normalise(self, raw: torch.Tensor, device: torch.device | str | None = None
                  ) -> torch.Tensor:
        """float32 ``(raw / scale − mean) / std`` of examples as stored (any leading axes):
        the floats :func:`normalised_tensor` gives."""
        out = raw.to(torch.float32)
        if out is raw and self.normalises:  # float32 as stored: normalised into a copy
            out = out.clone()
        return self._normalise_(out, raw.device if device is None else device)

    def _normalise_(self, out: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """:meth:`normalise` in place on a float32 tensor of this object's own."""
        if not self.normalises:
            return out
        _, mul, sub = self.on(device)
        return out.mul_(mul).sub_(sub)

    def raw(self, rows: np.ndarray | torch.Tensor,
            device: torch.device | str | None = None) -> torch.Tensor:
        """[*rows.shape, C, ...] the examples at pool ``rows`` as stored (a fresh tensor)."""
        images, _, _ = self.on(device)
        r = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(
            np.ascontiguousarray(rows, np.int64))
        got = images.index_select(0, r.reshape(-1).to(images.device))
        return got.view(*r.shape, *images.shape[1:])

    def take(self, rows: np.ndarray | torch.Tensor,
             device: torch.device | str | None = None) -> torch.Tensor:
        """float32 [*rows.shape, C, ...]: the examples at pool ``rows``, normalised."""
        raw = self.raw(rows, device)
        return self._normalise_(raw.to(torch.float32), raw.device)  # fresh: in place

    def gather(self, clients: np.ndarray, local: np.ndarray,
               device: torch.device | str | None = None) -> torch.Tensor:
        """float32 [*local.shape, C, ...]: example ``local[k, ...]`` of client ``clients[k]``
        (``local``: [n, ...] indices into each client's own examples)."""
        clients = np.asarray(clients, np.int64)
        local = np.asarray(local, np.int64)
        at = self.offsets[clients].reshape((-1,) + (1,) * (local.ndim - 1)) + local
        return self.take(self.rows[at], device)

    def held_bytes(self) -> int:
        """Bytes held per client, beside the shared images: the rows, sizes and offsets."""
        return int(self.rows.nbytes + self.sizes.nbytes + self.offsets.nbytes)


class PoolBatch:
    """Minibatches ``[n, K, B, C, ...]`` of n clients, made when indexed: ``xs[c0:c1]``,
    ``xs[c0:c1, k]`` or ``xs[i, k]`` gathers only those rows of the pool (as stored), flips them
    (``flips`` [n, K, B] or None, :func:`hflip`) and normalises them — the floats of a whole
    tensor gathered at once and indexed. A backend reads its block of clients at a time
    (``sfg.sim.backends``), so a call over n clients holds one block's float examples, never n
    clients' ([n, K, B] float images are 0.8 MB a client for CIFAR at K·B = 64).
    ``.to(device)`` names the device the blocks are made on."""

    dtype = torch.float32

    def __init__(self, images: ClientImages, rows: np.ndarray, flips: np.ndarray | None,
                 device: torch.device | str | None = None):
        self.images, self.rows, self.flips = images, rows, flips
        self.device = torch.device("cpu" if device is None else device)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.rows.shape, *self.images.example_shape))

    def dim(self) -> int:
        return len(self.shape)

    def to(self, device: torch.device | str | None = None, dtype: Any = None) -> PoolBatch:
        check(dtype in (None, torch.float32), "a PoolBatch is float32")
        return self if device is None else PoolBatch(self.images, self.rows, self.flips, device)

    def __getitem__(self, key: Any) -> torch.Tensor:
        raw = self.images.raw(self.rows[key], self.device)
        if self.flips is not None:
            raw = hflip(raw, self.flips[key])
        return self.images._normalise_(raw.to(torch.float32), raw.device)

    def tensor(self) -> torch.Tensor:
        """All of it as one float32 tensor."""
        return self[:]


def hflip(xs: torch.Tensor, flips: np.ndarray | torch.Tensor | None) -> torch.Tensor:
    """``xs`` [*lead, C, H, W] with example ``xs[j]`` mirrored left-right where ``flips[j]``
    (bool [*lead]); ``xs`` itself when ``flips`` is None — the one random horizontal flip of
    training (``FederatedData.augment_hflip``)."""
    if flips is None:
        return xs
    f = flips if isinstance(flips, torch.Tensor) else torch.from_numpy(np.asarray(flips))
    f = f.to(xs.device)
    return torch.where(f.reshape(*f.shape, *([1] * (xs.dim() - f.dim()))), xs.flip(-1), xs)


@dataclass
class FederatedData:
    """Per-client train/validation/test examples of one dataset under one seed (docs/concepts/training.md#the-training-protocol).

    ``train_x``: a :class:`ClientImages` (``train_x[i]``: float32 [n_i, *input_shape],
    normalised, made when read; the images themselves held once, as stored); ``train_y[i]``:
    int64 [n_i]; likewise ``val_*`` (the 15 % hold-out of the client's data) and ``test_*``
    (the client's own test set). Per-client float tensors given instead are taken as they are
    (:meth:`ClientImages.of`). ``augment_hflip``: training should flip images horizontally at
    random.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    train_x: ClientImages
    train_y: list[torch.Tensor]
    val_x: ClientImages
    val_y: list[torch.Tensor]
    test_x: ClientImages
    test_y: list[torch.Tensor]
    augment_hflip: bool
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for split in ("train", "val", "test"):
            setattr(self, f"{split}_x", ClientImages.of(getattr(self, f"{split}_x")))

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

    def held_bytes(self) -> int:
        """Bytes this split of the data holds per client (rows and labels), beside the
        pooled images the clients share."""
        rows = sum(getattr(self, f"{s}_x").held_bytes() for s in ("train", "val", "test"))
        labels = sum(int(y.nbytes) for s in ("train", "val", "test")
                     for y in getattr(self, f"{s}_y"))
        return rows + labels


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
    """float32 [k, C, ...] = (x[index] / scale − mean) / std, one gather for all clients:
    ``float32(x) · float32(1 / (scale · std)) − float32(mean / std)`` per channel, the one
    normalisation (:meth:`ClientImages.take`)."""
    index = np.asarray(index, np.int64)
    return ClientImages(x, index, np.array([index.size]), scale=scale, mean=mean,
                        std=std).take(index)


def client_tensors(x: np.ndarray, y: np.ndarray, groups: list[np.ndarray], *, scale: float,
                   mean: np.ndarray, std: np.ndarray) -> tuple[ClientImages, list[torch.Tensor]]:
    """Per-client examples (rows of ``x``, :class:`ClientImages`) and labels (views of one
    gathered tensor) for index ``groups``."""
    sizes = [int(g.size) for g in groups]
    flat = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
    ys = torch.from_numpy(y[flat].astype(np.int64))
    xs = ClientImages(x, flat, np.array(sizes, np.int64), scale=scale, mean=mean, std=std)
    return xs, list(torch.split(ys, sizes))


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
    fit = max(1, int(pool.train_y.size) // (2 * max(int(n_clients), 1)))
    groups = make_partition(partition, pool.train_y, n_clients, alpha=alpha,
                            min_size=min_train, rng=stream(seed, "partition"), balance=balance,
                            lower=f"the dataset parameter min_train, e.g. "
                                  f"{name}:min_train={min(fit, max(int(min_train) - 1, 1))}")
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


#: the dataset parameters that size every client's data (docs/reference/components.md)
SIZE_PARAMS = ("min_train", "test_per_client")


def check_sizes(comp: Component) -> dict[str, int]:
    """The size parameters ``min_train``/``test_per_client`` given in a dataset string,
    checked: integers >= 1 (an :class:`SfgError` naming the parameter and the syntax
    otherwise). Parameters the dataset does not declare are left to :meth:`Registry.check_params`."""
    entry = DATASETS.entry(comp.name)
    what = {"min_train": "training examples every client holds at least, before the "
                         "validation hold-out",
            "test_per_client": "test examples of every client"}
    out = {}
    for key in SIZE_PARAMS:
        if key not in comp.params or key not in entry.params:
            continue
        value = comp.params[key]
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1
        check(ok, f"dataset parameter {key} ({what[key]}) must be a whole number >= 1, got "
                  f"{value!r}; write e.g. {comp.name}:{key}={_EXAMPLE[key]}")
        out[key] = int(value)
    return out


_EXAMPLE = {"min_train": 4, "test_per_client": 50}


def canonical_sizes(comp: Component) -> dict[str, Any]:
    """``comp.params`` without the size parameters equal to the dataset's default (the paper's
    values): spelling them out names the same data, so the same run."""
    entry = DATASETS.entry(comp.name)
    return {k: v for k, v in comp.params.items()
            if not (k in SIZE_PARAMS and k in entry.params and entry.params[k] is not None
                    and not isinstance(v, bool) and v == entry.params[k])}


def load_federated(name: str | Component, *, n_clients: int, seed: int,
                   data_root: str | None = None, alpha: float = 0.3,
                   min_train: int | None = None, test_per_client: int | None = None,
                   val_fraction: float = 0.15, partition: str | None = None,
                   **options: Any) -> FederatedData:
    """Load dataset ``name`` split over ``n_clients`` clients for ``seed`` (docs/concepts/training.md#the-training-protocol).

    ``name`` is a dataset id or a component string carrying dataset options
    (``"cifar10:limit_per_class=100"``); ``options`` are the same options as keywords.
    ``min_train`` (examples per client before the validation hold-out) and
    ``test_per_client`` are dataset parameters too (``"cifar10:min_train=4,test_per_client=50"``;
    a keyword and a parameter that disagree are an error) and default per dataset: CIFAR and
    image folders 20 and 300 (docs/concepts/training.md#the-training-protocol); digits 5
    (lowered to ⌊pool / 4N⌋, at least 1, for many clients: 3 at N = 100) and 50; FEMNIST 250
    (its ``min_samples``) and the writer's whole test split. ``alpha`` is the Dirichlet
    concentration (unused by FEMNIST, whose split is by writer). ``partition``:
    ``"dirichlet"`` (default) or ``"classes:k=2"`` (each client exactly k classes; datasets
    with a natural split such as FEMNIST take none).
    """
    comp = name if isinstance(name, Component) else parse_component(str(name), kind="dataset")
    if comp.modifiers:
        raise SfgError(f"dataset {comp.text!r} takes no '+' modifiers")
    entry = DATASETS.entry(comp.name)
    given = check_sizes(comp)
    params = {**comp.params, **options}
    keywords = {"min_train": min_train, "test_per_client": test_per_client}
    for key, value in keywords.items():
        if key not in entry.params:  # a dataset without the parameter takes the keyword only
            continue
        if value is not None and key in given and given[key] != value:
            raise SfgError(f"{key}={value!r} and the dataset parameter {comp.name}:{key}="
                           f"{given[key]} disagree; give only one of them")
        if value is not None:
            params[key] = value
    opts = DATASETS.check_params(comp.name, params)
    for key in keywords:
        if key in entry.params:
            keywords[key] = opts.pop(key)
    min_train, test_per_client = keywords["min_train"], keywords["test_per_client"]
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
