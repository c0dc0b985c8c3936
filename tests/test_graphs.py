"""Tests for sfg.world.graphs (docs/concepts/training.md#the-training-protocol): generators, connectivity, invariants, registry, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from sfg.errors import SfgError
from sfg.util.rng import stream
from sfg.world.graphs import (
    GRAPHS,
    Graph,
    _join_components_randomly,
    canonical_edges,
    erdos_renyi_graph,
    join_components,
    knn_graph,
    make_graph,
    random_regular_graph,
    ring_graph,
)

ALL_SPECS = ["knn:k=6", "knn:k=2", "erdos-renyi", "erdos-renyi:mean_degree=2",
             "erdos-renyi:p=0.3", "regular:d=6", "regular:d=3", "regular:d=2", "ring:k=1",
             "ring:k=3"]


def assert_simple(g: Graph) -> None:
    """Edges: [M, 2] int64, i < j, lexicographically sorted, unique, in range."""
    e = g.edges
    assert e.dtype == np.int64 and e.ndim == 2 and e.shape[1] == 2
    assert (e[:, 0] < e[:, 1]).all()
    assert e.min() >= 0 and e.max() < g.n
    keys = e[:, 0] * g.n + e[:, 1]
    assert (np.diff(keys) > 0).all()  # sorted and no duplicates


def components(g: Graph) -> int:
    """Independent BFS count of connected components."""
    indptr, indices = g.neighbours()
    seen = np.zeros(g.n, dtype=bool)
    count = 0
    for start in range(g.n):
        if seen[start]:
            continue
        count += 1
        frontier = [start]
        seen[start] = True
        while frontier:
            node = frontier.pop()
            for nb in indices[indptr[node]:indptr[node + 1]]:
                if not seen[nb]:
                    seen[nb] = True
                    frontier.append(int(nb))
    return count


# ---------------------------------------------------------------------------- connectivity


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("n", [10, 50, 300])
def test_every_generator_is_connected_and_simple(spec, n):
    for seed in range(4):
        g = make_graph(spec, n, seed=seed)
        assert g.n == n
        assert_simple(g)
        assert components(g) == 1
        assert g.is_connected()


def test_join_components_links_two_clusters_by_their_closest_pair():
    rng = np.random.default_rng(0)
    a = 0.1 + 0.05 * rng.random((30, 2))
    b = 0.8 + 0.05 * rng.random((40, 2))
    pos = np.concatenate([a, b])
    _, idx = cKDTree(pos).query(pos, k=4)
    raw = canonical_edges(70, np.stack([np.repeat(np.arange(70), 4), idx.ravel()], 1))
    assert Graph(70, raw, pos, "raw").n_components() == 2  # raw knn is disconnected
    joined = join_components(raw, pos)
    assert Graph(70, joined, pos, "joined").n_components() == 1
    new = {tuple(e) for e in joined} - {tuple(e) for e in raw}
    d = cdist(a, b)
    i, j = np.unravel_index(np.argmin(d), d.shape)
    assert new == {(int(i), int(30 + j))}  # exactly one edge: the closest pair


def test_join_components_three_clusters_builds_spanning_tree_of_closest_pairs():
    # Three clusters on a line: A (x~0), B (x~0.5), C (x~1). A-C is farther than A-B and B-C.
    rng = np.random.default_rng(1)
    clusters = [np.c_[0.02 * rng.random(10) + x, 0.02 * rng.random(10)] for x in (0.0, 0.5, 1.0)]
    pos = np.concatenate(clusters)
    raw = np.concatenate([
        np.stack([np.arange(c * 10, c * 10 + 9), np.arange(c * 10 + 1, c * 10 + 10)], 1)
        for c in range(3)
    ])  # a path inside each cluster
    joined = join_components(raw, pos)
    new = {tuple(e) for e in joined} - {tuple(e) for e in canonical_edges(30, raw)}
    assert len(new) == 2

    def closest(p, q, off_p, off_q):
        d = cdist(clusters[p], clusters[q])
        i, j = np.unravel_index(np.argmin(d), d.shape)
        return (off_p + int(i), off_q + int(j))

    assert new == {closest(0, 1, 0, 10), closest(1, 2, 10, 20)}


def test_join_components_handles_many_isolated_points():
    # No edges at all: every point is its own component; result is connected with N-1 edges
    # (a Euclidean minimum spanning tree when there are no ties).
    pos = np.random.default_rng(3).random((200, 2))
    joined = join_components(np.zeros((0, 2), dtype=np.int64), pos)
    g = Graph(200, joined, pos, "mst")
    assert g.is_connected() and g.n_edges == 199
    from scipy.sparse.csgraph import minimum_spanning_tree

    mst = minimum_spanning_tree(cdist(pos, pos)).tocoo()
    expected = canonical_edges(200, np.stack([mst.row, mst.col], 1))
    np.testing.assert_array_equal(joined, expected)


def test_knn_with_k1_needs_joining_and_gets_connected():
    n = 300
    g = knn_graph(n, k=1, seed=5)
    pos = g.positions
    _, idx = cKDTree(pos).query(pos, k=2)
    raw = canonical_edges(n, np.stack([np.arange(n), idx[:, 1]], 1))
    assert Graph(n, raw, pos, "raw").n_components() > 1  # the joining routine was exercised
    assert g.is_connected()
    assert {tuple(e) for e in raw} <= {tuple(e) for e in g.edges}


def test_random_join_connects_an_empty_graph_with_a_tree():
    edges = _join_components_randomly(12, np.zeros((0, 2), dtype=np.int64),
                                      np.random.default_rng(0))
    g = Graph(12, edges, None, "tree")
    assert g.n_edges == 11 and g.is_connected()


# ---------------------------------------------------------------------------- structure


def test_knn_contains_every_nodes_k_nearest_and_nothing_else():
    n, k = 60, 4
    g = knn_graph(n, k=k, seed=2)
    assert (g.degrees() >= k).all()
    d = cdist(g.positions, g.positions)
    np.fill_diagonal(d, np.inf)
    nearest = np.argsort(d, axis=1)[:, :k]
    expected = canonical_edges(n, np.stack([np.repeat(np.arange(n), k), nearest.ravel()], 1))
    # knn at k=4 on 60 uniform points: compare with the brute-force symmetrised relation,
    # plus whatever joining edges were needed (none if the raw graph is connected).
    raw = Graph(n, expected, g.positions, "raw")
    if raw.is_connected():
        np.testing.assert_array_equal(g.edges, expected)
    else:
        assert {tuple(e) for e in expected} < {tuple(e) for e in g.edges}
    assert g.positions.shape == (n, 2)
    assert (g.positions >= 0).all() and (g.positions < 1).all()


@pytest.mark.parametrize("n,d", [(10, 3), (50, 6), (101, 4), (12, 9), (8, 7), (300, 2), (2, 1)])
def test_regular_degrees(n, d):
    for seed in range(3):
        g = random_regular_graph(n, d=d, seed=seed)
        assert_simple(g)
        assert (g.degrees() == d).all()
        assert g.n_edges == n * d // 2
        assert g.is_connected()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(3, 40), d=st.integers(2, 39), seed=st.integers(0, 10_000))
def test_regular_property(n, d, seed):
    if d >= n or n * d % 2:
        with pytest.raises(SfgError, match=rf"must be smaller than the number of clients N={n}"
                                           rf"|{d}-regular graph on N={n} clients needs N\*d even"):
            random_regular_graph(n, d=d, seed=seed)
        return
    g = random_regular_graph(n, d=d, seed=seed)
    assert_simple(g)
    assert (g.degrees() == d).all() and g.is_connected()


def test_ring_hand_computed():
    g = ring_graph(5, k=1)
    np.testing.assert_array_equal(g.edges, [[0, 1], [0, 4], [1, 2], [2, 3], [3, 4]])
    g = ring_graph(7, k=2)
    expected = sorted({tuple(sorted((i, (i + s) % 7))) for i in range(7) for s in (1, 2)})
    np.testing.assert_array_equal(g.edges, expected)
    assert (g.degrees() == 4).all()
    assert (ring_graph(1000, k=3).degrees() == 6).all()
    assert g.positions is None


def test_erdos_renyi_mean_degree_and_no_index_bias():
    g = erdos_renyi_graph(2000, mean_degree=6, seed=4)
    deg = g.degrees()
    assert abs(deg.mean() - 6) < 0.3  # sd of the mean degree ~0.08 plus ~0.01 from joining
    assert abs(deg[:1000].mean() - deg[1000:].mean()) < 0.5  # the pair sample is uniform
    g = erdos_renyi_graph(60, p=0.5, seed=4)
    assert abs(g.degrees().mean() - 29.5) < 2.5  # sd ~0.6
    full = erdos_renyi_graph(8, p=1.0, seed=0)
    assert full.n_edges == 28


def test_csr_neighbours_are_symmetric_and_sorted():
    g = make_graph("knn:k=5", 80, seed=3)
    indptr, indices = g.neighbours()
    assert indptr.shape == (81,) and indices.shape == (2 * g.n_edges,)
    np.testing.assert_array_equal(np.diff(indptr), g.degrees())
    assert g.degrees().sum() == 2 * g.n_edges
    pairs = set()
    for i in range(g.n):
        row = indices[indptr[i]:indptr[i + 1]]
        assert (np.diff(row) > 0).all() and i not in row
        pairs |= {(i, int(j)) for j in row}
    assert all((j, i) in pairs for i, j in pairs)
    assert {(min(p), max(p)) for p in pairs} == {tuple(e) for e in g.edges}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 14), st.integers(0, 14)), max_size=60))
def test_canonical_edges_property(pairs):
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    out = canonical_edges(15, arr)
    expected = sorted({(min(a, b), max(a, b)) for a, b in pairs if a != b})
    assert [tuple(r) for r in out.tolist()] == expected
    assert out.dtype == np.int64 and out.shape == (len(expected), 2)


def test_graph_arrays_are_read_only():
    g = make_graph("knn", 20, seed=0)
    with pytest.raises(ValueError):
        g.edges[0, 0] = 5
    with pytest.raises(ValueError):
        g.positions[0, 0] = 0.5


def test_from_edges_canonicalises():
    g = Graph.from_edges(4, np.array([[1, 0], [0, 1], [2, 2], [3, 2]]))
    np.testing.assert_array_equal(g.edges, [[0, 1], [2, 3]])
    assert not g.is_connected() and g.n_components() == 2


# ---------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("spec", ["knn:k=6", "erdos-renyi", "regular:d=4", "ring:k=2"])
def test_same_seed_same_graph_different_seed_differs(spec):
    a = make_graph(spec, 100, seed=7)
    b = make_graph(spec, 100, seed=7)
    np.testing.assert_array_equal(a.edges, b.edges)
    if a.positions is not None:
        np.testing.assert_array_equal(a.positions, b.positions)
    c = make_graph(spec, 100, seed=8)
    if spec.startswith("ring"):
        np.testing.assert_array_equal(a.edges, c.edges)  # deterministic lattice
    else:
        assert a.edges.shape != c.edges.shape or not np.array_equal(a.edges, c.edges)


def test_make_graph_uses_the_graph_stream_and_generators_accept_generators():
    g = make_graph("knn:k=6", 100, seed=1)
    h = knn_graph(100, k=6, seed=stream(1, "graph"))
    np.testing.assert_array_equal(g.edges, h.edges)
    np.testing.assert_array_equal(g.positions, h.positions)
    assert g.name == "knn:k=6"
    assert make_graph("ring", 10, seed=0).name == "ring:k=1"
    i1 = knn_graph(30, seed=11)
    i2 = knn_graph(30, seed=np.random.default_rng(11))
    np.testing.assert_array_equal(i1.edges, i2.edges)


def test_registry_names():
    assert GRAPHS.names() == ["erdos-renyi", "knn", "regular", "ring"]


def test_knn_scales_to_100k_clients():
    # speed lives in benchmarks (about 1 s here); this checks the large case is right
    g = knn_graph(100_000, k=6, seed=0)
    assert g.is_connected()
    assert (g.degrees() >= 6).all()
    assert g.n_edges <= 100_000 * 6  # memory O(edges): at most N*k undirected edges (+joins)


# ---------------------------------------------------------------------------- errors


def test_knn_k_too_large_message():
    with pytest.raises(SfgError, match=r"k=100 must be smaller than the number of clients "
                                       r"N=100; lower k \(--graph knn:k=99\) or raise N"):
        knn_graph(100, k=100, seed=0)


@pytest.mark.parametrize("call, message", [
    (lambda: knn_graph(1, k=1), r"n=1 must be at least 2 \(a graph needs at least 2 clients\)"),
    (lambda: knn_graph(10, k=0), r"k=0 must be at least 1"),
    (lambda: knn_graph(10, k=2.5), r"k=2.5 must be an integer"),
    (lambda: knn_graph(10, k=True), r"k=True must be an integer"),
    (lambda: erdos_renyi_graph(10, p=0), r"edge probability p=0.0 must lie in \(0, 1\]"),
    (lambda: erdos_renyi_graph(10, p=1.5), r"edge probability p=1.5 must lie in \(0, 1\]"),
    (lambda: erdos_renyi_graph(10, mean_degree=10), r"mean_degree=10.0 must lie in \(0, N-1\]"),
    (lambda: erdos_renyi_graph(10, mean_degree=-1), r"mean_degree=-1.0 must lie in \(0, N-1\]"),
    (lambda: random_regular_graph(7, d=3), r"3-regular graph on N=7 clients needs N\*d even"),
    (lambda: random_regular_graph(6, d=6), r"d=6 must be smaller than the number of clients N=6"),
    (lambda: random_regular_graph(10, d=1), r"1-regular graph is a perfect matching"),
    (lambda: random_regular_graph(10, d=0), r"d=0 must be at least 1"),
    (lambda: ring_graph(6, k=3), r"ring k=3 links each client to 2k=6 others but N=6"),
    (lambda: ring_graph(2, k=1), r"ring k=1 links each client to 2k=2 others but N=2"),
    (lambda: make_graph("knn:k=6", 100, seed=-1), r"seed=-1 must be at least 0"),
    (lambda: make_graph("knn+ipw", 10, seed=0), r"graph 'knn\+ipw' takes no '\+' modifiers"),
])
def test_bad_arguments_raise_sfg_error(call, message):
    with pytest.raises(SfgError, match=message):
        call()


def test_unknown_names_and_keys_suggest():
    with pytest.raises(SfgError, match="did you mean 'knn'"):
        make_graph("knnn", 10, seed=0)
    with pytest.raises(SfgError, match="did you mean 'erdos-renyi'"):
        make_graph("erdos_renyi", 10, seed=0)
    with pytest.raises(SfgError, match="did you mean 'k'"):
        make_graph("ring:kk=2", 10, seed=0)


def _bfs_components(n, edges):
    """Oracle: component labels by breadth-first search, numbered by smallest client."""
    nbrs = [[] for _ in range(n)]
    for a, b in edges:
        nbrs[a].append(b)
        nbrs[b].append(a)
    labels = [-1] * n
    count = 0
    for start in range(n):
        if labels[start] >= 0:
            continue
        labels[start] = count
        queue = [start]
        while queue:
            x = queue.pop()
            for y in nbrs[x]:
                if labels[y] < 0:
                    labels[y] = count
                    queue.append(y)
        count += 1
    return count, labels


@pytest.mark.parametrize("seed", range(6))
def test_components_match_a_breadth_first_search(seed):
    from sfg.world.graphs import _components

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 200))
    m = int(rng.integers(0, 2 * n))
    edges = canonical_edges(n, rng.integers(0, n, size=(m, 2)))
    count, labels = _components(n, edges)
    want_count, want_labels = _bfs_components(n, edges.tolist())
    assert count == want_count and labels.tolist() == want_labels
    # a path given in decreasing order is one component (pointer chains are compressed)
    path = np.stack([np.arange(n - 1, 0, -1), np.arange(n - 2, -1, -1)], axis=1)
    assert _components(n, path)[0] == 1


def test_knn_numpy_search_and_kd_tree_give_the_same_graph(monkeypatch):
    """Up to _BRUTE_FORCE_N clients the neighbours come from numpy, beyond from scipy's k-d
    tree; forcing either path on the same positions gives the same edges."""
    import sfg.world.graphs as G

    for k in (1, 6):  # k=1 leaves many components: exercises join_components on both paths
        numpy_path = knn_graph(600, k=k, seed=4)
        monkeypatch.setattr(G, "_BRUTE_FORCE_N", 10)
        tree_path = knn_graph(600, k=k, seed=4)
        monkeypatch.undo()
        np.testing.assert_array_equal(numpy_path.edges, tree_path.edges)
