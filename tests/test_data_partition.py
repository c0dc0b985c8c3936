"""Tests for sfg.world.data.partition: Dirichlet label skew, hold-outs, label-matched test sets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfg.errors import SfgError
from sfg.util.rng import stream
from sfg.world.data.partition import (
    dirichlet_partition,
    label_histogram,
    label_matched_test_indices,
    split_holdout,
    stratified_counts,
    validation_counts,
)


def _labels(n_per_class: int, n_classes: int) -> np.ndarray:
    return np.repeat(np.arange(n_classes), n_per_class)


# ------------------------------------------------------------------ dirichlet_partition
def test_single_client_gets_everything():
    y = np.array([2, 0, 1, 1, 0])
    parts = dirichlet_partition(y, 1, alpha=0.3, rng=np.random.default_rng(0))
    assert len(parts) == 1
    np.testing.assert_array_equal(parts[0], np.arange(5))


@settings(max_examples=40, deadline=None)
@given(n_classes=st.integers(1, 6), per_class=st.integers(1, 30), n_clients=st.integers(1, 8),
       alpha=st.floats(0.05, 20.0), seed=st.integers(0, 2**32 - 1))
def test_partition_is_a_disjoint_cover(n_classes, per_class, n_clients, alpha, seed):
    y = _labels(per_class, n_classes)
    parts = dirichlet_partition(y, n_clients, alpha=alpha, rng=np.random.default_rng(seed))
    assert len(parts) == n_clients
    flat = np.concatenate(parts)
    assert flat.dtype == np.int64
    np.testing.assert_array_equal(np.sort(flat), np.arange(y.size))
    for p in parts:
        assert np.all(np.diff(p) > 0)  # ascending, no duplicates


@settings(max_examples=30, deadline=None)
@given(n_clients=st.integers(2, 12), min_size=st.integers(0, 15), seed=st.integers(0, 10**6),
       balance=st.booleans())
def test_every_client_gets_the_minimum(n_clients, min_size, seed, balance):
    y = _labels(40, 5)  # 200 examples
    min_size = min(min_size, 200 // (4 * n_clients))  # feasible at alpha 0.5
    parts = dirichlet_partition(y, n_clients, alpha=0.5, min_size=min_size, balance=balance,
                                rng=np.random.default_rng(seed))
    assert min(p.size for p in parts) >= min_size


def test_partition_is_deterministic_in_the_generator():
    y = _labels(50, 10)
    a = dirichlet_partition(y, 7, alpha=0.3, min_size=5, rng=stream(3, "partition"))
    b = dirichlet_partition(y, 7, alpha=0.3, min_size=5, rng=stream(3, "partition"))
    c = dirichlet_partition(y, 7, alpha=0.3, min_size=5, rng=stream(4, "partition"))
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))


def _mean_top_class_share(parts, y, n_classes):
    hist = label_histogram(y, parts, n_classes).astype(float)
    return float((hist.max(1) / hist.sum(1)).mean())


def test_small_alpha_skews_labels_large_alpha_does_not():
    y = _labels(200, 10)
    skewed = dirichlet_partition(y, 20, alpha=0.05, min_size=1, rng=np.random.default_rng(1))
    flat = dirichlet_partition(y, 20, alpha=100.0, min_size=1, rng=np.random.default_rng(1))
    assert _mean_top_class_share(skewed, y, 10) > 0.6
    assert _mean_top_class_share(flat, y, 10) < 0.25


def test_labels_with_missing_classes_are_fine():
    y = np.array([0, 0, 3, 3, 3, 7, 7, 7, 7])  # classes 1, 2, 4, 5, 6 absent
    parts = dirichlet_partition(y, 3, alpha=1.0, min_size=1, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(9))


def test_impossible_minimum_fails_fast_with_the_fix():
    with pytest.raises(SfgError, match="at least 11 of 100 examples; lower the minimum"):
        dirichlet_partition(_labels(10, 10), 10, alpha=0.3, min_size=11,
                            rng=np.random.default_rng(0))


def test_unlucky_minimum_gives_up_after_bounded_tries():
    y = _labels(10, 10)  # 100 examples over 20 clients, each needs 5 -> only near-uniform works
    with pytest.raises(SfgError) as info:
        dirichlet_partition(y, 20, alpha=0.05, min_size=5, rng=np.random.default_rng(0),
                            max_tries=50, repair=False)
    msg = str(info.value)
    assert "best of 50 draws" in msg and "raise alpha" in msg and "fewer clients" in msg
    assert "\n" not in msg


def test_an_unlucky_minimum_is_repaired_by_default():
    """No draw gives every client 5: the best draw is repaired (every client >= 5, classes
    and examples kept, the same split again for the same seed)."""
    y = _labels(10, 10)
    parts = dirichlet_partition(y, 20, alpha=0.05, min_size=5, rng=np.random.default_rng(0),
                                max_tries=50)
    assert min(p.size for p in parts) >= 5
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(y.size))
    again = dirichlet_partition(y, 20, alpha=0.05, min_size=5, rng=np.random.default_rng(0),
                                max_tries=50)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_a_draw_that_fits_is_not_repaired():
    """Where a draw meets the minimum, the split is that draw's, repair or not."""
    y = _labels(10, 30)
    a = dirichlet_partition(y, 8, alpha=0.3, min_size=2, rng=np.random.default_rng(3))
    b = dirichlet_partition(y, 8, alpha=0.3, min_size=2, rng=np.random.default_rng(3),
                            repair=False)
    assert all(np.array_equal(x, z) for x, z in zip(a, b, strict=True))


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 0.0}, "alpha must be a positive"),
    ({"alpha": float("nan")}, "alpha must be a positive"),
    ({"alpha": 0.3, "min_size": -1}, "min_size must be an integer >= 0"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(SfgError, match=match):
        dirichlet_partition(_labels(5, 2), 2, rng=np.random.default_rng(0), **kwargs)


def test_bad_labels_and_client_count():
    with pytest.raises(SfgError, match="non-negative"):
        dirichlet_partition([0, -1, 2], 2, alpha=1.0, rng=np.random.default_rng(0))
    with pytest.raises(SfgError, match="n_clients must be an integer >= 1"):
        dirichlet_partition([0, 1, 2], 0, alpha=1.0, rng=np.random.default_rng(0))


# ------------------------------------------------------------------ stratified counts
def test_stratified_counts_hand_case():
    counts = stratified_counts(np.array([[0.5, 0.3, 0.2], [0.0, 0.0, 1.0], [0.25, 0.25, 0.5]]), 7)
    # 3.5, 2.1, 1.4 -> 3, 2, 1 + the largest remainder (class 0)
    np.testing.assert_array_equal(counts, [[4, 2, 1], [0, 0, 7], [2, 2, 3]])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=12), st.integers(1, 500))
