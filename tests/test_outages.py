"""Tests for sfg.world.outages: synthetic processes (docs/concepts/outages.md#outage-processes), anatomy modes (docs/concepts/outages.md#anatomy-modes), link failures (docs/concepts/outages.md#link-failures)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfg.errors import SfgError
from sfg.world.graphs import make_graph
from sfg.world.outages import (
    ANATOMY_MODES,
    PROCESSES,
    capabilities,
    link_failures,
    live_links_round,
    make_process,
    process_names,
)
from sfg.world.outages.synthetic import (
    TOLERANCE,
    Heterogeneous,
    Regional,
    gilbert_elliott,
    kmeans_labels,
    region_labels,
)

T, N = 300, 100


@pytest.fixture(scope="module")
def positions():
    return make_graph("knn:k=6", N, seed=1).positions


def unavailability(a: np.ndarray) -> float:
    return 1.0 - a.mean()


def mean_outage(a: np.ndarray) -> float:
    """Mean outage length as 1 / P(off -> on), counted over consecutive round pairs.

    Unlike the mean of observed run lengths this is not biased by runs cut at the window edges.
    """
    off = ~a
    return off[:-1].sum() / (off[:-1] & ~off[1:]).sum()


def synthetic_names():
    return PROCESSES.names(tag="synthetic")


# ---------------------------------------------------------------------------- calibration

CALIBRATED = [
    *[f"iid:u={u}" for u in (0.0, 0.1, 0.5, 0.8)],
    *[f"bursty:u={u}" for u in (0.0, 0.1, 0.5, 0.8)],
    *[f"heterogeneous:u={u}" for u in (0.0, 0.1, 0.3, 0.5)],
    *[f"regional:u={u},groups={g},layout={lay}" for u in (0.05, 0.2, 0.5, 0.8)
      for g in (5, 20) for lay in ("spatial", "scattered")],
]


@pytest.mark.parametrize("spec", CALIBRATED)
def test_realised_unavailability_within_tolerance(spec, positions):
    u = float(spec.split("u=")[1].split(",")[0])
    for seed in (1, 2):
        a = make_process(spec).sample(T, N, seed=seed, positions=positions)
        assert a.shape == (T, N) and a.dtype == bool
        assert abs(unavailability(a) - u) <= TOLERANCE + 1e-12


def test_heterogeneous_high_target_is_structurally_unreachable_but_accepted():
    # docs/concepts/outages.md#outage-processes: heterogeneous u = 0.8 realises about 0.77 (rates clipped at 0.98; a chain with
    # mean outage 5 is offline at most 5/6 of the time).
    for seed in (1, 2, 3):
        x = unavailability(make_process("heterogeneous:u=0.8").sample(T, N, seed=seed))
        assert 0.74 <= x <= 0.79
        assert x < 0.8 - TOLERANCE


def test_calibration_picks_the_first_qualifying_attempt():
    # iid u=0.5 over 4 client-rounds: only exactly 2 offline of 4 qualifies (|x - u| <= 0.005).
    a = make_process("iid:u=0.5").sample(2, 2, seed=3)
    assert (~a).sum() == 2


# ---------------------------------------------------------------------------- chain shape


@pytest.mark.parametrize("spec,expected,tol", [
    # tol ~ 3 sd of the estimator across seeds (sd 0.27 at u=0.3 for mean 10; 0.09 for mean 5)
    ("bursty:u=0.3", 10, 0.9),
    ("bursty:u=0.5", 10, 0.9),
    ("bursty:u=0.8", 10, 0.9),
    ("bursty:u=0.5,mean_off=4", 4, 0.4),
    ("heterogeneous:u=0.3", 5, 0.3),
    ("heterogeneous:u=0.5", 5, 0.3),
    ("heterogeneous:u=0.8", 5, 0.3),
    ("iid:u=0.5", 2, 0.15),  # iid: geometric outages with mean 1/(1-u)
])
def test_mean_outage_length(spec, expected, tol):
    a = make_process(spec).sample(T, N, seed=4)
    assert abs(mean_outage(a) - expected) <= tol


def test_gilbert_elliott_starts_stationary_and_caps():
    rng = np.random.default_rng(0)
    off, stationary = gilbert_elliott(rng, 40, np.full(20_000, 0.3), mean_off=10)
    np.testing.assert_allclose(stationary, 0.3)
    assert abs(off[0].mean() - 0.3) < 0.015  # sd 0.0032
    assert abs(off[-1].mean() - 0.3) < 0.015
    # A rate above mean_off/(mean_off+1) is capped: on->off prob 1, stationary 5/6.
    off, stationary = gilbert_elliott(rng, 400, np.full(5000, 0.95), mean_off=5)
    np.testing.assert_allclose(stationary, 5 / 6)
    assert abs(off.mean() - 5 / 6) < 0.01
    on = ~off
    assert not (on[:-1] & on[1:]).any()  # on-periods last exactly one round


def test_heterogeneous_rates_are_spread_and_clipped():
    rates = Heterogeneous(u=0.8).rates(np.random.default_rng(0), 5000)
    assert rates.max() <= 0.98 and rates.min() >= 0
    assert rates.std() > 0.1  # heterogeneous, not all equal
    assert rates.mean() < 0.8  # clipping lowers the mean below the rescaled 0.8


def test_heterogeneous_clients_differ():
    a = make_process("heterogeneous:u=0.3").sample(T, N, seed=5)
    per_client = 1 - a.mean(0)
    b = make_process("bursty:u=0.3").sample(T, N, seed=5)
    # Beta(0.6, 1.4) rates have sd ~0.26; bursty clients share one rate (sd ~0.08 from noise).
    assert per_client.std() > 1.5 * (1 - b.mean(0)).std()
    assert per_client.std() > 0.15


# ---------------------------------------------------------------------------- regional


def corr_by_region(a: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    c = np.corrcoef((~a).T.astype(float))
    same = labels[:, None] == labels[None, :]
    np.fill_diagonal(same, False)
    other = labels[:, None] != labels[None, :]
    return float(np.nanmean(c[same])), float(np.nanmean(c[other]))


def test_regional_clients_in_a_region_fail_together(positions):
    proc = make_process("regional:u=0.5,groups=5")
    a = proc.sample(T, N, seed=6, positions=positions)
    labels = proc.regions(N, seed=6, positions=positions)
    same, other = corr_by_region(a, labels)
    assert same > 0.7  # ~0.9 expected: shared region chain, 5% independent noise
    assert abs(other) < 0.15


def test_regional_spatial_regions_are_compact_scattered_are_not(positions):
    graph = make_graph("knn:k=6", N, seed=1)
    spatial = region_labels(positions, groups=5, layout="spatial", seed=6)
    scattered = region_labels(positions, groups=5, layout="scattered", seed=6)
    assert sorted(np.bincount(spatial)) == sorted(np.bincount(scattered))  # same sizes
    assert not np.array_equal(spatial, scattered)
    e = graph.edges
    within_spatial = np.mean(spatial[e[:, 0]] == spatial[e[:, 1]])
    within_scattered = np.mean(scattered[e[:, 0]] == scattered[e[:, 1]])
    assert within_spatial > 0.75 and within_scattered < 0.4  # ~0.2 expected for 5 groups
    # Graph neighbours' traces: strongly correlated for spatial, much less for scattered.
    a_sp = make_process("regional:u=0.5").sample(T, N, seed=6, positions=positions)
    a_sc = make_process("regional:u=0.5,layout=scattered").sample(T, N, seed=6,
                                                                   positions=positions)

    def neighbour_corr(a):
        c = np.corrcoef((~a).T.astype(float))
        return np.nanmean(c[e[:, 0], e[:, 1]])

    assert neighbour_corr(a_sp) > neighbour_corr(a_sc) + 0.3


def test_kmeans_recovers_separated_clusters():
    rng = np.random.default_rng(0)
    centres = np.array([[0.1, 0.1], [0.9, 0.1], [0.5, 0.9]])
    pts = np.concatenate([c + 0.02 * rng.standard_normal((30, 2)) for c in centres])
    labels = kmeans_labels(pts, 3, np.random.default_rng(1))
    truth = np.repeat(np.arange(3), 30)
    for c in range(3):  # each true cluster gets one label, all labels distinct
        assert len(set(labels[truth == c])) == 1
    assert len(set(labels)) == 3
    assert (np.bincount(kmeans_labels(pts, 90, np.random.default_rng(1))) == 1).all()


def test_regional_without_positions():
    with pytest.raises(SfgError, match="positions"):
        make_process("regional:u=0.5").sample(T, N, seed=0)
    a = make_process("regional:u=0.5,layout=scattered").sample(T, N, seed=0)
    assert abs(unavailability(a) - 0.5) <= TOLERANCE


def test_regional_rate_formula():
    proc = Regional(u=0.5)
    assert abs(1 - (1 - proc.regional_rate) * (1 - 0.05) - 0.5) < 1e-12


# ---------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", ["none", "iid", "bursty", "heterogeneous", "regional"])
def test_conformance_same_seed_same_trace(name, positions):
    assert name in synthetic_names()
    spec = name if name == "none" else f"{name}:u=0.5"
    proc = make_process(spec)
    a = proc.sample(T, N, seed=9, positions=positions)
    b = make_process(spec).sample(T, N, seed=9, positions=positions.copy())
    assert a.shape == (T, N) and a.dtype == bool
    np.testing.assert_array_equal(a, b)
    c = proc.sample(T, N, seed=10, positions=positions)
    if name == "none":
        assert a.all() and c.all()
    else:
        assert not np.array_equal(a, c)
    assert isinstance(proc.name, str) and proc.name.startswith(name)


def test_every_registered_synthetic_process_is_covered():
    assert set(synthetic_names()) == {"none", "iid", "bursty", "heterogeneous", "regional"}
    assert set(synthetic_names()) <= set(process_names())


def test_none_is_always_available():
    a = make_process("none").sample(7, 3, seed=0)
    assert a.shape == (7, 3) and a.all()


def test_names_are_canonical():
    assert make_process("iid:u=0.8").name == "iid:u=0.8"
    assert make_process("bursty:u=0.8").name == "bursty:mean_off=10,u=0.8"


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("spec,match", [
    ("iid:u=1", "u=1"),
    ("bursty:u=1.0", "u=1"),
    ("iid:u=-0.1", r"\[0, 1\)"),
    ("iid:u=1.5", r"\[0, 1\)"),
    ("iid", "needs a target unavailability"),
    ("heterogeneous:u=abc", "must be a number"),
    ("bursty:u=0.95", "unreachable"),  # above 10/11 with mean outage 10
    ("bursty:u=0.5,mean_off=0.5", "mean_off"),
    ("regional:u=0.03", "below the independent failure rate"),
    ("regional:u=0.5,layout=spacial", "did you mean 'spatial'"),
    ("regional:u=0.5,groups=0", "groups"),
    ("regional:u=0.5,p_indiv=1.2", "p_indiv"),
    ("bursti:u=0.5", "did you mean 'bursty'"),
    ("bursty:u=0.5,mean_of=3", "did you mean 'mean_off'"),
    ("bursty:u=0.5+ipw", "modifiers"),
])
def test_impossible_requests_raise(spec, match):
    with pytest.raises(SfgError, match=match):
        make_process(spec)


def test_unresolvable_small_trace_takes_the_nearest_value_with_advice():
    """One cell resolves u = 0 or 1 only: u = 0.3 takes 0, the nearest, with one notice."""
    from sfg.errors import SfgNotice

    with pytest.warns(SfgNotice, match=r"'iid'.*u=0.3.*nearest achievable, 0.0000.*more clients "
                                       r"or rounds"):
        A = make_process("iid:u=0.3").sample(1, 1, seed=0)
    assert A.all()


@pytest.mark.parametrize("T_,N_", [(0, 5), (5, 0), (2.5, 5), (-1, 3)])
def test_bad_shape_raises(T_, N_):
    bad = "T" if not (isinstance(T_, int) and T_ >= 1) else "N"
    with pytest.raises(SfgError, match=rf"{bad}=.* must be a positive integer \(rounds T, clients N\)"):
        make_process("iid:u=0.2").sample(T_, N_, seed=0)


def test_regional_groups_and_positions_checked(positions):
    with pytest.raises(SfgError, match="groups=20"):
        make_process("regional:u=0.5,groups=20").sample(T, 10, seed=0,
                                                         positions=positions[:10])
    with pytest.raises(SfgError, match="shape"):
        make_process("regional:u=0.5").sample(T, N, seed=0, positions=positions[:50])


# ---------------------------------------------------------------------------- anatomy

# (train, send, aggregate, adopt) for an offline client; online clients have all four.
OFFLINE_TRUTH = {
    "full": (False, False, False, False),
    "cannot-communicate": (True, False, False, False),
    "cannot-train-shares": (False, True, False, False),
    "cannot-train-adopts": (False, True, True, True),
}


@pytest.mark.parametrize("mode", ANATOMY_MODES)
def test_anatomy_truth_tables(mode):
    avail = np.array([True, False, True, False])
    caps = capabilities(avail, mode)
    off = OFFLINE_TRUTH[mode]
    for field, keep in zip(("train", "send", "aggregate", "adopt"), off, strict=True):
        got = getattr(caps, field)
        assert got.dtype == bool and got.shape == (4,)
        np.testing.assert_array_equal(got, [True, keep, True, keep])


def test_anatomy_default_and_whole_trace():
    trace = make_process("iid:u=0.5").sample(20, 6, seed=0)
    caps = capabilities(trace)  # default "full"
    for field in ("train", "send", "aggregate", "adopt"):
        np.testing.assert_array_equal(getattr(caps, field), trace)
    caps = capabilities(trace, "cannot-communicate")
    assert caps.train.shape == (20, 6) and caps.train.all()
    np.testing.assert_array_equal(caps.send, trace)


def test_anatomy_outputs_do_not_alias_input_and_accept_01():
    avail = np.array([1, 0, 1])
    caps = capabilities(avail, "full")
    caps.train[0] = False
    np.testing.assert_array_equal(avail, [1, 0, 1])
    assert caps.send.tolist() == [True, False, True]
    with pytest.raises(SfgError, match=r"availability must be boolean \(or 0/1\)"):
        capabilities(np.array([0, 2]), "full")


def test_anatomy_unknown_mode_suggests():
    with pytest.raises(SfgError, match="did you mean 'cannot-communicate'"):
        capabilities(np.ones(3, bool), "cannot-comunicate")


# ---------------------------------------------------------------------------- links


def test_link_failure_rate_and_independence():
    edges = make_graph("knn:k=6", 300, seed=0).edges
    live = link_failures(edges, 200, p=0.4, seed=3)
    assert live.shape == (200, len(edges)) and live.dtype == bool
    assert abs((~live).mean() - 0.4) < 0.01  # sd ~0.0012
    # independent across rounds: P(live at t and t+1) ~ 0.36
    assert abs((live[:-1] & live[1:]).mean() - 0.36) < 0.01


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 50), t_max=st.integers(1, 12), p=st.floats(0, 0.99),
       seed=st.integers(0, 2**31))
def test_per_round_form_equals_whole_trace(m, t_max, p, seed):
    edges = np.zeros((m, 2), dtype=np.int64)
    whole = link_failures(edges, t_max, p=p, seed=seed)
    for t in range(t_max):
        np.testing.assert_array_equal(live_links_round(m, t, p=p, seed=seed), whole[t])


def test_links_determinism_and_edge_cases():
    edges = np.array([[0, 1], [1, 2], [0, 2]])
    a = link_failures(edges, 50, p=0.5, seed=1)
    np.testing.assert_array_equal(a, link_failures(edges, 50, p=0.5, seed=1))
    assert not np.array_equal(a, link_failures(edges, 50, p=0.5, seed=2))
    assert link_failures(edges, 5, p=0.0, seed=1).all()
    for bad in (1.0, -0.1, 2):
        with pytest.raises(SfgError, match=rf"link failure probability p={bad} must lie in \[0, 1\)"):
            link_failures(edges, 5, p=bad, seed=1)
    with pytest.raises(SfgError, match=r"edges must have shape \[M, 2\], got \(3,\)"):
        link_failures(np.zeros(3), 5, p=0.3, seed=1)
    with pytest.raises(SfgError, match=r"t=-1 must be a non-negative integer"):
        live_links_round(3, -1, p=0.3, seed=1)
