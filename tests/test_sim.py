"""The training simulator (docs/concepts/round.md#one-round, docs/concepts/training.md#the-training-protocol, docs/concepts/training.md#pairing): pairing, backbones, catch-up, model-reading rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sfg.errors import SfgError
from sfg.sim.run import minibatch_indices, simulate
from sfg.world.outages import make_process

TINY = dict(dataset="digits", model="mlp", n_clients=16, rounds=8, local_steps=2, batch_size=8,
            eval_every=4, graph="knn:k=4", backend="batched")


def run(**kw):
    return simulate({**TINY, **kw})


@pytest.mark.crosspath
def test_no_outage_every_sfg_member_reproduces_dfedavg_bit_for_bit():
    ref = run(process="none", rule="dfedavg")
    for rule in ["sfg", "sfg-l", "sfg-cut", "sfg-counts", "sfg:gamma=0", "sfg-cut:L=0",
                 "sfg-l:gamma=0.3+ipw"]:
        res = run(process="none", rule=rule)
        assert torch.equal(res.params, ref.params), rule
        assert res.metrics["acc_mean"] == ref.metrics["acc_mean"]
        assert res.curves == ref.curves


@pytest.mark.crosspath
def test_same_seed_identical_and_rule_never_changes_minibatches():
    a = run(process="bursty:u=0.6", rule="sfg-cut", seed=3)
    b = run(process="bursty:u=0.6", rule="sfg-cut", seed=3)
    assert torch.equal(a.params, b.params) and a.metrics["acc_mean"] == b.metrics["acc_mean"]
    c = run(process="bursty:u=0.6", rule="dfedavg", seed=3)
    d = run(process="bursty:u=0.6", rule="copy-random+catchup", seed=3)
    assert a.meta["minibatch_digest"] == c.meta["minibatch_digest"] == d.meta["minibatch_digest"]
    e = run(process="bursty:u=0.6", rule="sfg-cut", seed=4)
    assert e.meta["minibatch_digest"] != a.meta["minibatch_digest"]


def test_minibatch_indices_distinct_when_enough_data():
    sizes = np.array([3, 50, 8])
    idx = minibatch_indices(sizes, 4, 8, seed=1, stream_name="minibatch", t=0)
    assert idx.shape == (3, 4, 8)
    for i, n in enumerate(sizes):
        assert idx[i].min() >= 0 and idx[i].max() < n
    for k in range(4):
        assert len(set(idx[1, k])) == 8 and len(set(idx[2, k])) == 8  # without replacement
    again = minibatch_indices(sizes, 4, 8, seed=1, stream_name="minibatch", t=0)
    np.testing.assert_array_equal(idx, again)


def _expected_catchup_ratio(avail: np.ndarray) -> float:
    T, N = avail.shape
    age = np.zeros(N, np.int64)
    steps = base = 0
    for t in range(T):
        on = avail[t]
        steps += int(np.sum(np.where(on, 1 + np.minimum(age, 3), 0)))
        base += int(on.sum())
        age = np.where(on, 0, age + 1)
    return steps / base


def test_catchup_takes_extra_steps_only_on_return():
    res = run(process="bursty:u=0.6", rule="sfg+catchup", seed=2)
    avail = make_process("bursty:u=0.6").sample(8, 16, seed=2)
    assert res.metrics["local_steps_rel"] == pytest.approx(_expected_catchup_ratio(avail))
    assert res.metrics["local_steps_rel"] > 1
    assert run(process="none", rule="sfg+catchup").metrics["local_steps_rel"] == 1.0


def test_personal_heads_are_never_averaged():
    seen = []

    def check(r):
        head = r["head"]
        assert torch.equal(r["X_agg"][:, head], r["X"][:, head])
        seen.append(r["t"])

    res = simulate({**TINY, "process": "none", "rule": "dfedavg", "backbone": "personal-head"},
                   observer=check)
    assert len(seen) == TINY["rounds"]
    assert np.isfinite(res.metrics["acc_mean"])


def test_ditto_evaluates_the_personal_model():
    from sfg.sim.backends import make_backend
    from sfg.world.data import load_federated
    from sfg.world.models import make_model

    res = run(process="bursty:u=0.5", rule="sfg", backbone="ditto")
    assert res.personal is not None and not torch.equal(res.personal, res.params)
    data = load_federated("digits", n_clients=16, seed=1)
    model = make_model("mlp", input_shape=tuple(data.input_shape), num_classes=data.num_classes)
    backend = make_backend("batched", model)
    acc_personal = backend.evaluate(res.personal, data.test_x, data.test_y).numpy()
    acc_shared = backend.evaluate(res.params, data.test_x, data.test_y).numpy()
    np.testing.assert_allclose(res.accuracy, acc_personal, atol=1e-6)
    assert not np.allclose(acc_personal, acc_shared)


def test_sfg_cut_reduces_a_returning_clients_own_weight():
    rounds = 30
    logs = []

    def watch(r):
        logs.append((r["state"].ages.copy(), r["weights"], r["candidate"], r["caps"].adopt, r["rg"]))

    res = simulate({**TINY, "rounds": rounds, "process": "bursty:u=0.7", "rule": "sfg-cut",
                    "seed": 5}, observer=watch)
    assert all(np.isfinite(v) for k, v in res.metrics.items() if k.startswith("acc"))
    reduced = 0
    returns = 0
    for ages, w, cand, adopt, rg in logs:
        self_slot = rg.indptr[:-1]
        k = np.bincount(rg.recv, weights=cand, minlength=rg.n)
        for i in np.flatnonzero(adopt & (ages >= 1) & (k >= 2)):
            returns += 1
            reduced += w[self_slot[i]] < 1.0 / k[i] - 1e-12
    assert returns > 0 and reduced > 0
    assert reduced / returns > 0.5


def test_update_amplification_scales_returning_updates():
    a = run(process="bursty:u=0.6", rule="update-amplification", seed=2)
    b = run(process="bursty:u=0.6", rule="dfedavg", seed=2)
    assert not torch.equal(a.params, b.params)
    c = run(process="none", rule="update-amplification")
    d = run(process="none", rule="dfedavg")
    assert torch.equal(c.params, d.params)  # nobody returns: nothing amplified


@pytest.mark.parametrize("rule", ["model-memory", "model-memory+sfg", "model-memory+sfg-l",
                                  "relative-variance", "pwg", "pwg-l", "pwg:rho=0.5",
                                  "pwg-l:H=3"])
def test_model_reading_rules_run(rule):
    res = run(process="bursty:u=0.6", rule=rule)
    assert 0 <= res.metrics["acc_mean"] <= 1 and np.isfinite(res.metrics["acc_p10"])


def test_model_memory_averages_remembered_models_of_offline_neighbours():
    from sfg.round.rules import parse_rule
    from sfg.round.slots import RoundGraph
    from sfg.round.staleness import init_state
    from sfg.sim.model_rules import make_model_rule
    from sfg.world.outages.anatomy import capabilities

    rg = RoundGraph.from_edges(3, np.array([[0, 1], [0, 2]]))
    mm = make_model_rule(parse_rule("model-memory"), N=3, D=2, device="cpu")
    X0 = torch.tensor([[0.0, 0.0], [3.0, 3.0], [6.0, 9.0]])
    st = init_state(rg)
    on = capabilities(np.ones(3, bool))
    agg0, rw0 = mm.aggregate(X0, rg, st, on, live=None, seed=0)
    torch.testing.assert_close(agg0[0], torch.tensor([3.0, 4.0]))
    st = rw0.state  # the round's staleness update, with the remembered models' staleness
    # round 1: client 2 offline; client 0 averages its own, 1's current and 2's remembered model
    X1 = torch.tensor([[1.0, 1.0], [4.0, 4.0], [100.0, 100.0]])
    caps = capabilities(np.array([True, True, False]))
    agg1, rw1 = mm.aggregate(X1, rg, st, caps, live=None, seed=0)
    torch.testing.assert_close(agg1[0], (X1[0] + X1[1] + X0[2]) / 3)
    torch.testing.assert_close(agg1[2], X1[2])  # offline row untouched
    # the messages counted are the live ones only
    assert int((rw1.candidate & ~rg.is_self).sum()) == 2


def test_divergence_is_reported_with_round_and_client():
    with pytest.raises(SfgError) as e:
        run(process="none", rule="dfedavg", lr=1e12)
    msg = str(e.value)
    assert "diverged" in msg and "round" in msg and "client" in msg and "\n" not in msg


@pytest.mark.parametrize("kw, fragment", [
    ({"dataset": "digitz"}, "did you mean 'digits'"),
    ({"model": "mlpp"}, "did you mean"),
    ({"backend": "vmapp"}, "did you mean 'vmap'"),
    ({"backbone": "dito"}, "backbone"),
    ({"lr": -1}, "learning rate"),
    ({"rule": "sfg-cutt"}, "did you mean 'sfg-cut'"),
    ({"anatomy": "fulll"}, "did you mean"),
    ({"batch": 3}, "unknown run setting"),
])
def test_bad_settings_are_one_line_errors(kw, fragment):
    with pytest.raises(SfgError) as e:
        run(**kw)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_anatomy_modes_and_link_failures_run():
    for mode in ("cannot-communicate", "cannot-train-shares", "cannot-train-adopts"):
        res = run(process="bursty:u=0.6", rule="sfg-l", anatomy=mode)
        assert np.isfinite(res.metrics["acc_mean"])
    a = run(process="none", rule="dfedavg", link_failure=0.5)
    b = run(process="none", rule="dfedavg")
    assert a.metrics["messages"] < b.metrics["messages"]


def test_batch_larger_than_client_data_samples_with_replacement():
    from sfg.world.data import load_federated

    sizes = np.array([len(y) for y in load_federated("digits", n_clients=16, seed=1).train_y])
    res = run(process="none", rule="dfedavg", batch_size=64)
    assert 0 < (sizes < 64).sum() == res.meta["with_replacement_clients"]
    assert np.isfinite(res.metrics["acc_mean"])


def test_gossip_mixes_adopter_rows_in_place_and_keeps_the_rest():
    from sfg.round.slots import RoundGraph
    from sfg.sim.gossip import gossip, gossip_

    # path 0 - 1 - 2 - 3; slots by receiver: self first, then neighbours
    rg = RoundGraph.from_edges(4, np.array([[0, 1], [1, 2], [2, 3]]))
    w = np.zeros(rg.n_slots)
    W = np.zeros((4, 4))
    for i in range(4):
        sl = np.arange(rg.indptr[i], rg.indptr[i + 1])
        w[sl] = np.arange(1, sl.size + 1) / np.arange(1, sl.size + 1).sum()
        for s in sl:
            W[i, rg.send[s]] += w[s]
    X = torch.arange(12, dtype=torch.float32).reshape(4, 3) ** 1.5
    rows = np.array([False, True, True, False])
    want = X.clone()
    want[1:3] = torch.from_numpy(W[1:3]).float() @ X
    out = gossip(X, rg, w, rows)
    torch.testing.assert_close(out, want)
    assert torch.equal(out[[0, 3]], X[[0, 3]])
    Y = X.clone()
    assert gossip_(Y, rg, w, rows) is Y
    torch.testing.assert_close(Y, want)
    keep = torch.tensor([False, True, False])
    Z = X.clone()
    gossip_(Z, rg, w, rows, keep=keep)
    assert torch.equal(Z[:, 1], X[:, 1])
    torch.testing.assert_close(Z[:, [0, 2]], want[:, [0, 2]])
