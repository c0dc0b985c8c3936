"""Models (docs/concepts/training.md#the-training-protocol): sizes, heads, forward shapes, backbones, registry errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sfg.errors import SfgError
from sfg.sim.params import init_params
from sfg.world.models import MODELS, count_parameters, load_backbone, make_model


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    """Single-threaded kernels: on a shared machine a two-thread kernel stalls whenever
    another process holds a core. Worker-thread variants (``workers=2``) still run threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_paper_cnn_has_exactly_878538_parameters():
    model = make_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    # conv5x5(3->32), conv5x5(32->64), fc(64*5*5 -> 512), head(512 -> 10), all with biases
    by_hand = (3 * 25 * 32 + 32) + (32 * 25 * 64 + 64) + (1600 * 512 + 512) + (512 * 10 + 10)
    assert by_hand == 878_538
    assert count_parameters(model) == 878_538
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_paper_cnn_layout_is_two_unpadded_convs_with_pooling():
    model = make_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (3, 32, (5, 5), (0, 0)), (32, 64, (5, 5), (0, 0))]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 2
    assert model.fc1.in_features == 64 * 5 * 5 and model.fc1.out_features == 512


def test_resnet18_gn_size_norms_and_no_buffers():
    model = make_model("resnet18-gn", input_shape=(3, 32, 32), num_classes=10)
    assert count_parameters(model) == 11_173_962  # ≈ 11.2 M
    assert 11.1e6 < count_parameters(model) < 11.3e6
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 20 and all(m.num_groups == 2 for m in norms)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert list(model.buffers()) == []  # no running statistics
    # CIFAR stem: 3x3 stride-1 conv, no max-pool, keeps 32x32 into layer1
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_resnet_stem_auto_and_imagenet():
    big = make_model("resnet18-gn", input_shape=(3, 96, 96), num_classes=5)
    assert big.stem == "imagenet" and big.conv1.kernel_size == (7, 7)
    assert isinstance(big.maxpool, nn.MaxPool2d)
    forced = make_model("resnet18-gn:stem=imagenet", input_shape=(3, 32, 32), num_classes=10)
    assert count_parameters(forced) == 11_173_962 - 3 * 64 * 9 + 3 * 64 * 49
    assert forced(torch.zeros(1, 3, 32, 32)).shape == (1, 10)


@pytest.mark.parametrize("name,shape,classes,expected", [
    ("mlp", (64,), 10, 8_970),                   # 64->64->64->10
    ("mlp", (1, 8, 8), 10, 8_970),               # image input is flattened
    ("mlp:hidden=128", (64,), 10, 9_610),        # 64->128->10
    ("mlp:hidden=", (64,), 10, 650),             # softmax regression
    ("small-cnn", (1, 8, 8), 10, 6_090),
    ("small-cnn", (1, 28, 28), 62, 102_078),
    ("cnn", (1, 28, 28), 62, 608_702),
])
def test_parameter_counts(name, shape, classes, expected):
    model = make_model(name, input_shape=shape, num_classes=classes)
    assert count_parameters(model) == expected
    assert model(torch.zeros(3, *shape)).shape == (3, classes)


@pytest.mark.parametrize("name,shape", [
    ("mlp", (64,)), ("small-cnn", (1, 8, 8)), ("cnn", (3, 32, 32)),
    ("resnet18-gn", (3, 32, 32)),
])
def test_head_names_are_the_last_linear_layer(name, shape):
    model = make_model(name, input_shape=shape, num_classes=7)
    params = dict(model.named_parameters())
    assert len(model.head_names) == 2
    weight, bias = (params[n] for n in model.head_names)
    assert weight.shape[0] == 7 and bias.shape == (7,)
    last_linear = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    assert weight is last_linear.weight and bias is last_linear.bias
    assert model.model_name == name and model.num_classes == 7
    assert tuple(model.input_shape) == shape