def test_stratified_counts_sum_and_support(weights, size):
    w = np.array(weights)
    if w.sum() == 0:
        w[0] = 1.0
    p = (w / w.sum())[None, :]
    counts = stratified_counts(p, size)
    assert counts.sum() == size
    assert np.all(counts[p == 0] == 0)
    assert np.all(np.abs(counts - size * p) < 1.0 + 1e-9)


# ------------------------------------------------------------------ label-matched test sets
def test_label_matched_counts_follow_the_client():
    test_labels = _labels(100, 4)
    dist = np.array([[10, 0, 30, 0], [1, 1, 1, 1], [0, 0, 0, 5]])  # raw counts are fine
    sets = label_matched_test_indices(test_labels, dist, 40, np.random.default_rng(0))
    assert [s.size for s in sets] == [40, 40, 40]
    np.testing.assert_array_equal(np.bincount(test_labels[sets[0]], minlength=4), [10, 0, 30, 0])
    np.testing.assert_array_equal(np.bincount(test_labels[sets[1]], minlength=4), [10] * 4)
    np.testing.assert_array_equal(np.bincount(test_labels[sets[2]], minlength=4), [0, 0, 0, 40])
    for s in sets:  # every class has 100 test images: no repeats
        assert np.unique(s).size == s.size


