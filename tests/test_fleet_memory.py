"""Memory proportional to the data once plus N models: every client's examples are rows of one
shared pool (as stored), made into normalised float examples per minibatch and per evaluation
batch; and the sizes of every client's data as dataset parameters (``min_train``,
``test_per_client``) that leave the run id alone at their defaults."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from test_data_cifar import write_cifar10

from sfg.errors import SfgError
from sfg.world.data import load_federated
from sfg.world.data.base import ClientImages, PoolBatch, hflip, normalised_tensor

MB = 1 << 20


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory):
    # 2,000 training and 600 test images of CIFAR's shape (the format of the real archive)
    return write_cifar10(tmp_path_factory.mktemp("cifar"), per_batch=400, n_test=600).parent


# ------------------------------------------------------------------ the slope of peak memory
# A child process: a one-round CIFAR-shaped small-cnn run of N clients with 100 test images
# each (one worker thread, so the peak does not depend on two threads' timing), then its peak
# resident set. Holding every client's test images as floats (as before) costs 1.2 MB a client
# here; rows of the shared pool cost 8 bytes an example.
# A warm-up run of 8 clients first (imports, compiled kernels, the allocator's pools), then the
# peak is reset (/proc/self/clear_refs) and the measured run's own peak read.
CHILD = textwrap.dedent("""
    import json, sys
    import torch
    torch.set_num_threads(1)
    import sfg
    import sfg.util.alloc
    sfg.util.alloc._ALLOCATOR_TUNED = True  # freed buffers go back (MALLOC_MMAP_THRESHOLD_)
    root, n = sys.argv[1], int(sys.argv[2])
    def run(n):
        return sfg.run(dataset="cifar10:min_train=4,test_per_client=100", data_root=root,
                       model="small-cnn", n_clients=n, rounds=1, local_steps=2,
                       batch_size=16, alpha=1000.0, eval_every=1,
                       backend="batched:workers=1", seed=1)
    run(8)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set starts again from the current one
    res = run(n)
    peak = [int(line.split()[1]) * 1024 for line in open("/proc/self/status")
            if line.startswith("VmHWM:")][0]
    print(json.dumps({"peak": peak, "acc": float(res.metrics["acc_mean"])}))
