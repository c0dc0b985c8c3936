"""Communication graphs (docs/concepts/training.md#the-training-protocol): k-nearest-neighbour geometric, Erdős–Rényi, random regular, ring.

Every generator follows the networkx convention ``*_graph(n, ..., seed=None)``: hyperparameters are
keyword-only and validated first (bad values raise :class:`sfg.errors.SfgError` with a one-line
message), ``seed`` is an int or a ``numpy.random.Generator`` and is converted once. Every graph is
returned **connected** (docs/concepts/training.md#the-training-protocol: "made connected if necessary"); how each generator achieves that is
documented on it.

A :class:`Graph` stores the undirected edge list ``edges: [M, 2] int64`` with ``i < j``, sorted
lexicographically, without duplicates or self-loops, so memory is O(N + M): a 6-NN graph over
N = 100,000 clients builds in about a second.

Component strings pick a generator by name (``make_graph("knn:k=6", 100, seed=1)``); the
randomness comes from ``sfg.util.rng.stream(seed, "graph")`` so every rule of a seed shares the graph
(docs/concepts/training.md#pairing).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

from sfg.errors import SfgError, check
from sfg.util.components import Component, Registry, parse_component
from sfg.util.rng import as_generator, stream
from sfg.util.safety import check_cells

__all__ = [
    "GRAPHS",
    "Graph",
    "canonical_edges",
    "erdos_renyi_graph",
    "graph_names",
    "join_components",
    "knn_graph",
    "make_graph",
    "random_regular_graph",
    "ring_graph",
]

# --------------------------------------------------------------------------------------------
# The graph value


@dataclass(frozen=True)
class Graph:
    """An undirected simple graph over clients ``0..n-1``.

    ``edges: [M, 2] int64`` with ``edges[:, 0] < edges[:, 1]``, rows sorted lexicographically,
    no duplicates, no self-loops. ``positions: [N, 2] float64`` in the unit square for geometric
    graphs (``knn``), else ``None``. ``name`` is the canonical component string
    (``"knn:k=6"``, with the parameters the generator used). Arrays are read-only.
    """

    n: int
    edges: np.ndarray
    positions: np.ndarray | None
    name: str

    def __post_init__(self) -> None:
        edges = np.asarray(self.edges)
        if edges.ndim != 2 or edges.shape[1] != 2:
            raise SfgError(f"graph edges must have shape [M, 2], got {edges.shape}")
        edges = edges.astype(np.int64, copy=True)
        edges.flags.writeable = False
        object.__setattr__(self, "edges", edges)
        if self.positions is not None:
            pos = np.array(self.positions, dtype=np.float64)
            if pos.shape != (self.n, 2):
                raise SfgError(f"graph positions must have shape [N, 2] = [{self.n}, 2], "
                               f"got {pos.shape}")
            pos.flags.writeable = False
            object.__setattr__(self, "positions", pos)

    @classmethod
    def from_edges(cls, n: int, edges: np.ndarray, *, positions: np.ndarray | None = None,
                   name: str = "custom") -> Graph:
        """Build a graph from any undirected edge list ``[M, 2]`` (canonicalised first)."""
        n = _check_int("n", n, lo=1)
        return cls(n, canonical_edges(n, edges), positions, name)

    @property
    def n_edges(self) -> int:
        """M, the number of undirected edges."""
        return int(self.edges.shape[0])

    def degrees(self) -> np.ndarray:
        """``[N] int64`` number of neighbours of every client."""
        return np.bincount(self.edges.ravel(), minlength=self.n).astype(np.int64)

    def neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR adjacency: ``indptr [N+1] int64``, ``indices [2M] int64``, each row sorted.

        The neighbours of ``i`` are ``indices[indptr[i]:indptr[i+1]]``.
        """
        src = np.concatenate([self.edges[:, 0], self.edges[:, 1]])
        dst = np.concatenate([self.edges[:, 1], self.edges[:, 0]])
        order = np.lexsort((dst, src))
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=self.n), out=indptr[1:])
        return indptr, dst[order].astype(np.int64)

    def n_components(self) -> int:
        """Number of connected components (1 for every graph the generators return)."""
        return _components(self.n, self.edges)[0]

    def is_connected(self) -> bool:
        return self.n_components() == 1


# --------------------------------------------------------------------------------------------
# Validation and small helpers


