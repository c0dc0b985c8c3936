"""``digits``: scikit-learn's bundled 8×8 handwritten digits (1,797 images, 10 classes).

The default dataset: embedded in scikit-learn, no download. Per seed the images are split
into a train pool and a test pool (``test_fraction`` = 30 %, stratified by class, stream
``"digits-split"``); the train pool is partitioned with Dirichlet label skew (alpha 0.3 like
CIFAR) and each client's test set (50 images by default) is drawn from the test pool with the
client's own label distribution, with replacement only for a class the client needs more of
than the test pool holds (~54 per class).

Minimum per client: the train pool has ~1,258 images, ~12.6 per client at N = 100, so the
CIFAR minimum of 20 is impossible. The default is 5, lowered to ⌊pool / (4N)⌋ (at least 1)
when clients would average fewer than 20 examples: 3 at N = 100, where one Dirichlet draw
satisfies it ~15 % of the time (minimum 5 would almost never hold at alpha 0.3). Up to ~200
clients work with the defaults; beyond that raise alpha.
Pixels (0..16) are scaled to [0, 1] and standardised with the mean/std of all 1,797 images.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from sfg.util.rng import stream
from sfg.world.data.base import (
    DATASETS,
    FederatedData,
    ImagePool,
    channel_stats,
    federate_label_skew,
    option_bool,
    option_fraction,
)


def _digits_table() -> np.ndarray:
    """scikit-learn's ``digits.csv.gz`` as float [1797, 65] (64 pixels, then the label).

    Read straight from the installed package's data folder: importing scikit-learn itself
    takes about a second, the file 20 ms. Falls back to ``load_digits`` if the file moved."""
    import gzip
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("sklearn")  # locates the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                return np.loadtxt(f, delimiter=",")
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.column_stack([bunch.data, bunch.target])


@lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All digits as uint8 [1797, 1, 8, 8] (values 0..16) and int64 labels [1797]."""
    table = _digits_table()
    images = np.rint(table[:, :64]).astype(np.uint8).reshape(-1, 1, 8, 8)
    images.setflags(write=False)
    labels = table[:, 64].astype(np.int64)
    labels.setflags(write=False)
    return images, labels


def stratified_split(labels: np.ndarray, fraction: float, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) index arrays with round(fraction · m_c) of every class c in test."""
    n_classes = int(labels.max()) + 1
    counts = np.bincount(labels, minlength=n_classes)
    order = np.lexsort((rng.random(labels.size), labels))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(labels.size) - np.repeat(starts, counts)
    n_test = np.floor(fraction * counts + 0.5).astype(np.int64)
    is_test = rank < np.repeat(n_test, counts)
    return np.sort(order[~is_test]), np.sort(order[is_test])


def digits_pool(seed: int, *, test_fraction: float = 0.3) -> ImagePool:
    """The digits train/test pools for ``seed`` (stream ``"digits-split"``)."""
    images, labels = _digits_arrays()
    train, test = stratified_split(labels, test_fraction, stream(seed, "digits-split"))
    mean, std = channel_stats(images, 16.0)
    return ImagePool(train_x=images[train], train_y=labels[train], test_x=images[test],
                     test_y=labels[test], num_classes=10, scale=16.0, mean=mean, std=std,
                     meta={"source": "sklearn.datasets.load_digits",
                           "label_names": [str(d) for d in range(10)],
                           "test_fraction": test_fraction})


def default_min_train(pool_size: int, n_clients: int) -> int:
    """Digits' default minimum: 5, or ⌊pool / 4N⌋ (≥ 1) when clients average < 20 examples."""
    if pool_size >= 20 * n_clients:
        return 5
    return int(min(5, max(1, pool_size // (4 * n_clients))))


def load_digits_federated(*, n_clients: int, seed: int, data_root=None, alpha: float,
                          min_train: int | None, test_per_client: int | None,
                          val_fraction: float, test_fraction: float = 0.3,
                          balance: bool = True, partition: str = "dirichlet") -> FederatedData:
    """Federated digits (see the module docstring); ``data_root`` is not used."""
    test_fraction = option_fraction(test_fraction, "test_fraction", low_open=True)
    pool = digits_pool(seed, test_fraction=test_fraction)
    if min_train is None:
        min_train = default_min_train(pool.train_y.size, n_clients)
    return federate_label_skew(
        pool, name="digits", n_clients=n_clients, seed=seed, alpha=alpha, min_train=min_train,
        test_per_client=50 if test_per_client is None else test_per_client,
        val_fraction=val_fraction, augment_hflip=False,
        balance=option_bool(balance, "balance"), partition=partition)


DATASETS.register(
    "digits", load_digits_federated,
    params={"test_fraction": 0.3, "balance": True, "min_train": None, "test_per_client": 50},
    doc="scikit-learn's bundled 8x8 digits (1,797 images, 10 classes); no download",
    tags=("image", "embedded"))