""")


def _peak(root, n: int) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(n)], capture_output=True,
                         text=True, timeout=600, env={**_env(), **MALLOC})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak"])


# glibc's allocator with a fixed mmap threshold: every large buffer is mapped and unmapped,
# so the resident set follows the live memory instead of the heap's free lists and their
# fragmentation (sfg.util.alloc keeps them; it is turned off in the child)
MALLOC = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072",
          "MALLOC_TRIM_THRESHOLD_": "131072"}


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k not in MALLOC}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_grows_by_at_most_0_3_mb_a_client_for_small_cnn(cifar_root):
    small, large = _peak(cifar_root, 200), _peak(cifar_root, 400)
    slope = (large - small) / 200 / MB
    assert slope <= 0.3, f"peak memory grows by {slope:.2f} MB a client (200 -> 400 clients)"


def test_the_data_held_per_client_is_rows_and_labels_not_images(cifar_root):
    held = {}
    for n in (200, 400):
        d = load_federated("cifar10:min_train=4,test_per_client=100", n_clients=n, seed=1,
                           data_root=cifar_root, alpha=1000.0)
        assert d.train_x.images is d.val_x.images  # one pool for training and validation
        assert d.train_x.images.dtype == np.uint8 and d.test_x.images.dtype == np.uint8
        held[n] = d.held_bytes()
    # 100 test rows and labels (16 bytes an example) a client, plus its share of the 2,000
    # training examples: far below one 32x32x3 float image (12 kB) a client
    assert (held[400] - held[200]) / 200 < 2_000


# ------------------------------------------------------------------ the same floats
def test_a_client_reads_the_floats_of_normalising_every_image_first(cifar_root):
    d = load_federated("cifar10:test_per_client=30", n_clients=5, seed=2, data_root=cifar_root)
    norm = d.meta["normalisation"]
    for split in ("train", "val", "test"):
        xs: ClientImages = getattr(d, f"{split}_x")
        for i in range(len(xs)):
            rows = xs.client_rows(i)
            want = normalised_tensor(xs.images, rows, scale=norm["scale"],
                                     mean=np.array(norm["mean"]), std=np.array(norm["std"]))
            assert torch.equal(xs[i], want)
    # a minibatch made block by block equals the whole gathered at once, flipped the same
    images = d.train_x
    rng = np.random.default_rng(0)
    rows = rng.choice(images.rows, size=(5, 2, 4))
    flips = rng.random((5, 2, 4)) < 0.5
    whole = hflip(images.take(rows), flips)
    lazy = PoolBatch(images, rows, flips)
    assert torch.equal(lazy[:], whole) and torch.equal(lazy[1:3], whole[1:3])
    assert torch.equal(lazy[2, 1], whole[2, 1]) and tuple(lazy.shape) == tuple(whole.shape)
    assert torch.equal(whole[flips][..., 0], images.take(rows[flips])[..., -1])  # mirrored


def test_per_client_tensors_are_taken_as_they_are():
    xs = [torch.randn(3, 1, 4, 4), torch.randn(2, 1, 4, 4)]
    images = ClientImages.of(xs)
    assert len(images) == 2 and all(torch.equal(a, b) for a, b in zip(images, xs, strict=True))
    assert torch.equal(images.subset([1])[0], xs[1])


# ------------------------------------------------------------------ the size parameters
def test_sizes_are_dataset_parameters(cifar_root):
    d = load_federated("cifar10:min_train=4,test_per_client=7", n_clients=400, seed=1,
                       data_root=cifar_root, alpha=1000.0)
    own = d.sizes("train") + d.sizes("val")
    assert own.min() >= 4 and set(d.sizes("test").tolist()) == {7}
    assert d.meta["min_train"] == 4 and d.meta["test_per_client"] == 7
    # the defaults are the paper's: the same data as not naming them
    a = load_federated("cifar10", n_clients=5, seed=1, data_root=cifar_root)
    b = load_federated("cifar10:min_train=20,test_per_client=300", n_clients=5, seed=1,
                       data_root=cifar_root)
    assert a.meta["min_train"] == 20 and a.meta["test_per_client"] == 300
    for split in ("train", "val", "test"):
        assert np.array_equal(getattr(a, f"{split}_x").rows, getattr(b, f"{split}_x").rows)
    with pytest.raises(SfgError, match="disagree"):
        load_federated("cifar10:min_train=4", n_clients=5, seed=1, data_root=cifar_root,
                       min_train=5)


@pytest.mark.parametrize("text,needle", [
    ("cifar10:min_train=0", "min_train (training examples every client holds at least"),
    ("cifar10:min_train=-3", "got -3; write e.g. cifar10:min_train=4"),
    ("imagefolder:min_train=2.5", "got 2.5; write e.g. imagefolder:min_train=4"),
    ("femnist:test_per_client=abc", "test_per_client (test examples of every client) must be"),
    ("digits:test_per_client=0", "write e.g. digits:test_per_client=50"),
])
def test_a_bad_size_is_one_line_naming_the_parameter(text, needle):
    from sfg.experiments.config import RunConfig, validate_names

    with pytest.raises(SfgError) as info:
        validate_names(RunConfig(dataset=text))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_too_large_a_minimum_names_the_parameter_to_lower(cifar_root):
    with pytest.raises(SfgError) as info:
        load_federated("cifar10:min_train=6", n_clients=400, seed=0, data_root=cifar_root)
    assert ("cannot give each of 400 clients at least 6 of 2000 examples; lower the minimum "
            "(the dataset parameter min_train, e.g. cifar10:min_train=2)") in str(info.value)


def test_run_ids_stay_at_the_default_sizes():
    from sfg.experiments.config import RunConfig, run_id

    plain = RunConfig(dataset="cifar10")
    for spelled in ("cifar10:min_train=20", "cifar10:test_per_client=300,min_train=20",
                    "CIFAR10:test_per_client=300"):
        cfg = RunConfig(dataset=spelled)
        assert cfg.dataset == "cifar10" and run_id(cfg) == run_id(plain)
    other = RunConfig(dataset="cifar10:min_train=4,test_per_client=50")
    assert other.dataset == "cifar10:min_train=4,test_per_client=50"
    assert run_id(other) != run_id(plain)
    # digits' minimum is automatic (5, lowered for many clients): naming one is another run
    assert RunConfig(dataset="digits:min_train=5").dataset == "digits:min_train=5"
    assert run_id(RunConfig(dataset="digits:test_per_client=50")) == run_id(RunConfig())


def test_the_cli_refuses_a_bad_size_in_one_line():
    out = subprocess.run([sys.executable, "-m", "sfg", "run", "--dataset",
                          "cifar10:min_train=0", "-T", "1"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dataset parameter min_train")


@pytest.mark.parametrize("backend", ["loop", "batched", "vmap"])
def test_training_from_the_pool_block_by_block_equals_one_float_tensor(cifar_root, backend):
    """A backend reading its blocks of a PoolBatch trains exactly as on the whole minibatch
    tensor gathered and flipped at once (CIFAR flips on)."""
    from sfg.sim.context import build_run
    from sfg.sim.run import resolve_config

    c = resolve_config(dict(dataset="cifar10:min_train=4,test_per_client=10",
                            data_root=str(cifar_root), model="small-cnn", n_clients=60,
                            rounds=1, local_steps=2, batch_size=4, backend=backend, seed=3))
    run = build_run(c, engine="rounds")
    assert run.data.augment_hflip
    clients = np.arange(run.n)
    idx, flips = run.minibatches().round(0)
    xs, ys = run.clients.gather(clients, idx, flips)
    assert isinstance(xs, PoolBatch) and flips is not None and flips.any()
    start = run.initial()
    lazy = run.train(run.backend, start, xs, ys)
    # every client's images normalised first, then indexed and flipped (the former way)
    every = [run.data.train_x[i] for i in clients]
    floats_x = torch.stack([every[i][torch.from_numpy(idx[i])] for i in clients])
    floats_x = torch.where(torch.from_numpy(flips)[..., None, None, None], floats_x.flip(-1),
                           floats_x)
    assert torch.equal(xs[:], floats_x)
    whole = run.train(run.backend, start, floats_x, ys)
    assert torch.equal(lazy, whole)
    acc = run.evaluate(lazy)
    floats = run.backend.evaluate(lazy, list(run.data.test_x), list(run.data.test_y))
    assert np.array_equal(acc, floats.numpy().astype(np.float64))
