"""Models for local training (docs/concepts/training.md#the-training-protocol): MLP, small CNN, the paper CNN and ResNet-18-GN.

Every model is a plain ``nn.Module`` built by :func:`make_model` from a component string
(``"mlp:hidden=64-64"``, ``"resnet18-gn:backbone=ckpt.pt"``). Each carries

* ``head_names: tuple[str, ...]`` -- the parameters of its last linear layer (the *head*; a
  personal-head backbone never averages them, a pretrained backbone re-initialises them);
* ``model_name``, ``input_shape`` (``(C, H, W)`` or flat) and ``num_classes``.

No model has buffers (no BatchNorm running statistics), so the whole state of a model is its
flat parameter vector (:mod:`sfg.sim.params`).

Sizes:

====================================  ==========  ==========================================
model, input, classes                 parameters  notes
====================================  ==========  ==========================================
``mlp``, 64 (8×8 digits), 10               8,970  default ``hidden=64-64``: 64→64→64→10
``mlp:hidden=128``, 64, 10                 9,610  64→128→10
``small-cnn``, 1×8×8, 10                   6,090  conv3×3(16)·pool·conv3×3(32)·pool·linear
``small-cnn``, 1×28×28, 62               102,078  FEMNIST
``cnn``, 3×32×32, 10                     878,538  the paper CNN (exact)
``cnn``, 1×28×28, 62                     608,702  FEMNIST
``resnet18-gn``, 3×32×32, 10          11,173,962  CIFAR stem; ≈ 11.2 M
====================================  ==========  ==========================================
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sfg.errors import SfgError, check
from sfg.util.components import Component, Registry, parse_component

MODELS = Registry("model")


# ----------------------------------------------------------------------------------------------
# helpers


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


def _parse_sizes(value: Any, what: str) -> tuple[int, ...]:
    """``128`` / ``"64-64"`` / ``"64x64"`` / ``(64, 64)`` / ``""`` -> tuple of positive ints."""
    if value is None or value == "" or value == 0:
        return ()
    if isinstance(value, bool):
        raise SfgError(f"{what} must be layer sizes like 128 or '64-64', got {value!r}")
    if isinstance(value, int):
        items: Sequence[Any] = [value]
    elif isinstance(value, str):
        items = [s for s in value.replace("x", "-").replace(",", "-").split("-") if s.strip()]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise SfgError(f"{what} must be layer sizes like 128 or '64-64', got {value!r}")
    out = []
    for item in items:
        try:
            size = int(item)
        except (TypeError, ValueError):
            raise SfgError(
                f"{what} must be layer sizes like 128 or '64-64', got {value!r}") from None
        check(size > 0, f"{what} sizes must be positive, got {value!r}")
        out.append(size)
    return tuple(out)


def _input_shape(shape: Any, *, image: bool, name: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise SfgError(
            f"model {name!r}: input_shape must be a tuple of ints, got {shape!r}") from None
    check(len(dims) > 0 and all(d > 0 for d in dims),
          f"model {name!r}: input_shape must be positive sizes, got {shape!r}")
    if image:
        check(len(dims) == 3,
              f"model {name!r} needs image input_shape (C, H, W), got {dims}; use 'mlp' for flat "
              "features")
    return dims


def _tag(model: nn.Module, *, name: str, input_shape: tuple[int, ...], num_classes: int,
         head_names: tuple[str, ...]) -> nn.Module:
    model.model_name = name
    model.input_shape = tuple(input_shape)
    model.num_classes = int(num_classes)
    model.head_names = tuple(head_names)
    names = {n for n, _ in model.named_parameters()}
    missing = [h for h in head_names if h not in names]
    if missing:  # a bug in this module, not bad input
        raise RuntimeError(f"head parameters {missing} not in model {name}")
    return model


# ----------------------------------------------------------------------------------------------
# MLP


def mlp(*, input_shape: Sequence[int], num_classes: int, hidden: Any = "64-64") -> nn.Module:
    """Fully connected ReLU network: flatten → [linear → ReLU]* → linear head.

    The default reproduces the 8,970-parameter digits MLP behind the backend measurements in
    ARCHITECTURE.md: one hidden layer of h units has 75h + 10 parameters on 64 inputs and 10
    classes (no integer h gives 8,970), two layers of 64 give it exactly.

    ``hidden="64-64"`` (the default) on 8×8 digits gives 64→64→64→10 = 8,970 parameters
    (64·64+64 + 64·64+64 + 64·10+10); ``hidden=128`` gives 9,610; ``hidden=""`` is a linear
    (softmax-regression) model. Layer names: ``fc1``, ``fc2``, ..., ``head``.
    """
    dims = _input_shape(input_shape, image=False, name="mlp")
    sizes = _parse_sizes(hidden, "mlp hidden")
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    width = math.prod(dims)
    for i, size in enumerate(sizes, 1):
        layers[f"fc{i}"] = nn.Linear(width, size)
        layers[f"relu{i}"] = nn.ReLU()
        width = size
    layers["head"] = nn.Linear(width, num_classes)
    return _tag(nn.Sequential(layers), name="mlp", input_shape=dims, num_classes=num_classes,
                head_names=("head.weight", "head.bias"))


# ----------------------------------------------------------------------------------------------
# CNNs


def small_cnn(*, input_shape: Sequence[int], num_classes: int, channels: Any = "16-32",
              hidden: int = 0) -> nn.Module:
    """A CNN for small images (8×8 digits, 28×28 FEMNIST): per entry of ``channels`` a
    3×3 convolution (padding 1) → ReLU → 2×2 max-pool; then flatten → [linear(hidden) → ReLU]
    → linear head. On 1×8×8 with 10 classes: 6,090 parameters; on 1×28×28 with 62 classes:
    102,078. Layer names: ``conv1``, ``conv2``, ..., [``fc1``], ``head``.
    """
    dims = _input_shape(input_shape, image=True, name="small-cnn")
    chans = _parse_sizes(channels, "small-cnn channels")
    check(len(chans) >= 1, "small-cnn needs at least one conv layer, e.g. channels=16-32")
    check(isinstance(hidden, int) and hidden >= 0,
          f"small-cnn hidden must be a non-negative int, got {hidden!r}")
    c, h, w = dims
    check(min(h, w) >= 2 ** len(chans),
          f"small-cnn with {len(chans)} pooling stages needs inputs of at least "
          f"{2 ** len(chans)}×{2 ** len(chans)}, got {h}×{w}; use fewer channels entries")
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i, out in enumerate(chans, 1):
        layers[f"conv{i}"] = nn.Conv2d(c, out, 3, padding=1)
        layers[f"relu{i}"] = nn.ReLU()
        layers[f"pool{i}"] = nn.MaxPool2d(2)
        c, h, w = out, h // 2, w // 2
    layers["flatten"] = nn.Flatten()
    width = c * h * w
    if hidden:
        layers["fc1"] = nn.Linear(width, hidden)
        layers["relu_fc1"] = nn.ReLU()
        width = hidden
    layers["head"] = nn.Linear(width, num_classes)
    return _tag(nn.Sequential(layers), name="small-cnn", input_shape=dims,
                num_classes=num_classes, head_names=("head.weight", "head.bias"))


def paper_cnn(*, input_shape: Sequence[int], num_classes: int, hidden: int = 512) -> nn.Module:
    """The paper CNN (docs/concepts/training.md#the-training-protocol): conv5×5(C→32) → ReLU → maxpool2 → conv5×5(32→64) → ReLU →
    maxpool2 → flatten → linear(512) → ReLU → linear head; no padding.

    On 3×32×32 with 10 classes: 2,432 + 51,264 + 819,712 + 5,130 = 878,538 parameters.
    Layer names: ``conv1``, ``conv2``, ``fc1``, ``head``.
    """
    dims = _input_shape(input_shape, image=True, name="cnn")
    check(isinstance(hidden, int) and hidden > 0,
          f"cnn hidden must be a positive int, got {hidden!r}")
    c, h, w = dims
    side = min(h, w)
    check(((side - 4) // 2 - 4) // 2 >= 1,
          f"model 'cnn' needs images of at least 16×16 (two unpadded 5×5 convs and pools), got "
          f"{h}×{w}; use 'small-cnn' for small inputs")
    h2, w2 = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    layers = OrderedDict(
        conv1=nn.Conv2d(c, 32, 5), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(32, 64, 5), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(),
        fc1=nn.Linear(64 * h2 * w2, hidden), relu3=nn.ReLU(),
        head=nn.Linear(hidden, num_classes),
    )
    return _tag(nn.Sequential(layers), name="cnn", input_shape=dims, num_classes=num_classes,
                head_names=("head.weight", "head.bias"))


# ----------------------------------------------------------------------------------------------
# ResNet-18 with GroupNorm


class BasicBlock(nn.Module):
    """ResNet basic block (two 3×3 convs) with GroupNorm; names follow torchvision."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.GroupNorm(groups, cout)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(groups, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18GN(nn.Module):
    """ResNet-18 with GroupNorm instead of BatchNorm (no running statistics).

    Parameter names follow torchvision's ``resnet18`` (``conv1``, ``bn1``, ``layer1.0.conv1``,
    ..., ``fc``) so that its checkpoints' convolution and affine weights load by name.
    """

    def __init__(self, in_channels: int, num_classes: int, *, stem: str, norm_groups: int,
                 width: int = 64):
        super().__init__()
        if stem == "cifar":  # 3×3 conv, stride 1, no max-pool: keeps 32×32 resolution
            self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:  # ImageNet stem: 7×7 conv stride 2, 3×3 max-pool stride 2
            self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.bn1 = nn.GroupNorm(norm_groups, width)
        self.relu = nn.ReLU()
        chans = [width, 2 * width, 4 * width, 8 * width]
        cin = width
        for i, cout in enumerate(chans, 1):
            stride = 1 if i == 1 else 2
            layer = nn.Sequential(BasicBlock(cin, cout, stride, norm_groups),
                                  BasicBlock(cout, cout, 1, norm_groups))
            self.add_module(f"layer{i}", layer)
            cin = cout
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18_gn(*, input_shape: Sequence[int], num_classes: int, stem: str = "auto",
                norm_groups: int = 2, width: int = 64) -> nn.Module:
    """ResNet-18 with GroupNorm(``norm_groups``=2) (docs/concepts/training.md#the-training-protocol), written without torchvision.

    ``stem="cifar"`` (3×3 conv, stride 1, no max-pool) suits 32×32 inputs; ``"imagenet"`` is the
    original 7×7/stride-2 conv plus max-pool; ``"auto"`` picks ``cifar`` for inputs up to 64×64.
    On 3×32×32 with 10 classes (cifar stem): 11,173,962 parameters (≈ 11.2 M).
    """
    dims = _input_shape(input_shape, image=True, name="resnet18-gn")
    check(stem in ("auto", "cifar", "imagenet"),
          f"resnet18-gn stem must be 'auto', 'cifar' or 'imagenet', got {stem!r}")
    check(isinstance(norm_groups, int) and norm_groups >= 1,
          f"resnet18-gn norm_groups must be a positive int, got {norm_groups!r}")
    check(isinstance(width, int) and width >= 1 and width % norm_groups == 0,
          f"resnet18-gn width must be a positive multiple of norm_groups={norm_groups}, "
          f"got {width!r}")
    if stem == "auto":
        stem = "cifar" if max(dims[1:]) <= 64 else "imagenet"
    model = ResNet18GN(dims[0], num_classes, stem=stem, norm_groups=norm_groups, width=width)
    model.stem = stem
    return _tag(model, name="resnet18-gn", input_shape=dims, num_classes=num_classes,
                head_names=("fc.weight", "fc.bias"))


# ----------------------------------------------------------------------------------------------
# backbones


_IGNORED_KEYS = ("running_mean", "running_var", "num_batches_tracked")


def load_backbone(model: nn.Module, path: str | Path) -> nn.Module:
    """Copy every non-head parameter of ``model`` from the ``state_dict`` saved at ``path``.

    ``path``: a ``.safetensors`` file (as ``sfg pretrain`` writes) or a torch ``state_dict``.
    The head (``model.head_names``) keeps its fresh initialisation. A checkpoint dict holding
    ``"state_dict"`` or ``"model"`` is unwrapped; a ``module.`` prefix (DataParallel) is
    stripped; BatchNorm running statistics are ignored (GroupNorm has none). Missing or
    mis-shaped body parameters raise :class:`SfgError`.
    """
    file = Path(path)
    check(file.is_file(),
          f"backbone file {str(file)!r} does not exist; pass a saved state_dict path")
    try:
        if file.suffix == ".safetensors":  # `sfg pretrain` writes these (no pickle)
            from safetensors.torch import load_file

            state = load_file(str(file))
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is bad input
        raise SfgError(f"cannot read backbone {str(file)!r} as a torch state_dict: {exc}") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    check(isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values()),
          f"backbone {str(file)!r} is not a state_dict (a dict of name -> tensor)")
    state = {k.removeprefix("module."): v for k, v in state.items()
             if not k.endswith(_IGNORED_KEYS)}
    heads = set(getattr(model, "head_names", ()))
    body = {n: p for n, p in model.named_parameters() if n not in heads}
    missing = [n for n in body if n not in state]
    check(not missing,
          f"backbone {str(file)!r} lacks {len(missing)} parameters of model "
          f"{getattr(model, 'model_name', '?')!r} (first: {missing[:3]}); save it from the same "
          "architecture")
    for n, p in body.items():
        src = state[n]
        check(tuple(src.shape) == tuple(p.shape),
              f"backbone {str(file)!r}: parameter {n!r} has shape {tuple(src.shape)}, model "
              f"expects {tuple(p.shape)}; check input_shape/stem/width")
        with torch.no_grad():
            p.copy_(src.to(p.dtype))
    return model


