"""Datasets in their standard formats, label-skew partitions, per-client test sets (docs/concepts/training.md#the-training-protocol).

``load_federated(name, n_clients=N, seed=s, data_root=...)`` returns a :class:`FederatedData`
(per-client train/validation/test examples: rows of one shared pool of the images as stored,
:class:`ClientImages`, normalised when read). Datasets (registry :data:`DATASETS`):

* ``digits`` — scikit-learn's bundled 8×8 digits; no download (the default data);
* ``cifar10`` / ``cifar100`` — the python pickle archives or an image folder;
* ``femnist`` — LEAF JSON shards, one client per writer;
* ``imagefolder`` — any ``train/<class>/*``, ``test/<class>/*`` folder.
"""

from sfg.world.data.base import (
    DATASETS,
    ClientImages,
    FederatedData,
    ImagePool,
    PoolBatch,
    dataset_names,
    federate_label_skew,
    load_federated,
)
from sfg.world.data.partition import (
    dirichlet_partition,
    label_histogram,
    label_matched_test_indices,
    split_holdout,
    stratified_counts,
    validation_counts,
)

__all__ = [
    "DATASETS",
    "ClientImages",
    "FederatedData",
    "ImagePool",
    "PoolBatch",
    "dataset_names",
    "dirichlet_partition",
    "federate_label_skew",
    "label_histogram",
    "label_matched_test_indices",
    "load_federated",
    "split_holdout",
    "stratified_counts",
    "validation_counts",
]

# every reader registers its datasets when imported; importing any module of this package
# runs this face first, so DATASETS is complete wherever it is read
from sfg.world.data import cifar, digits, femnist, imagefolder  # noqa: E402, F401