def test_one_client_form_returns_an_array():
    out = label_matched_test_indices([0, 1, 1, 0, 1], [1.0, 3.0], 4, np.random.default_rng(0))
    assert isinstance(out, np.ndarray) and out.dtype == np.int64
    np.testing.assert_array_equal(np.sort(np.array([0, 1, 1, 0, 1])[out]), [0, 1, 1, 1])


def test_short_class_is_drawn_with_replacement_after_exhausting_it():
    test_labels = np.array([0, 0, 1, 1, 1])
    out = label_matched_test_indices(test_labels, [1.0, 0.0], 5, np.random.default_rng(0))
    assert set(out.tolist()) == {0, 1}  # both class-0 images used, then repeats
    assert np.all(test_labels[out] == 0)


def test_classes_absent_from_the_test_split_are_renormalised():
    out = label_matched_test_indices(np.array([0, 0, 0, 2, 2]), [0.5, 0.5, 0.0], 4,
                                     np.random.default_rng(0))
    assert np.all(np.array([0, 0, 0, 2, 2])[out] == 0)
    with pytest.raises(SfgError, match="client 0 has no training label that occurs"):
        label_matched_test_indices(np.array([0, 0]), [0.0, 1.0], 3, np.random.default_rng(0))


def test_label_matched_is_deterministic_and_seed_dependent():
    y = _labels(50, 5)
    dist = np.random.default_rng(0).random((6, 5))
    a = label_matched_test_indices(y, dist, 30, stream(1, "test-sets"))
    b = label_matched_test_indices(y, dist, 30, stream(1, "test-sets"))
    c = label_matched_test_indices(y, dist, 30, stream(2, "test-sets"))
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))


def test_label_matched_rejects_bad_input():
    with pytest.raises(SfgError, match="only 2 classes"):
        label_matched_test_indices([0, 5], [1.0, 1.0], 3, np.random.default_rng(0))
    with pytest.raises(SfgError, match="non-negative"):
        label_matched_test_indices([0, 1], [1.0, -1.0], 3, np.random.default_rng(0))
    with pytest.raises(SfgError, match="test set size must be an integer >= 1"):
        label_matched_test_indices([0, 1], [1.0, 1.0], 0, np.random.default_rng(0))


# ------------------------------------------------------------------ validation hold-out
def test_validation_counts_hand_cases():
    sizes = [0, 1, 2, 3, 10, 20, 100]
    np.testing.assert_array_equal(validation_counts(sizes, 0.15), [0, 0, 1, 1, 2, 3, 15])
    np.testing.assert_array_equal(validation_counts(sizes, 0.0), [0] * 7)
    np.testing.assert_array_equal(validation_counts([2, 4], 0.9), [1, 3])  # keeps one to train


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=10), st.floats(0, 0.9),
       st.integers(0, 1000))
def test_split_holdout_partitions_each_group(sizes, fraction, seed):
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    groups = [np.arange(offsets[i], offsets[i + 1]) * 3 for i in range(len(sizes))]
    train, val = split_holdout(groups, fraction, np.random.default_rng(seed))
    expected_val = validation_counts(sizes, fraction)
    for g, t, v, k in zip(groups, train, val, expected_val, strict=True):
        assert v.size == k and t.size == g.size - k
        np.testing.assert_array_equal(np.sort(np.concatenate([t, v])), g)


def test_split_holdout_rejects_bad_fraction():
    with pytest.raises(SfgError, match="val_fraction must be in"):
        split_holdout([np.arange(3)], 1.0, np.random.default_rng(0))


def test_label_histogram():
    y = np.array([0, 1, 1, 2])
    hist = label_histogram(y, [np.array([0, 1]), np.array([2, 3]), np.array([], np.int64)], 3)
    np.testing.assert_array_equal(hist, [[1, 1, 0], [0, 1, 1], [0, 0, 0]])
