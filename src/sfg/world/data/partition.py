"""Label-skew partitions, validation hold-outs and per-client test sets (docs/concepts/training.md#the-training-protocol).

Everything here works on integer labels and index arrays (numpy), never on images, and draws
its randomness from a ``np.random.Generator`` the caller keys by seed
(``sfg.util.rng.stream(seed, "partition")`` etc., docs/concepts/training.md#pairing).
"""

from __future__ import annotations

import numpy as np

from sfg.errors import SfgError, check


def _labels(labels, what: str = "labels") -> np.ndarray:
    """``labels`` as int64 [n], checked to be non-negative integers."""
    arr = np.asarray(labels)
    check(arr.ndim == 1, f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        check(bool(np.all(np.mod(arr, 1) == 0)), f"{what} must be integers")
    arr = arr.astype(np.int64, copy=False)
    check(arr.size == 0 or int(arr.min()) >= 0, f"{what} must be non-negative class indices")
    return arr


def _positive_int(value, name: str, minimum: int = 1) -> int:
    check(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum,
          f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _dirichlet_counts(class_counts: np.ndarray, n_clients: int, alpha: float,
                      rng: np.random.Generator, balance: bool) -> np.ndarray:
    """One draw of per-class client counts: int64 [C, N], row c sums to ``class_counts[c]``."""
    n = int(class_counts.sum())
    counts = np.zeros((class_counts.size, n_clients), np.int64)
    sizes = np.zeros(n_clients, np.int64)
    conc = np.full(n_clients, float(alpha))
    for c, m in enumerate(class_counts):
        p = rng.dirichlet(conc)
        if balance:
            # NIID-bench / FedML form: a client already holding its fair share n/N gets
            # nothing of the remaining classes (keeps client sizes from exploding).
            open_ = sizes < n / n_clients
            p = p * open_
            total = p.sum()
            p = p / total if total > 0 else open_ / open_.sum()
        cuts = np.floor(np.cumsum(p) * m).astype(np.int64)
        np.clip(cuts, 0, m, out=cuts)
        cuts[-1] = m
        counts[c] = np.diff(cuts, prepend=0)
        sizes += counts[c]
    return counts


def dirichlet_partition(labels, n_clients: int, *, alpha: float, min_size: int = 0,
                        rng: np.random.Generator, balance: bool = True,
                        max_tries: int = 1000, repair: bool = True,
                        lower: str = "min_train") -> list[np.ndarray]:
    """Split example indices over clients with Dirichlet(alpha) label skew (docs/concepts/training.md#the-training-protocol).

    ``labels``: int [n]. Returns ``n_clients`` int64 index arrays (ascending), disjoint and
    together covering ``range(n)``. For every class c the class's examples, in random order,
    are cut among the clients in proportions p_c ~ Dir(alpha·1_N). With ``balance`` (the
    NIID-bench/FedML form of this partition, Li et al. 2022) a client that already holds at
    least n/N examples gets no share of later classes. The whole draw is repeated until every
    client has at least ``min_size`` examples. When no draw of ``max_tries`` does (many
    clients for few examples, e.g. 1,000 clients on digits), the draw whose smallest client is
    largest is repaired (``repair``, the default): each client short of ``min_size`` takes,
    one at a time, an example of the most-held class of the largest client. Without
    ``repair`` an :class:`SfgError` says to raise alpha, lower the minimum or use fewer
    clients (``lower``: how the caller's user sets the minimum). A partition that a draw
    satisfies is never repaired, so its numbers are those
    of before the repair existed.
    """
    y = _labels(labels)
    n_clients = _positive_int(n_clients, "n_clients")
    min_size = _positive_int(min_size, "min_size", 0)
    max_tries = _positive_int(max_tries, "max_tries")
    check(isinstance(alpha, (int, float, np.floating)) and np.isfinite(alpha) and alpha > 0,
          f"Dirichlet alpha must be a positive number, got {alpha!r}")
    n = y.size
    if n_clients * min_size > n:
        raise SfgError(f"cannot give each of {n_clients} clients at least {min_size} of "
                       f"{n} examples; lower the minimum ({lower}) or use fewer clients")
    class_counts = np.bincount(y)
    present = np.flatnonzero(class_counts)
    class_counts = class_counts[present]
    # examples grouped by class (in the order of `present`), random order within each class
    order = rng.permutation(n)
    by_class = order[np.argsort(y[order], kind="stable")]

    best, best_counts = -1, None
    for _ in range(max_tries):
        counts = _dirichlet_counts(class_counts, n_clients, float(alpha), rng, balance)
        sizes = counts.sum(axis=0)
        if sizes.min() >= min_size:
            break
        if int(sizes.min()) > best:
            best, best_counts = int(sizes.min()), counts
    else:
        if not repair or best_counts is None:
            raise SfgError(
                f"cannot split {n} examples over {n_clients} clients with Dirichlet "
                f"alpha={alpha} so that every client has at least {min_size} (smallest client "
                f"in the best of {max_tries} draws: {best}); raise alpha, lower the minimum "
                f"({lower}) or use fewer clients")
        counts = _repair(best_counts, min_size)
        sizes = counts.sum(axis=0)
    owner = np.repeat(np.tile(np.arange(n_clients), class_counts.size), counts.ravel())
    client_of = np.empty(n, np.int64)
    client_of[by_class] = owner
    grouped = np.argsort(client_of, kind="stable")
    return np.split(grouped, np.cumsum(sizes)[:-1])


def _repair(counts: np.ndarray, min_size: int) -> np.ndarray:
    """``counts`` [C, N] with every client raised to ``min_size`` examples, each taken from
    the largest client's most-held class (lowest index on ties): deterministic, and the
    class totals are kept."""
    counts = counts.copy()
    sizes = counts.sum(axis=0)
    for i in np.flatnonzero(sizes < min_size):
        while sizes[i] < min_size:
            donor = int(np.argmax(sizes))
            c = int(np.argmax(counts[:, donor]))
            counts[c, donor] -= 1
            counts[c, i] += 1
            sizes[donor] -= 1
            sizes[i] += 1
    return counts


def stratified_counts(proportions, size: int) -> np.ndarray:
    """Largest-remainder rounding of ``size · proportions``: int64 [N, C], rows sum to ``size``.

    ``proportions``: [N, C] non-negative rows summing to 1. Ties between equal remainders go
    to the lower class index. Classes with proportion 0 never get a count.
    """
    p = np.asarray(proportions, np.float64)
    exact = p * size
    base = np.floor(exact + 1e-9).astype(np.int64)
    deficit = size - base.sum(axis=1)
    remainder = np.where(p > 0, exact - base, -1.0)
    order = np.argsort(-remainder, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(p.shape[1])[None, :].repeat(p.shape[0], 0), 1)
    return base + (rank < deficit[:, None])


def label_matched_test_indices(test_labels, client_label_dist, size: int,
                               rng: np.random.Generator):
    """Per-client test sets drawn from a test split with the client's label distribution.

    ``test_labels``: int [m]. ``client_label_dist``: [C] for one client or [N, C] for N
    clients (label counts or proportions, e.g. the client's training label histogram).
    Each client gets ``size`` test indices whose class counts are the largest-remainder
    rounding of size · (its proportions) (:func:`stratified_counts`); classes absent from the
    test split are dropped and the rest renormalised. Within a class, images are drawn
    without replacement while the class has enough test images, the excess with replacement.
    Returns int64 [size] for a [C] input, else a list of N such arrays (grouped by class).
    """
    y = _labels(test_labels, "test labels")
    size = _positive_int(size, "test set size")
    dist = np.asarray(client_label_dist, np.float64)
    single = dist.ndim == 1
    dist = np.atleast_2d(dist)
    check(dist.ndim == 2, f"client label distribution must be [C] or [N, C], got {dist.shape}")
    check(bool(np.isfinite(dist).all() and (dist >= 0).all()),
          "client label distributions must be finite and non-negative")
    n_clients, n_classes = dist.shape
    check(y.size == 0 or int(y.max()) < n_classes,
          f"test labels reach {int(y.max()) if y.size else 0} but the label distribution has "
          f"only {n_classes} classes")
    available = np.bincount(y, minlength=n_classes)
    dist = dist * (available > 0)
    totals = dist.sum(axis=1)
    if (totals <= 0).any():
        bad = int(np.flatnonzero(totals <= 0)[0])
        raise SfgError(f"client {bad} has no training label that occurs in the test split; "
                       "check that train and test use the same classes")
    counts = stratified_counts(dist / totals[:, None], size)  # [N, C]

    by_class = np.argsort(y, kind="stable")
    starts = np.concatenate([[0], np.cumsum(available)])
    owners, picks = [], []
    for c in np.flatnonzero(counts.sum(axis=0)):
        pool = by_class[starts[c]:starts[c + 1]]
        m = pool.size
        want = counts[:, c]
        take = np.minimum(want, m)
        rows = np.flatnonzero(take)
        if rows.size * m <= 4_000_000:  # vectorised: a random permutation per client
            perm = np.argsort(rng.random((rows.size, m)), axis=1)
            chosen = pool[perm][np.arange(m)[None, :] < take[rows, None]]
        else:  # very large classes: one draw per client keeps memory bounded
            chosen = np.concatenate([pool[rng.choice(m, take[r], replace=False)] for r in rows])
        owners.append(np.repeat(rows, take[rows]))
        picks.append(chosen)
        extra = want - take
        if extra.any():
            owners.append(np.repeat(np.arange(n_clients), extra))
            picks.append(pool[rng.integers(0, m, int(extra.sum()))])
    owner = np.concatenate(owners)
    picked = np.concatenate(picks).astype(np.int64)
    grouped = picked[np.argsort(owner, kind="stable")]
    out = np.split(grouped, np.arange(1, n_clients) * size)
    return out[0] if single else out


def validation_counts(sizes, fraction: float) -> np.ndarray:
    """Validation examples per client: round(fraction · n_i), at least 1 and at most n_i − 1
    when n_i ≥ 2 and fraction > 0; 0 for n_i < 2 (docs/concepts/training.md#the-training-protocol: 15 % hold-out)."""
    n = np.asarray(sizes, np.int64)
    if fraction <= 0:
        return np.zeros_like(n)
    k = np.floor(fraction * n + 0.5).astype(np.int64)
    return np.where(n >= 2, np.clip(k, 1, np.maximum(n - 1, 1)), 0)


def split_holdout(groups: list[np.ndarray], fraction: float, rng: np.random.Generator
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Hold out a random ``fraction`` of every group: ``(train_groups, val_groups)``.

    ``groups``: per-client int index arrays. Sizes follow :func:`validation_counts`; the
    selection is uniform within each client (one vectorised draw over all clients).
    """
    check(0 <= fraction < 1, f"val_fraction must be in [0, 1), got {fraction!r}")
    sizes = np.array([g.size for g in groups], np.int64)
    flat = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(sizes.size), sizes)
    order = np.lexsort((rng.random(flat.size), owner))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.arange(flat.size) - np.repeat(starts, sizes)
    n_val = validation_counts(sizes, fraction)
    is_val = rank < np.repeat(n_val, sizes)
    shuffled = flat[order]
    val = np.split(shuffled[is_val], np.cumsum(n_val)[:-1])
    train = np.split(shuffled[~is_val], np.cumsum(sizes - n_val)[:-1])
    return train, val


def label_histogram(labels: np.ndarray, groups: list[np.ndarray], n_classes: int) -> np.ndarray:
    """Label counts per group: int64 [N, C] (``labels`` int [n], ``groups`` index arrays)."""
    sizes = np.array([g.size for g in groups], np.int64)
    owner = np.repeat(np.arange(sizes.size), sizes)
    flat = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
    return np.bincount(owner * n_classes + labels[flat],
                       minlength=sizes.size * n_classes).reshape(sizes.size, n_classes)


# ------------------------------------------------------------------------ pathological shards
PARTITIONS = ("dirichlet", "classes")


def parse_partition(text) -> tuple[str, dict]:
    """``"dirichlet"`` or ``"classes:k=2"`` -> ``(kind, params)`` (docs/concepts/training.md#the-training-protocol).

    ``dirichlet`` takes its concentration from the separate ``alpha`` setting; ``classes``
    takes ``k`` (classes per client, default 2).
    """
    from sfg.util.components import did_you_mean, parse_component

    comp = parse_component(str(text if text is not None else "dirichlet"), kind="partition")
    check(not comp.modifiers, f"partition {comp.text!r} takes no '+' modifiers")
    if comp.name not in PARTITIONS:
        raise SfgError(f"unknown partition {comp.name!r}{did_you_mean(comp.name, PARTITIONS)} "
                       "(write 'dirichlet' or 'classes:k=2')")
    allowed = {"dirichlet": set(), "classes": {"k"}}[comp.name]
    extra = sorted(set(comp.params) - allowed)
    check(not extra, f"partition {comp.name!r} has no parameter {extra[0]!r}" if extra else "")
    if comp.name == "classes":
        return "classes", {"k": _positive_int(comp.params.get("k", 2), "partition classes:k")}
    return "dirichlet", {}


def _shard_counts(class_counts: np.ndarray, n_shards: int, n_clients: int) -> np.ndarray:
    """Shards per class: int64 [C], proportional to class sizes (largest remainder), summing to
    ``n_shards``, each at most ``min(class size, n_clients)``."""
    cap = np.minimum(class_counts, n_clients)
    if int(cap.sum()) < n_shards:
        raise SfgError(f"cannot cut {n_shards} single-class shards (each client a distinct class "
                       f"per shard) from {class_counts.size} classes of sizes up to "
                       f"{int(class_counts.max())}; use fewer clients or a smaller k")
    shares = stratified_counts((class_counts / class_counts.sum())[None, :], n_shards)[0]
    shares = np.minimum(shares, cap)
    while int(shares.sum()) < n_shards:  # give what the caps took away to classes with room
        room = np.flatnonzero(shares < cap)
        shares[room[np.argmax(class_counts[room] / (shares[room] + 1))]] += 1
    return shares


def class_shard_partition(labels, n_clients: int, *, k: int = 2, min_size: int = 0,
                          rng: np.random.Generator, max_repairs: int | None = None,
                          lower: str = "min_train") -> list[np.ndarray]:
    """The pathological split: every client holds examples of exactly ``k`` classes.

    The shard construction of the classic non-IID benchmark (McMahan et al. 2017): the
    examples of each class, in random order, are cut into near-equal single-class shards, N·k
    shards in all (a class gets shards in proportion to its size, at most one per client);
    the shards are dealt to clients at random, k each, and a client dealt two shards of one
    class swaps one of them with a random other client until every client has k distinct
    classes. Returns ``n_clients`` int64 index arrays (ascending), disjoint; every example of
    a class that gets shards is used. Classes without shards (only when N·k < classes) are
    left out.
    """
    y = _labels(labels)
    n_clients = _positive_int(n_clients, "n_clients")
    k = _positive_int(k, "partition classes:k")
    min_size = _positive_int(min_size, "min_size", 0)
    class_counts_all = np.bincount(y)
    present = np.flatnonzero(class_counts_all)
    check(k <= present.size, f"partition classes:k={k} needs at least {k} classes, the data "
                             f"has {present.size}; lower k")
    n_shards = n_clients * k
    shards_per_class = np.zeros(class_counts_all.size, np.int64)
    shards_per_class[present] = _shard_counts(class_counts_all[present], n_shards, n_clients)
    shard_class = np.repeat(np.arange(class_counts_all.size), shards_per_class)  # [N·k]
    deal = shard_class[rng.permutation(n_shards)].reshape(n_clients, k)
    # repair: a client holding one class twice swaps a duplicate with another client's shard
    limit = max_repairs if max_repairs is not None else 200 * n_shards
    for _ in range(limit):
        srt = np.sort(deal, axis=1)
        dup_rows = np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1)) if k > 1 else []
        if len(dup_rows) == 0:
            break
        i = int(dup_rows[rng.integers(len(dup_rows))])
        vals, first = np.unique(deal[i], return_index=True)
        p = int(np.setdiff1d(np.arange(k), first)[0])  # a duplicate position
        c = deal[i, p]
        j, q = int(rng.integers(n_clients)), int(rng.integers(k))
        d = deal[j, q]
        if j != i and d != c and d not in deal[i] and c not in deal[j]:
            deal[i, p], deal[j, q] = d, c
    else:
        raise SfgError(f"could not deal {k} distinct classes to each of {n_clients} clients; "
                       "use fewer clients or a smaller k")
    # cut every class (random order) into its shards and hand them to the dealt clients
    order = rng.permutation(y.size)
    by_class = order[np.argsort(y[order], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(class_counts_all)])
    owner_of_shard = np.argsort(deal.ravel(), kind="stable") // k  # shards sorted by class
    client_of = np.full(y.size, -1, np.int64)
    shard = 0
    for c in np.flatnonzero(shards_per_class):
        pool = by_class[starts[c]:starts[c + 1]]
        for part in np.array_split(pool, int(shards_per_class[c])):
            client_of[part] = owner_of_shard[shard]
            shard += 1
    used = np.flatnonzero(client_of >= 0)
    groups = [np.sort(g) for g in np.split(used[np.argsort(client_of[used], kind="stable")],
                                           np.cumsum(np.bincount(client_of[used],
                                                                 minlength=n_clients))[:-1])]
    smallest = min(g.size for g in groups)
    if smallest < min_size:
        raise SfgError(f"partition classes:k={k} gives a client only {smallest} examples, fewer "
                       f"than the minimum {min_size}; use fewer clients or lower the minimum "
                       f"({lower})")
    return groups


def make_partition(partition, labels, n_clients: int, *, alpha: float, min_size: int,
                   rng: np.random.Generator, balance: bool = True,
                   lower: str = "min_train") -> list[np.ndarray]:
    """The client index groups of ``partition`` (:func:`parse_partition`) for ``labels``;
    ``lower``: how the minimum ``min_size`` is set, for the error that asks to lower it."""
    kind, params = parse_partition(partition)
    if kind == "classes":
        return class_shard_partition(labels, n_clients, k=params["k"], min_size=min_size, rng=rng,
                                     lower=lower)
    return dirichlet_partition(labels, n_clients, alpha=alpha, min_size=min_size, rng=rng,
                               balance=balance, lower=lower)
