"""The flat parameter store and the local-training backends (docs/concepts/round.md#local-training, docs/concepts/training.md#the-training-protocol).

Every backend must equal a plain per-client ``torch.optim.SGD`` loop, be deterministic, and
respect momentum buffers, the Ditto proximal term and trainable masks.
"""

from __future__ import annotations

import copy
import platform

import pytest
import torch
import torch.nn.functional as F
from crosspath import derived_tolerance
from hypothesis import given, settings
from hypothesis import strategies as st

from sfg.errors import SfgError
from sfg.sim.backends import (
    BatchedBackend,
    LoopBackend,
    VmapBackend,
    auto_choice,
    make_backend,
    sequential_plan,
    tune_cpu_allocator,
)
from sfg.sim.params import (
    ParamSpec,
    flatten,
    functional_forward,
    init_params,
    load_flat,
    unflatten,
)
from sfg.world.models import make_model


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    """Single-threaded kernels: on a shared machine a two-thread kernel stalls whenever
    another process holds a core. Worker-thread variants (``workers=2``) still run threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SHAPES = {"mlp": (64,), "small-cnn": (1, 8, 8), "cnn": (3, 32, 32), "resnet18-gn": (3, 16, 16)}
BACKENDS = ["loop", "vmap", "batched", "loop:workers=2", "vmap:workers=2,chunk=1",
            "batched:workers=2", "batched:channels_last=false", "loop:channels_last=false"]
# every backend on every model, and the option variants on the cheap small CNN
EQUIVALENCE = ([(m, b) for m in ("mlp", "small-cnn", "cnn") for b in ("loop", "vmap", "batched")]
               + [("small-cnn", b) for b in BACKENDS[3:]]
               + [("cnn", "batched:channels_last=false"), ("cnn", "loop:channels_last=false")])


def uses_channels_last(name, backend):
    """Whether ``backend`` feeds convolutions channels_last inputs (the reference then does
    too: torch's own NCHW and channels_last convolutions differ by float rounding, and a ReLU
    or max-pool tie within that rounding can flip, so formats are compared like for like)."""
    if name == "mlp":
        return False
    if backend.startswith(("loop", "batched")):
        return "channels_last=false" not in backend
    return False


def factory(name, classes=10):
    return lambda: make_model(name, input_shape=SHAPES[name], num_classes=classes)


def problem(name, *, n=3, K=3, B=4, seed=0, classes=10):
    """Distinct per-client starting models and minibatches."""
    gen = torch.Generator().manual_seed(seed)
    model = factory(name, classes)()
    P = init_params(factory(name, classes), n, seed=seed)
    P = P + 0.01 * torch.randn(P.shape, generator=gen)
    xs = torch.randn(n, K, B, *SHAPES[name], generator=gen)
    ys = torch.randint(0, classes, (n, K, B), generator=gen)
    return model, P, xs, ys


def reference(model, P, xs, ys, *, lr, weight_decay, momentum=0.0, center=None, lam=0.0,
              train_names=None, buffers=None, channels_last=False):
    """Plain per-client loop: an nn.Module and a torch.optim.SGD per client."""
    out, bufs = [], []
    for i in range(P.shape[0]):
        m = copy.deepcopy(model)
        load_flat(m, P[i])
        named = list(m.named_parameters())
        params = [p for n, p in named if train_names is None or n in train_names]
        for n, p in named:
            p.requires_grad_(train_names is None or n in train_names)
        opt = torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, momentum=momentum)
        if buffers is not None:  # continue from given heavy-ball buffers
            views = ParamSpec.from_module(m).unflatten(buffers[i])
            for n, p in named:
                if train_names is None or n in train_names:
                    opt.state[p]["momentum_buffer"] = views[n].clone()
        for k in range(xs.shape[1]):
            opt.zero_grad()
            x = xs[i, k]
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(m(x), ys[i, k])
            if lam:
                flat = torch.cat([p.reshape(-1) for p in m.parameters()])
                loss = loss + lam / 2 * ((flat - center[i]) ** 2).sum()
            loss.backward()
            opt.step()
        out.append(flatten(m))
        if momentum:
            bufs.append(torch.cat([opt.state[p]["momentum_buffer"].reshape(-1)
                                   if p in opt.state else torch.zeros(p.numel())
                                   for _, p in named]))
    return torch.stack(out), (torch.stack(bufs) if momentum else None)


# ----------------------------------------------------------------------------------------------
# flat parameter store


def test_param_spec_layout_and_head_mask():
    model = make_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    spec = ParamSpec.from_module(model)
    assert spec.D == 878_538
    assert spec.names[:2] == ("conv1.weight", "conv1.bias")
    assert spec.offsets[:3] == (0, 2400, 2432)
    assert spec.shapes[0] == (32, 3, 5, 5)
    assert spec.head_mask.dtype == torch.bool and spec.head_mask.shape == (spec.D,)
    assert int(spec.head_mask.sum()) == 5130
    assert spec.head_mask[-5130:].all() and not spec.head_mask[:-5130].any()
    assert spec.slice("head.bias") == slice(spec.D - 10, spec.D)
    with pytest.raises(SfgError, match="no parameter"):
        spec.slice("nope")


def test_flatten_unflatten_round_trip_and_views():
    model = make_model("small-cnn", input_shape=(1, 8, 8), num_classes=10)
    spec = ParamSpec.from_module(model)
    flat = flatten(model)
    views = unflatten(spec, flat)
    for name, p in model.named_parameters():
        assert torch.equal(views[name], p.detach())
    views["head.bias"][0] = 123.0  # a view: writes reach the flat vector
    assert flat[spec.slice("head.bias")][0] == 123.0
    X = torch.stack([flat, 2 * flat])
    batched = spec.unflatten(X)
    assert batched["conv1.weight"].shape == (2, 16, 1, 3, 3)
    assert batched["conv1.weight"].data_ptr() == X.data_ptr()
    assert torch.equal(spec.flatten_tensors(batched), X)
    with pytest.raises(SfgError, match="D="):
        spec.unflatten(torch.zeros(5))


def test_init_params_same_model_for_every_client_and_seeded():
    before = torch.random.get_rng_state()
    X = init_params(factory("mlp"), 4, seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)  # global RNG untouched
    assert X.shape == (4, 8970) and X.dtype == torch.float32
    assert torch.equal(X, X[:1].expand(4, -1))
    assert torch.equal(X, init_params(factory("mlp"), 4, seed=7))
    assert not torch.equal(X, init_params(factory("mlp"), 4, seed=8))
    X[0, 0] = 99.0  # rows are independent storage
    assert X[1, 0] != 99.0
    with pytest.raises(SfgError, match="positive"):
        init_params(factory("mlp"), 0, seed=1)


def test_functional_forward_and_load_flat_agree_with_the_module():
    model, P, xs, _ = problem("cnn", n=2, K=1)
    spec = ParamSpec.from_module(model)
    m = load_flat(copy.deepcopy(model), P[1])
    x = xs[1, 0]
    assert torch.allclose(functional_forward(model, spec, P[1], x), m(x), atol=1e-6)
    P[1] += 1.0  # load_flat copied: the module does not alias the store
    assert not torch.allclose(flatten(m), P[1])


# ----------------------------------------------------------------------------------------------
# training equals torch.optim.SGD


def assert_trained_alike(got, want, start):
    """Two trainings that compute the same steps with sums in another order (batched or vmapped
    kernels against per-client autograd). Most parameters agree to 1e-5; a few do not, and how
    many depends on the instruction set: a ReLU input within rounding of 0 flips and changes its
    gradient, and batched GroupNorm rounds its statistics differently (measured on the CNN over
    3 steps: 0 parameters off by more than 1e-5 with AVX2, 368 of 2.6M, at most 4.6e-5, on the
    baseline ISA; ResNet-18-GN after one step under vmap: 487 of 22.3M, at most 1.07e-4, with
    AVX2 and 0 on the baseline ISA). Bound: the update (got − start) to 0.2 % in L2, every
    parameter to 1 % of the largest step, and all but 0.1 % of them to 1e-5 — a wrong gradient
    or a missed step breaks the first two by orders of magnitude."""
    diff, step = (got - want).abs(), (want - start).abs()
    assert (got - want).norm() <= 2e-3 * (want - start).norm()
    assert diff.max() <= 1e-2 * step.max()
    assert (diff > 1e-5).sum() <= 1e-3 * diff.numel()


@pytest.mark.parametrize("name,backend", EQUIVALENCE)
def test_train_equals_per_client_torch_sgd(name, backend):
    model, P, xs, ys = problem(name)
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    want, want_buf = reference(model, P, xs, ys, channels_last=uses_channels_last(name, backend),
                               **kw)
    P_before = P.clone()
    buf = torch.zeros_like(P)
    got = make_backend(backend, model).train(P, xs, ys, momentum_buf=buf, **kw)
    assert got.shape == P.shape and got.dtype == torch.float32
    assert torch.equal(P, P_before)  # input not modified
    assert (got - P).abs().max() > 1e-3  # it trained
    assert_trained_alike(got, want, P)
    assert_trained_alike(buf, want_buf, torch.zeros_like(buf))  # buffers updated in place


@pytest.mark.crosspath
@pytest.mark.parametrize("backend", ["loop", "vmap", "batched"])
def test_plain_sgd_without_momentum_and_fresh_buffers(backend):
    model, P, xs, ys = problem("mlp", n=4, K=2, B=6, seed=3)
    want, _ = reference(model, P, xs, ys, lr=0.1, weight_decay=0.0)
    got = make_backend(backend, model).train(P, xs, ys, lr=0.1, weight_decay=0.0)
    tol = derived_tolerance(lambda p: reference(model, p, xs, ys, lr=0.1, weight_decay=0.0)[0], P)
    torch.testing.assert_close(got, want, atol=tol, rtol=0)
    # momentum without a buffer == a freshly created optimiser
    want_m, _ = reference(model, P, xs, ys, lr=0.1, weight_decay=1e-3, momentum=0.5)
    got_m = make_backend(backend, model).train(P, xs, ys, lr=0.1, weight_decay=1e-3,
                                               momentum=0.5)
    tol = derived_tolerance(lambda p: reference(model, p, xs, ys, lr=0.1, weight_decay=1e-3,
                                                momentum=0.5)[0], P)
    torch.testing.assert_close(got_m, want_m, atol=tol, rtol=0)


@pytest.mark.crosspath
@pytest.mark.parametrize("backend", ["loop", "vmap", "batched"])
def test_momentum_buffers_carry_over_between_calls(backend):
    model, P, xs, ys = problem("small-cnn", n=3, K=4)
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    want, want_buf = reference(model, P, xs, ys,
                               channels_last=uses_channels_last("small-cnn", backend), **kw)
    be = make_backend(backend, model)
    buf = torch.zeros_like(P)
    half = be.train(P, xs[:, :2], ys[:, :2], momentum_buf=buf, **kw)
    got = be.train(half, xs[:, 2:], ys[:, 2:], momentum_buf=buf, **kw)
    cl = uses_channels_last("small-cnn", backend)
    tol = derived_tolerance(lambda p: reference(model, p, xs, ys, channels_last=cl, **kw)[0], P)
    tol_buf = derived_tolerance(lambda p: reference(model, p, xs, ys, channels_last=cl,
                                                    **kw)[1], P)
    torch.testing.assert_close(got, want, atol=tol, rtol=0)
    torch.testing.assert_close(buf, want_buf, atol=tol_buf, rtol=0)


@pytest.mark.crosspath
@pytest.mark.parametrize("backend", ["loop", "vmap", "batched"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_prox_term_matches_ditto_objective(name, backend):
    model, P, xs, ys = problem(name, K=2)
    center = P + 0.05 * torch.randn(P.shape, generator=torch.Generator().manual_seed(1))
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    cl = uses_channels_last(name, backend)
    want, _ = reference(model, P, xs, ys, center=center, lam=0.2, channels_last=cl, **kw)
    got = make_backend(backend, model).train(P, xs, ys, prox_center=center, prox_lam=0.2, **kw)
    tol = derived_tolerance(lambda p: reference(model, p, xs, ys, center=center, lam=0.2,
                                                channels_last=cl, **kw)[0], P)
    torch.testing.assert_close(got, want, atol=tol, rtol=0)
    plain, _ = reference(model, P, xs, ys, channels_last=cl, **kw)
    assert (got - plain).abs().max() > 1e-4  # the pull mattered


@pytest.mark.parametrize("backend", ["loop", "vmap", "batched"])
@pytest.mark.parametrize("part", ["head", "body"])
def test_trainable_mask_freezes_the_rest(backend, part):
    model, P, xs, ys = problem("small-cnn", K=3)
    spec = ParamSpec.from_module(model)
    mask = spec.head_mask if part == "head" else ~spec.head_mask
    names = {n for n in spec.names if (n in model.head_names) == (part == "head")}
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    start_buf = 0.01 * torch.randn(P.shape, generator=torch.Generator().manual_seed(2))
    buf = start_buf.clone()
    want, want_buf = reference(model, P, xs, ys, train_names=names, buffers=start_buf,
                               channels_last=uses_channels_last("small-cnn", backend), **kw)
    got = make_backend(backend, model).train(P, xs, ys, trainable_mask=mask, momentum_buf=buf,
                                             **kw)
    assert torch.equal(got[:, ~mask], P[:, ~mask])  # frozen coordinates bit-identical
    assert torch.equal(buf[:, ~mask], start_buf[:, ~mask])  # and their buffers untouched
    assert (got[:, mask] - P[:, mask]).abs().max() > 1e-4
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(buf[:, mask], want_buf[:, mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["loop", "vmap", "loop:channels_last=false"])
def test_resnet18_gn_matches_reference(backend):
    # one step: over several steps GroupNorm's batched (vmap) kernels round differently and a
    # ReLU input within rounding of 0 can flip, which grows beyond float noise
    model, P, xs, ys = problem("resnet18-gn", n=2, K=1, B=4)
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    cl = uses_channels_last("resnet18-gn", backend)
    want, _ = reference(model, P, xs, ys, channels_last=cl, **kw)
    got = make_backend(backend, model).train(P, xs, ys, **kw)
    assert_trained_alike(got, want, P)


@pytest.mark.parametrize("name", ["cnn", "resnet18-gn"])
def test_memory_formats_agree_up_to_rounding(name):
    """NCHW and channels_last training differ only by float rounding (plus rare kink flips)."""
    model, P, xs, ys = problem(name, n=2, K=1, B=4)
    a = make_backend("loop", model).train(P, xs, ys, lr=0.05, weight_decay=5e-4)
    b = make_backend("loop:channels_last=false", model).train(P, xs, ys, lr=0.05,
                                                               weight_decay=5e-4)
    torch.testing.assert_close(a, b, atol=2e-4, rtol=0)


def test_batched_refuses_resnet_and_names_alternatives():
    model = make_model("resnet18-gn", input_shape=(3, 16, 16), num_classes=10)
    with pytest.raises(SfgError, match="'loop', 'vmap'"):
        make_backend("batched", model)
    plan, reason = sequential_plan(model)
    assert plan is None and "Sequential" in reason


@pytest.mark.crosspath
@pytest.mark.parametrize("name", ["mlp", "small-cnn", "cnn"])
def test_backends_agree_with_each_other_on_more_clients(name):
    """Other kernels, the same training: within a tolerance derived from the run itself
    (crosspath.derived_tolerance: 64 × the growth of a one-ulp perturbation), which stays far
    below what one flipped label of one example does."""
    model, P, xs, ys = problem(name, n=5, K=2, B=8, seed=4)
    kw = dict(lr=0.03, weight_decay=1e-3, momentum=0.5)
    loop = make_backend("loop:channels_last=false", model)
    tol = derived_tolerance(lambda p: loop.train(p, xs, ys, **kw), P)
    outs = {b: make_backend(b, model).train(P, xs, ys, **kw)
            for b in ["loop:channels_last=false", "loop", "vmap:chunk=2", "batched:chunk=3"]}
    first = outs["loop:channels_last=false"]
    for b, out in outs.items():
        torch.testing.assert_close(out, first, atol=tol, rtol=0, msg=b)
    flipped = ys.clone()
    flipped[0, 0, 0] = (flipped[0, 0, 0] + 1) % 10  # one semantic change: one label
    planted = float((loop.train(P, xs, flipped, **kw) - first).abs().max())
    assert 0 < tol < planted / 100, (tol, planted)


@pytest.mark.crosspath
@pytest.mark.parametrize("backend", BACKENDS)
def test_training_is_bit_for_bit_deterministic(backend):
    model, P, xs, ys = problem("small-cnn", n=5, K=2)
    be = make_backend(backend, model)
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    a = be.train(P, xs, ys, momentum_buf=torch.zeros_like(P), **kw)
    b = make_backend(backend, model).train(P, xs, ys, momentum_buf=torch.zeros_like(P), **kw)
    assert torch.equal(a, b)


@pytest.mark.crosspath
@pytest.mark.parametrize("name", ["small-cnn", "cnn"])
def test_loop_client_result_does_not_depend_on_who_else_trains(name):
    """Pairing (docs/concepts/training.md#pairing): a client's trained model is bit-identical whether it trains alone or
    with others (every worker chunk is single-threaded, even for one client)."""
    model, P, xs, ys = problem(name, n=4, K=2)
    be = make_backend("loop:workers=2", model)
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.9)
    together = be.train(P, xs, ys, **kw)
    alone = be.train(P[2:3], xs[2:3], ys[2:3], **kw)
    assert torch.equal(together[2:3], alone)


def test_workers_restore_thread_count_and_zero_steps_copy():
    model, P, xs, ys = problem("mlp", n=4, K=1)
    threads = torch.get_num_threads()
    make_backend("loop:workers=3", model).train(P, xs, ys, lr=0.1, weight_decay=0.0)
    assert torch.get_num_threads() == threads
    out = make_backend("vmap", model).train(P, xs[:, :0], ys[:, :0], lr=0.1, weight_decay=0.0)
    assert torch.equal(out, P) and out.data_ptr() != P.data_ptr()


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 4), K=st.integers(1, 3), B=st.integers(1, 5),
       lr=st.floats(0.0, 0.5), wd=st.floats(0.0, 0.01), mom=st.floats(0.0, 0.95),
       seed=st.integers(0, 1000))
@pytest.mark.crosspath
def test_batched_and_vmap_equal_loop_for_any_hyperparameters(n, K, B, lr, wd, mom, seed):
    model, P, xs, ys = problem("mlp", n=n, K=K, B=B, seed=seed)
    kw = dict(lr=lr, weight_decay=wd, momentum=mom)
    loop = make_backend("loop", model)
    ref = loop.train(P, xs, ys, **kw)
    tol = derived_tolerance(lambda p: loop.train(p, xs, ys, **kw), P)
    for b in ("vmap", "batched"):
        torch.testing.assert_close(make_backend(b, model).train(P, xs, ys, **kw), ref,
                                   atol=tol, rtol=0)


# ----------------------------------------------------------------------------------------------
# evaluation


def manual_accuracy(model, P, xs, ys):
    out = []
    for i in range(P.shape[0]):
        m = load_flat(copy.deepcopy(model), P[i])
        with torch.no_grad():
            out.append((m(xs[i]).argmax(-1) == ys[i]).float().mean())
    return torch.stack(out)


@pytest.mark.parametrize("backend", ["loop", "vmap", "batched", "vmap:workers=2",
                                     "batched:workers=2,chunk=2"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_evaluate_matches_a_manual_loop(name, backend):
    model, P, _, _ = problem(name, n=5, K=1)
    gen = torch.Generator().manual_seed(5)
    shared_x = torch.randn(9, *SHAPES[name], generator=gen)
    shared_y = torch.randint(0, 10, (9,), generator=gen)
    sizes = [7, 1, 9, 12, 9]  # unequal sets; clients 2 and 4 share one tensor
    xs = [torch.randn(s, *SHAPES[name], generator=gen) for s in sizes]
    ys = [torch.randint(0, 10, (s,), generator=gen) for s in sizes]
    xs[2] = xs[4] = shared_x
    ys[2] = ys[4] = shared_y
    P[:, -10:] += torch.randn(5, 10, generator=gen)  # vary the head bias: varied accuracies
    want = manual_accuracy(model, P, xs, ys)
    be = make_backend(backend, model)
    for bs in (1024, 3):
        got = be.evaluate(P, xs, ys, batch_size=bs)
        assert got.shape == (5,) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # tensor form [n, m, ...]
    X = torch.randn(5, 6, *SHAPES[name], generator=gen)
    Y = torch.randint(0, 10, (5, 6), generator=gen)
    torch.testing.assert_close(be.evaluate(P, X, Y), manual_accuracy(model, P, X, Y),
                               atol=1e-6, rtol=0)


def test_evaluate_sees_in_place_changes_of_its_inputs():
    model, P, _, _ = problem("mlp", n=3, K=1)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(8, 64, generator=gen)
    y = torch.randint(0, 10, (8,), generator=gen)
    for b in ("loop", "batched"):
        be = make_backend(b, model)
        first = be.evaluate(P, [x, x, x], [y, y, y])
        pred = load_flat(copy.deepcopy(model), P[0])(x).argmax(-1)
        y_hit = y.clone()
        y.copy_(pred)  # now every client-0 prediction is right
        second = be.evaluate(P, [x, x, x], [y, y, y])
        assert second[0] == 1.0 and torch.equal(second, manual_accuracy(model, P, [x] * 3, [y] * 3))
        y.copy_(y_hit)
        torch.testing.assert_close(be.evaluate(P, [x, x, x], [y, y, y]), first)


def test_evaluate_hand_computed_case():
    """A linear model whose predictions are known by hand."""
    model = make_model("mlp:hidden=", input_shape=(2,), num_classes=2)
    spec = ParamSpec.from_module(model)
    P = torch.zeros(2, spec.D)
    w = spec.unflatten(P)
    w["head.weight"][0] = torch.tensor([[1.0, 0.0], [0.0, 1.0]])   # client 0: argmax of x
    w["head.weight"][1] = torch.tensor([[0.0, 1.0], [1.0, 0.0]])   # client 1: the opposite
    x = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 4.0], [1.0, 2.0]])
    y = torch.tensor([0, 1, 0, 0])
    for b in ("loop", "vmap", "batched"):
        acc = make_backend(b, model).evaluate(P, [x, x], [y, y])
        assert acc.tolist() == [0.75, 0.25]


# ----------------------------------------------------------------------------------------------
# construction, auto and errors


def test_auto_rule_on_cpu():
    mlp = make_model("mlp", input_shape=(64,), num_classes=10)
    cnn = make_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    tiny = make_model("small-cnn", input_shape=(1, 8, 8), num_classes=10)
    res = make_model("resnet18-gn", input_shape=(3, 16, 16), num_classes=10)
    assert auto_choice(mlp) == "batched" and isinstance(make_backend("auto", mlp), BatchedBackend)
    assert auto_choice(cnn) == "loop" and isinstance(make_backend("auto", cnn), LoopBackend)
    assert auto_choice(tiny) == "batched"
    assert auto_choice(res) == "loop"
    femnist_small = make_model("small-cnn", input_shape=(1, 28, 28), num_classes=62)
    femnist_cnn = make_model("cnn", input_shape=(1, 28, 28), num_classes=62)
    assert auto_choice(femnist_small) == "batched" and auto_choice(femnist_cnn) == "loop"
    # the rule is a function of the architecture only: the same choice every time
    assert [auto_choice(cnn) for _ in range(3)] == ["loop"] * 3
    assert isinstance(make_backend("vmap", res), VmapBackend)
    assert make_backend("auto:workers=1", mlp).workers == 1
    # raising glibc's mmap/trim thresholds works wherever glibc is the C library
    assert tune_cpu_allocator() == (platform.libc_ver()[0] == "glibc")
    assert tune_cpu_allocator() == tune_cpu_allocator()  # idempotent


def test_input_validation_errors():
    model, P, xs, ys = problem("mlp", n=2, K=1)
    be = make_backend("batched", model)
    kw = dict(lr=0.1, weight_decay=0.0)
    with pytest.raises(SfgError, match="params must be"):
        be.train(P[:, :-1], xs, ys, **kw)
    with pytest.raises(SfgError, match="xs must be"):
        be.train(P, xs[0], ys, **kw)
    with pytest.raises(SfgError, match="ys must be"):
        be.train(P, xs, ys[:, :, :2], **kw)
    with pytest.raises(SfgError, match="labels in"):
        be.train(P, xs, ys + 10, **kw)
    with pytest.raises(SfgError, match="example shape"):
        be.train(P, xs[..., :10], ys, **kw)
    with pytest.raises(SfgError, match="momentum"):
        be.train(P, xs, ys, momentum=1.0, **kw)
    with pytest.raises(SfgError, match="lr"):
        be.train(P, xs, ys, lr=float("nan"), weight_decay=0.0)
    with pytest.raises(SfgError, match="prox_center"):
        be.train(P, xs, ys, prox_lam=0.1, **kw)
    with pytest.raises(SfgError, match="momentum_buf"):
        be.train(P, xs, ys, momentum=0.9, momentum_buf=torch.zeros(3, 3), **kw)
    with pytest.raises(SfgError, match="trainable_mask"):
        be.train(P, xs, ys, trainable_mask=torch.ones(3, dtype=torch.bool), **kw)
    with pytest.raises(SfgError, match="one x and one y"):
        be.evaluate(P, [xs[0, 0]], [ys[0, 0]])
    with pytest.raises(SfgError, match="evaluation labels lie in"):
        be.evaluate(P, [xs[0, 0], xs[1, 0]], [ys[0, 0], ys[1, 0] + 10])
    with pytest.raises(SfgError, match="example shape"):
        be.evaluate(P, [xs[0, 0, :, :5], xs[1, 0, :, :5]], [ys[0, 0], ys[1, 0]])
    with pytest.raises(SfgError, match="no evaluation examples"):
        be.evaluate(P, [xs[0, 0], xs[0, 0, :0]], [ys[0, 0], ys[0, 0, :0]])
    with pytest.raises(SfgError, match="did you mean 'vmap'"):
        make_backend("vmapp", model)
    with pytest.raises(SfgError, match="unknown parameter"):
        make_backend("loop:chunk=3", model)
    with pytest.raises(SfgError, match="workers"):
        make_backend("loop:workers=-1", model)
    with pytest.raises(SfgError, match="unknown device"):
        make_backend("loop", model, device="abacus")
    if not torch.cuda.is_available():
        with pytest.raises(SfgError, match="CUDA is not available"):
            make_backend("loop", model, device="cuda")


# ----------------------------------------------------------------------------------------------
# the written-out MLP backward pass of the batched backend


@pytest.mark.parametrize("hidden,classes", [("64-64", 10), ("", 10), ("32-16", 62), ("128", 3)])
@pytest.mark.parametrize("n,B", [(20, 32), (1, 1), (7, 5)])
def test_chain_grads_equal_autograd(hidden, classes, n, B):
    from sfg.sim.backends import chain_grads, is_linear_chain, plan_forward_batched

    model = make_model(f"mlp:hidden={hidden}", input_shape=(1, 8, 8), num_classes=classes)
    spec = ParamSpec.from_module(model)
    plan, _ = sequential_plan(model)
    assert is_linear_chain(plan)
    gen = torch.Generator().manual_seed(n * 100 + B)
    X = torch.randn(n, spec.D, generator=gen) * 0.3
    x = torch.randn(n, B, 1, 8, 8, generator=gen)
    y = torch.randint(0, classes, (n, B), generator=gen)
    leaves = {k: t.detach().requires_grad_() for k, t in spec.unflatten(X).items()}
    logits = plan_forward_batched(plan, leaves, x)
    loss = F.cross_entropy(logits.reshape(n * B, -1), y.reshape(-1), reduction="sum") / B
    want = dict(zip(spec.names, torch.autograd.grad(loss, [leaves[k] for k in spec.names]),
                    strict=True))
    got = chain_grads(plan, spec.unflatten(X), x, y)
    assert set(got) == set(spec.names)
    for k in spec.names:
        assert got[k].shape == want[k].shape
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6 * want[k].abs().max())
    # per client: a client's gradient is that of its own loss only
    one = chain_grads(plan, spec.unflatten(X[:1]), x[:1], y[:1])
    for k in spec.names:
        torch.testing.assert_close(one[k][0], got[k][0], rtol=1e-5, atol=1e-7)


def test_only_linear_chains_take_the_written_out_backward():
    from sfg.sim.backends import is_linear_chain

    mlp = make_model("mlp", input_shape=(64,), num_classes=10)
    cnn = make_model("small-cnn", input_shape=(1, 8, 8), num_classes=10)
    assert is_linear_chain(sequential_plan(mlp)[0])
    assert not is_linear_chain(sequential_plan(cnn)[0])
    assert not is_linear_chain(None) and not is_linear_chain([])


def test_worker_pool_is_reused_and_errors_reach_the_caller():
    from sfg.sim import backends as B

    seen = []

    def fn(slot, lo, hi):
        seen.append((slot, lo, hi))

    B._run_chunks(10, 2, fn)
    pool = B._POOL
    B._run_chunks(10, 2, fn)
    assert B._POOL is pool and sorted(seen) == [(0, 0, 5), (0, 0, 5), (1, 5, 10), (1, 5, 10)]

    def bad(slot, lo, hi):
        if slot == 1:
            raise ValueError("worker failed")

    with pytest.raises(ValueError, match="worker failed"):
        B._run_chunks(10, 2, bad)
    assert torch.get_num_threads() == 1  # restored (the module fixture set one thread)


@pytest.mark.parametrize("wd", [0.0, 5e-4, 0.1])
def test_fused_chain_step_equals_gradient_then_sgd_step(wd):
    from sfg.sim.backends import chain_grads, chain_sgd_step_, sgd_step_

    model = make_model("mlp", input_shape=(64,), num_classes=10)
    spec = ParamSpec.from_module(model)
    plan, _ = sequential_plan(model)
    gen = torch.Generator().manual_seed(3)
    n, B = 6, 16
    X = torch.randn(n, spec.D, generator=gen) * 0.2
    x = torch.randn(n, B, 64, generator=gen)
    y = torch.randint(0, 10, (n, B), generator=gen)
    ref = X.clone()
    grads = chain_grads(plan, spec.unflatten(ref), x, y)
    g = torch.cat([grads[k].reshape(n, -1) for k in spec.names], dim=1)
    sgd_step_(ref, g, lr=0.1, weight_decay=wd, momentum=0.0, buf=None, center=None,
              prox_lam=0.0, mask=None)
    w = {k: v.clone() for k, v in spec.unflatten(X).items()}
    chain_sgd_step_(plan, w, x, y, lr=0.1, weight_decay=wd)
    got = torch.cat([w[k].reshape(n, -1) for k in spec.names], dim=1)
    assert not torch.equal(got, X)
    torch.testing.assert_close(got - X, ref - X, rtol=1e-5, atol=1e-6 * (ref - X).abs().max())


@pytest.mark.crosspath
@pytest.mark.parametrize("backend", ["batched", "vmap", "loop"])
def test_the_numbers_do_not_depend_on_workers_or_threads_by_construction(backend):
    """Blocks of clients depend on N (and chunk) only and every kernel runs on one intra-op
    thread, so 1, 2 or 3 workers under 1 or 2 torch threads give the same bits — training and
    evaluation (accuracies read from logits computed on the same blocks)."""
    from sfg.sim.backends import AUTO_UNIT, _blocks

    n = 2 * AUTO_UNIT + 7
    assert len(_blocks(n, AUTO_UNIT)) == 3
    model, P, xs, ys = problem("mlp", n=n, K=2, B=8, seed=2)
    kw = dict(lr=0.05, weight_decay=5e-4, momentum=0.5)
    threads = torch.get_num_threads()
    outs, accs = [], []
    try:
        for workers, t in [(1, 1), (2, 2), (3, 1), (1, 2)]:
            torch.set_num_threads(t)
            be = make_backend(f"{backend}:workers={workers}", model)
            outs.append(be.train(P, xs, ys, momentum_buf=torch.zeros_like(P), **kw))
            accs.append(be.evaluate(outs[-1], list(xs[:, 0]), list(ys[:, 0])))
    finally:
        torch.set_num_threads(threads)
    for o, a in zip(outs[1:], accs[1:], strict=True):
        assert torch.equal(o, outs[0]) and torch.equal(a, accs[0])