def _check_int(name: str, value: object, *, lo: int | None = None, hi: int | None = None,
               hint: str = "") -> int:
    if isinstance(value, bool):
        raise SfgError(f"{name}={value!r} must be an integer{hint}")
    if not isinstance(value, Integral):
        if isinstance(value, Real) and float(value).is_integer():
            value = int(value)
        else:
            raise SfgError(f"{name}={value!r} must be an integer{hint}")
    value = int(value)
    if lo is not None and value < lo:
        raise SfgError(f"{name}={value} must be at least {lo}{hint}")
    if hi is not None and value > hi:
        raise SfgError(f"{name}={value} must be at most {hi}{hint}")
    return value


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(float(value)):
        raise SfgError(f"{name}={value!r} must be a finite number")
    return float(value)


def _check_n(n: object) -> int:
    return _check_int("n", n, lo=2, hint=" (a graph needs at least 2 clients)")


def _check_edges(n: int, degree: float) -> None:
    """Refuse a graph whose edge arrays (~64 bytes per client and neighbour) exceed the budget."""
    check_cells(n, max(degree, 1.0), 64, "this graph", rows_name="clients",
                cols_name="neighbours each", fix="lower --clients or the degree")


def canonical_edges(n: int, edges: np.ndarray) -> np.ndarray:
    """``[M, 2] int64`` edges with i < j, sorted, no self-loops or duplicates.

    ``edges`` is any ``[M, 2]`` integer array of undirected pairs in ``0..n-1``.
    """
    edges = np.asarray(edges)
    if edges.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise SfgError(f"edges must have shape [M, 2], got {edges.shape}")
    edges = edges.astype(np.int64)
    if edges.min() < 0 or edges.max() >= n:
        raise SfgError(f"edge endpoints must lie in 0..{n - 1}, got {edges.min()}..{edges.max()}")
    lo = np.minimum(edges[:, 0], edges[:, 1])
    hi = np.maximum(edges[:, 0], edges[:, 1])
    keep = lo != hi
    keys = sorted_unique(lo[keep] * np.int64(n) + hi[keep])  # n <= ~3e9 keeps this in int64
    return np.stack([keys // n, keys % n], axis=1)


def sorted_unique(keys: np.ndarray) -> np.ndarray:
    """``np.unique(keys)`` for integers (sorted, each once), by a sort: several times faster
    than the hashing ``np.unique`` on millions of keys."""
    k = np.sort(keys)
    if k.size < 2:
        return k
    keep = np.empty(k.size, bool)
    keep[0] = True
    np.not_equal(k[1:], k[:-1], out=keep[1:])
    return k[keep]


def _components(n: int, edges: np.ndarray) -> tuple[int, np.ndarray]:
    """(number of components, ``labels [N] int32``) of the undirected graph.

    Components are numbered in the order of their smallest client (component 0 holds client 0).
    Vectorised hook-and-compress: every tree root hooks onto the smallest root it shares an
    edge with, then pointers jump to their roots; pointers only ever go to smaller clients, so
    each root is its component's smallest client.
    """
    parent = np.arange(n, dtype=np.int64)
    if len(edges):
        u = np.asarray(edges[:, 0], dtype=np.int64)
        v = np.asarray(edges[:, 1], dtype=np.int64)
        while True:
            ru, rv = parent[u], parent[v]
            differ = ru != rv
            if not differ.any():
                break
            np.minimum.at(parent, np.maximum(ru[differ], rv[differ]),
                          np.minimum(ru[differ], rv[differ]))
            while True:
                grand = parent[parent]
                if np.array_equal(grand, parent):
                    break
                parent = grand
    roots, labels = np.unique(parent, return_inverse=True)
    return len(roots), labels.astype(np.int32).reshape(n)


def _members_by_component(labels: np.ndarray, n_comp: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes grouped by component: ``order [N]`` and ``starts [C+1]`` (component c is
    ``order[starts[c]:starts[c+1]]``)."""
    order = np.argsort(labels, kind="stable")
    starts = np.zeros(n_comp + 1, dtype=np.int64)
    np.cumsum(np.bincount(labels, minlength=n_comp), out=starts[1:])
    return order, starts


# --------------------------------------------------------------------------------------------
# Making graphs connected

_SMALL_COMPONENT = 64  # components up to this size find their closest outsider by a k-query
_BRUTE_FORCE_N = 4096  # up to this many clients, nearest neighbours by numpy; beyond, a k-d tree
_BLOCK = 2_000_000  # distances per block of the brute-force search


def _sq_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[len(a), len(b)]`` squared Euclidean distances between 2-D points."""
    return (a[:, None, 0] - b[None, :, 0]) ** 2 + (a[:, None, 1] - b[None, :, 1]) ** 2


def _nearest(points: np.ndarray, k: int) -> np.ndarray:
    """``[N, k] int64``: each point's k nearest points (itself included), in no fixed order.

    numpy in blocks up to :data:`_BRUTE_FORCE_N` points (no scipy import on the common
    path); scipy's k-d tree beyond (O(N k log N)).
    """
    n = len(points)
    if n > _BRUTE_FORCE_N:
        from scipy.spatial import cKDTree

        return cKDTree(points).query(points, k=k)[1].reshape(n, k).astype(np.int64)
    out = np.empty((n, k), dtype=np.int64)
    step = max(1, _BLOCK // n)
    for a in range(0, n, step):
        d = _sq_dist(points[a:a + step], points)
        out[a:a + step] = np.argpartition(d, k - 1, axis=1)[:, :k] if k < n else np.argsort(d, axis=1)
    return out


def _closest_pair(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(index into a, index into b) of the closest pair of points between two sets."""
    if len(a) * len(b) <= _BLOCK * 8 or len(a) + len(b) <= _BRUTE_FORCE_N:
        best, pair = np.inf, (0, 0)
        step = max(1, _BLOCK // len(b))
        for s in range(0, len(a), step):
            d = _sq_dist(a[s:s + step], b)
            flat = int(np.argmin(d))
            if d.flat[flat] < best:
                best = float(d.flat[flat])
                pair = (s + flat // len(b), flat % len(b))
        return pair
    from scipy.spatial import cKDTree

    dist, idx = cKDTree(b).query(a, k=1)
    row = int(np.argmin(dist))
    return row, int(idx[row])


def _closest_outside(c: int, members: np.ndarray, labels: np.ndarray, positions: np.ndarray,
                     tree: Any = None) -> tuple[int, int]:
    """The closest pair (member of component c, node outside c); ``tree`` is a k-d tree of
    ``positions`` for large N (None: numpy brute force)."""
    s = len(members)
    if s < _SMALL_COMPONENT:
        if tree is None:
            d = np.where(labels[None, :] != c, _sq_dist(positions[members], positions), np.inf)
            row, col = divmod(int(np.argmin(d)), d.shape[1])
            return int(members[row]), int(col)
        # Among any point's s+1 nearest points at most s lie in its own component.
        dist, idx = tree.query(positions[members], k=min(s + 1, len(positions)))
        dist = dist.reshape(s, -1)
        idx = idx.reshape(s, -1)
        dist = np.where(labels[idx] != c, dist, np.inf)
        row, col = divmod(int(np.argmin(dist)), dist.shape[1])
        return int(members[row]), int(idx[row, col])
    others = np.flatnonzero(labels != c)
    row, col = _closest_pair(positions[members], positions[others])
    return int(members[row]), int(others[col])


def join_components(edges: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Connect a geometric graph by joining components at their closest pair (docs/concepts/training.md#the-training-protocol).

    ``edges: [M, 2]``, ``positions: [N, 2]``; returns canonical ``[M', 2] int64`` edges with
    M' >= M. Each pass links every component except the largest to its nearest other component
    by the closest pair of points (a Borůvka step of the Euclidean minimum spanning tree over
    components); passes repeat until one component remains, at most ~log2(C) of them.
    """
    positions = np.asarray(positions, dtype=np.float64)
    n = len(positions)
    edges = canonical_edges(n, edges)
    tree = None
    while True:
        n_comp, labels = _components(n, edges)
        if n_comp == 1:
            return edges
        if tree is None and n > _BRUTE_FORCE_N:
            from scipy.spatial import cKDTree

            tree = cKDTree(positions)
        order, starts = _members_by_component(labels, n_comp)
        largest = int(np.argmax(np.diff(starts)))
        new = [
            _closest_outside(c, order[starts[c]:starts[c + 1]], labels, positions, tree)
            for c in range(n_comp) if c != largest
        ]
        edges = canonical_edges(n, np.concatenate([edges, np.asarray(new, dtype=np.int64)]))


def _join_components_randomly(n: int, edges: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Connect a graph without positions with C-1 random edges (a random tree over components).

    Components are put in random order; every component after the first is linked from a
    uniformly random member to a uniformly random node of the components before it.
    """
    n_comp, labels = _components(n, edges)
    if n_comp == 1:
        return edges
    rank = rng.permutation(n_comp)[labels]  # component order
    nodes = np.argsort(rank, kind="stable")  # nodes grouped by rank
    starts = np.zeros(n_comp + 1, dtype=np.int64)
    np.cumsum(np.bincount(rank, minlength=n_comp), out=starts[1:])
    sizes = np.diff(starts)[1:]
    pick_in = starts[1:-1] + (rng.random(n_comp - 1) * sizes).astype(np.int64)
    pick_before = (rng.random(n_comp - 1) * starts[1:-1]).astype(np.int64)
    new = np.stack([nodes[pick_in], nodes[pick_before]], axis=1)
    return canonical_edges(n, np.concatenate([edges, new]))


# --------------------------------------------------------------------------------------------
# Generators


def knn_graph(n: int, *, k: int = 6, seed: int | np.random.Generator | None = None) -> Graph:
    """k-nearest-neighbour geometric graph over uniform positions in the unit square (docs/concepts/training.md#the-training-protocol).

    Each client links to its k nearest others (:func:`_nearest`); the relation is
    symmetrised (i~j if either is among the other's k nearest), so every client has >= k
    neighbours, and made connected by :func:`join_components`. O(N k log N) time.
    """
    n = _check_n(n)
    k = _check_int("k", k, lo=1)
    check(k < n, f"k={k} must be smaller than the number of clients N={n}; lower k "
                 f"(--graph knn:k={max(1, n - 1)}) or raise N")
    _check_edges(n, k + 1)
    rng = as_generator(seed)
    positions = rng.random((n, 2))
    idx = _nearest(positions, k + 1)
    src = np.repeat(np.arange(n, dtype=np.int64), k + 1)
    edges = join_components(np.stack([src, idx.ravel()], axis=1), positions)
    return Graph(n, edges, positions, f"knn:k={k}")


_MAX_EXPECTED_EDGES = 200_000_000
_DENSE_PAIRS = 5_000_000  # below this many pairs (N ~ 3,000) a coin per pair is cheap


def erdos_renyi_graph(n: int, *, p: float | None = None, mean_degree: float = 6,
                      seed: int | np.random.Generator | None = None) -> Graph:
    """Erdős–Rényi G(n, p) graph, made connected (docs/concepts/training.md#the-training-protocol).

    ``p`` is the edge probability; when it is ``None``, ``p = mean_degree / (n - 1)``.
    Exactly M ~ Binomial(n(n-1)/2, p) distinct pairs are drawn uniformly (sparse rejection
    sampling, O(M) memory, or a coin per pair when p > 0.25 and N is small). If the sample is
    disconnected, its components are joined by C-1 random edges forming a random tree over the
    components (resampling would almost never succeed for large sparse graphs: G(10^5, 6/n)
    has ~250 isolated clients), so the realised mean degree exceeds the target by 2(C-1)/N.
    """
    n = _check_n(n)
    if p is None:
        mean_degree = _check_real("mean_degree", mean_degree)
        check(0 < mean_degree <= n - 1,
              f"mean_degree={mean_degree} must lie in (0, N-1] = (0, {n - 1}] for N={n} clients; "
              "lower mean_degree or raise N")
        p = mean_degree / (n - 1)
        label = f"erdos-renyi:mean_degree={mean_degree:g}"
    else:
        p = _check_real("p", p)
        check(0 < p <= 1, f"edge probability p={p} must lie in (0, 1]")
        label = f"erdos-renyi:p={p:g}"
    total = n * (n - 1) // 2
    _check_edges(n, 2 * total * p / n)
    rng = as_generator(seed)
    check(total * p <= _MAX_EXPECTED_EDGES,
          f"erdos-renyi with N={n}, p={p:g} would have ~{total * p:.3g} edges; lower p or N")
    if p == 1 or (p > 0.25 and total <= _DENSE_PAIRS):
        iu, ju = np.triu_indices(n, 1)
        keep = rng.random(total) < p
        edges = np.stack([iu[keep], ju[keep]], axis=1).astype(np.int64)
    else:
        m = int(rng.binomial(total, p))
        keys = np.zeros(0, dtype=np.int64)
        while len(keys) < m:
            draw = max(16, int(1.1 * (m - len(keys))) + 16)
            a = rng.integers(0, n, size=draw)
            b = rng.integers(0, n, size=draw)
            ok = a != b
            fresh = np.minimum(a[ok], b[ok]) * np.int64(n) + np.maximum(a[ok], b[ok])
            keys = np.concatenate([keys, fresh])
            _, first = np.unique(keys, return_index=True)
            keys = keys[np.sort(first)]  # distinct keys in order of first draw: uniform subset
        keys = keys[:m]
        edges = np.stack([keys // n, keys % n], axis=1)
    edges = _join_components_randomly(n, canonical_edges(n, edges), rng)
    return Graph(n, edges, None, label)


_MAX_REPAIR_ROUNDS = 10_000


def _configuration_pairs(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """A simple d-regular edge list: configuration model with randomised repair.

    Stubs are paired at random; pairs that are self-loops or repeat an earlier pair are pooled
    with as many random good pairs and re-paired, until none is left (approximately uniform
    over d-regular graphs; exact uniformity is not needed here).
    """
    if d == 0:
        return np.zeros((0, 2), dtype=np.int64)
    stubs = np.repeat(np.arange(n, dtype=np.int64), d)
    rng.shuffle(stubs)
    pairs = stubs.reshape(-1, 2)
    for _ in range(_MAX_REPAIR_ROUNDS):
        lo = pairs.min(axis=1)
        hi = pairs.max(axis=1)
        key = lo * np.int64(n) + hi
        order = np.argsort(key, kind="stable")
        bad = lo == hi
        bad[order[1:]] |= key[order[1:]] == key[order[:-1]]
        n_bad = int(bad.sum())
        if n_bad == 0:
            return pairs
        bad_idx = np.flatnonzero(bad)
        good_idx = np.flatnonzero(~bad)
        extra = rng.choice(good_idx, size=min(len(good_idx), max(n_bad, 2)), replace=False)
        idx = np.concatenate([bad_idx, extra])
        pool = pairs[idx].ravel()
        rng.shuffle(pool)
        pairs[idx] = pool.reshape(-1, 2)
    raise SfgError(f"could not build a simple {d}-regular graph on N={n} clients; "
                   "try another seed or d")  # pragma: no cover - not reached in practice


def _merge_regular_components(n: int, edges: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Connect a regular graph by degree-preserving switches.

    Components are paired up; for a pair, random edges (a, b) and (c, d), one in each, become
    (a, c) and (b, d). This merges the two unless both removed edges were bridges (then the
    next pass retries with fresh random edges).
    """
    for _ in range(200):
        n_comp, labels = _components(n, edges)
        if n_comp == 1:
            return edges
        perm = rng.permutation(len(edges))
        comp_of_edge = labels[edges[perm, 0]]
        _, first = np.unique(comp_of_edge, return_index=True)  # one random edge per component
        chosen = perm[first]
        chosen = chosen[rng.permutation(len(chosen))]
        n_pairs = len(chosen) // 2
        e1 = edges[chosen[0:2 * n_pairs:2]]
        e2 = edges[chosen[1:2 * n_pairs:2]]
        keep = np.ones(len(edges), dtype=bool)
        keep[chosen[:2 * n_pairs]] = False
        new = np.concatenate([np.stack([e1[:, 0], e2[:, 0]], 1), np.stack([e1[:, 1], e2[:, 1]], 1)])
        edges = canonical_edges(n, np.concatenate([edges[keep], new]))
    raise SfgError(f"could not connect the random regular graph on N={n} clients; "
                   "try another seed")  # pragma: no cover - not reached in practice


def random_regular_graph(n: int, *, d: int = 6,
                         seed: int | np.random.Generator | None = None) -> Graph:
    """Random connected d-regular graph (docs/concepts/training.md#the-training-protocol); needs ``n*d`` even and ``d < n``.

    Built by the configuration model with randomised repair of loops and repeated pairs
    (for d > (n-1)/2 as the complement of an (n-1-d)-regular graph), then connected by
    degree-preserving switches if needed (d >= 3 is connected with high probability; d = 2 is a
    union of cycles that the switches join into one). d = 1 is a perfect matching and can only
    be connected for N = 2.
    """
    n = _check_n(n)
    d = _check_int("d", d, lo=1)
    check(d < n, f"d={d} must be smaller than the number of clients N={n}; lower d or raise N")
    check(n * d % 2 == 0, f"a {d}-regular graph on N={n} clients needs N*d even; "
                          "change d or N by one")
    check(d >= 2 or n == 2, f"a 1-regular graph is a perfect matching and cannot be connected "
                            f"for N={n} > 2; use d >= 2")
    _check_edges(n, d if d <= (n - 1) / 2 else n)  # the complement route builds n x n masks
    rng = as_generator(seed)
    if d > (n - 1) / 2:
        sparse = canonical_edges(n, _configuration_pairs(n, n - 1 - d, rng))
        iu, ju = np.triu_indices(n, 1)
        present = np.zeros(n * n, dtype=bool)
        present[sparse[:, 0] * n + sparse[:, 1]] = True
        keep = ~present[iu * n + ju]
        edges = np.stack([iu[keep], ju[keep]], axis=1).astype(np.int64)
    else:
        edges = canonical_edges(n, _configuration_pairs(n, d, rng))
    edges = _merge_regular_components(n, edges, rng)
    return Graph(n, edges, None, f"regular:d={d}")


def ring_graph(n: int, *, k: int = 1, seed: int | np.random.Generator | None = None) -> Graph:
    """Ring lattice: client i links to its k nearest clients on each side (degree 2k).

    Deterministic; ``seed`` is accepted for a uniform generator signature and ignored.
    Needs 2k < N.
    """
    n = _check_n(n)
    k = _check_int("k", k, lo=1)
    check(2 * k < n, f"ring k={k} links each client to 2k={2 * k} others but N={n} has only "
                     f"{n - 1}; lower k to at most {(n - 1) // 2} or raise N")
    _check_edges(n, k)
    i = np.repeat(np.arange(n, dtype=np.int64), k)
    j = (i + np.tile(np.arange(1, k + 1, dtype=np.int64), n)) % n
    return Graph(n, canonical_edges(n, np.stack([i, j], axis=1)), None, f"ring:k={k}")


# --------------------------------------------------------------------------------------------
# Registry

GRAPHS = Registry("graph")
GRAPHS.register("knn", knn_graph, params={"k": 6},
                doc="k-nearest-neighbour geometric graph on uniform positions (has positions)",
                tags=("positions",))
GRAPHS.register("erdos-renyi", erdos_renyi_graph, params={"p": None, "mean_degree": 6},
                doc="Erdős–Rényi G(n, p); p defaults to mean_degree/(n-1)")
GRAPHS.register("regular", random_regular_graph, params={"d": 6},
                doc="random connected d-regular graph")
GRAPHS.register("ring", ring_graph, params={"k": 1},
                doc="ring lattice, k neighbours on each side")


def graph_names() -> list[str]:
    return GRAPHS.names()


def fit_graph(text: str, n: int) -> str:
    """The graph a run of ``n`` clients uses for ``text``: a kNN graph's k is at most n − 1
    (``knn:k=6`` at N = 4 is ``knn:k=3``), with one :func:`sfg.errors.notice` line naming the
    value used; any other graph, or one that fits, is ``text`` unchanged (its own checks
    report what is wrong with it)."""
    from sfg.errors import notice
    from sfg.util.components import format_component

    try:
        comp = parse_component(text, kind="graph")
    except SfgError:
        return text
    k = comp.params.get("k", GRAPHS.entry("knn").params["k"]) if comp.name == "knn" else None
    if (not isinstance(k, Integral) or isinstance(k, bool) or comp.modifiers
            or not 2 <= n <= k):
        return text
    used = format_component("knn", {**comp.params, "k": int(n) - 1})
    notice(f"graph {text}: k must be below the N={n} clients; using --graph {used}")
    return used


def make_graph(text: str | Component, n: int, *, seed: int) -> Graph:
    """Build a graph from a component string: ``make_graph("knn:k=6", 100, seed=1)``.

    Randomness comes from ``sfg.util.rng.stream(seed, "graph")``. Unknown names or parameters raise
    :class:`SfgError` with a did-you-mean hint.
    """
    if isinstance(text, str):
        text = fit_graph(text, n)
    comp = text if isinstance(text, Component) else parse_component(text, kind="graph")
    if comp.modifiers:
        raise SfgError(f"graph {str(comp)!r} takes no '+' modifiers")
    params = GRAPHS.check_params(comp.name, comp.params)
    seed = _check_int("seed", seed, lo=0)
    return GRAPHS.entry(comp.name).factory(n, seed=stream(seed, "graph"), **params)