# ----------------------------------------------------------------------------------------------
# registry


MODELS.register("mlp", mlp, params={"hidden": "64-64", "backbone": ""},
                doc="MLP; default 64-64 hidden (8,970 params on 8×8 digits)", tags=("flat",))
MODELS.register("small-cnn", small_cnn, params={"channels": "16-32", "hidden": 0, "backbone": ""},
                doc="small CNN for 8×8 / 28×28 images", tags=("image",))
MODELS.register("cnn", paper_cnn, params={"hidden": 512, "backbone": ""},
                doc="paper CNN (878,538 params on CIFAR-10)", tags=("image",))
MODELS.register("resnet18-gn", resnet18_gn,
                params={"stem": "auto", "norm_groups": 2, "width": 64, "backbone": ""},
                doc="ResNet-18 with GroupNorm(2), ≈ 11.2 M params", tags=("image",))


def make_model(name: str | Component, *, input_shape: Sequence[int], num_classes: int,
               **kwargs: Any) -> nn.Module:
    """Build a model: ``make_model("cnn", input_shape=(3, 32, 32), num_classes=10)``.

    ``name`` may carry parameters (``"mlp:hidden=128"``); ``kwargs`` override them.
    ``backbone=PATH`` loads a saved body with a freshly initialised head
    (:func:`load_backbone`). Initialisation draws from torch's default generator; use
    :func:`sfg.sim.params.init_params` for seeded, reproducible models.
    """
    comp = name if isinstance(name, Component) else parse_component(name, kind="model")
    check(not comp.modifiers, f"model {comp.text!r} takes no '+' modifiers")
    check(isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 2,
          f"num_classes must be an int >= 2, got {num_classes!r}")
    params = MODELS.check_params(comp.name, {**comp.params, **kwargs})
    backbone = params.pop("backbone")
    model = MODELS.entry(comp.name).factory(input_shape=input_shape, num_classes=num_classes,
                                            **params)
    if backbone:
        load_backbone(model, backbone)
    return model