def test_backbone_keeps_body_and_gives_a_fresh_head(tmp_path):
    shape = (3, 16, 16)
    trained = make_model("resnet18-gn", input_shape=shape, num_classes=100)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.5)  # distinguishable from any fresh initialisation
    path = tmp_path / "backbone.pt"
    torch.save(trained.state_dict(), path)

    model = make_model("resnet18-gn", input_shape=shape, num_classes=10, backbone=str(path))
    src = dict(trained.named_parameters())
    for name, p in model.named_parameters():
        if name in model.head_names:
            assert p.shape[0] == 10  # new number of classes
            assert not torch.equal(p, src[name][:10] if p.dim() == 1 else src[name][:10, :])
        else:
            assert torch.equal(p, src[name]), name
    # the head keeps its seeded fresh initialisation: same seed, same head, with or without
    fresh = init_params(lambda: make_model("resnet18-gn", input_shape=shape, num_classes=10), 1,
                        seed=3)
    loaded = init_params(lambda: make_model("resnet18-gn", input_shape=shape, num_classes=10,
                                            backbone=str(path)), 1, seed=3)
    assert torch.equal(fresh[0, -(512 * 10 + 10):], loaded[0, -(512 * 10 + 10):])
    assert not torch.equal(fresh[0, :1000], loaded[0, :1000])


def test_backbone_accepts_wrapped_checkpoints_and_ignores_batchnorm_stats(tmp_path):
    src = make_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    state = {f"module.{k}": v + 1 for k, v in src.state_dict().items()}
    state["module.bn.running_mean"] = torch.zeros(3)
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": state}, path)
    model = load_backbone(make_model("cnn", input_shape=(3, 32, 32), num_classes=10), path)
    assert torch.equal(model.conv2.weight, src.conv2.weight + 1)
    assert not torch.equal(model.head.weight, src.head.weight + 1)


def test_backbone_errors(tmp_path):
    kw = dict(input_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(SfgError, match="does not exist"):
        make_model("cnn", backbone=str(tmp_path / "missing.pt"), **kw)
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(SfgError, match="cannot read backbone"):
        make_model("cnn", backbone=str(junk), **kw)
    other = tmp_path / "mlp.pt"
    torch.save(make_model("mlp", **kw).state_dict(), other)
    with pytest.raises(SfgError, match="lacks"):
        make_model("cnn", backbone=str(other), **kw)
    wrong = tmp_path / "wide.pt"
    torch.save(make_model("cnn:hidden=256", **kw).state_dict(), wrong)
    with pytest.raises(SfgError, match="shape"):
        make_model("cnn", backbone=str(wrong), **kw)


def test_make_model_errors():
    kw = dict(input_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(SfgError, match="did you mean 'cnn'"):
        make_model("cnnn", **kw)
    with pytest.raises(SfgError, match="unknown parameter 'hiden'"):
        make_model("mlp:hiden=3", **kw)
    with pytest.raises(SfgError, match="small-cnn"):
        make_model("cnn", input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(SfgError, match="num_classes"):
        make_model("cnn", input_shape=(3, 32, 32), num_classes=1)
    with pytest.raises(SfgError, match="hidden"):
        make_model("mlp:hidden=ten", **kw)
    with pytest.raises(SfgError, match=r"\(C, H, W\)"):
        make_model("small-cnn", input_shape=(64,), num_classes=10)
    with pytest.raises(SfgError, match="stem"):
        make_model("resnet18-gn:stem=tiny", **kw)
    with pytest.raises(SfgError, match="modifiers"):
        make_model("cnn+ipw", **kw)


def test_registry_lists_every_model():
    assert MODELS.names() == ["cnn", "mlp", "resnet18-gn", "small-cnn"]


def test_no_model_has_buffers():
    for name, shape in [("mlp", (64,)), ("small-cnn", (1, 8, 8)), ("cnn", (3, 32, 32))]:
        assert list(make_model(name, input_shape=shape, num_classes=10).buffers()) == []
