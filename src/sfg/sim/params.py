"""All N client models as one flat ``[N, D]`` float32 tensor (docs/concepts/round.md#one-round, docs/concepts/training.md#the-training-protocol).

Gossip is then one row-stochastic ``[N, N] @ [N, D]`` product, and a backend trains rows.
:class:`ParamSpec` records where each named parameter of a model lives inside a row::

    spec = ParamSpec.from_module(model)           # names, shapes, offsets, D, head_mask
    X = init_params(lambda: make_model(...), 100, seed=1)     # [100, D], identical rows
    views = spec.unflatten(X)                     # {name: [100, *shape] views into X}
    logits = functional_forward(model, spec, X[3], x)          # client 3's model on x

The row layout is the order of ``model.named_parameters()``; every parameter is
stored contiguously in row-major order, so ``spec.unflatten(flat)[name]`` is a view.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call

from sfg.errors import SfgError, check
from sfg.util.rng import torch_seed


@dataclass(frozen=True)
class ParamSpec:
    """Where each parameter of a model lives in a flat vector of length ``D``.

    names: parameter names in ``named_parameters()`` order; shapes: their shapes;
    offsets: start index of each inside the flat vector; D: total length;
    head_mask: ``bool[D]``, True on the coordinates of ``model.head_names``.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    D: int
    head_names: tuple[str, ...] = ()
    head_mask: torch.Tensor = field(  # type: ignore[assignment]
        default=None, compare=False, repr=False)

    @classmethod
    def from_module(cls, model: nn.Module) -> ParamSpec:
        """The layout of ``model``'s parameters (its ``head_names`` attribute marks the head)."""
        names, shapes, offsets = [], [], []
        offset = 0
        for name, p in model.named_parameters():
            names.append(name)
            shapes.append(tuple(p.shape))
            offsets.append(offset)
            offset += p.numel()
        check(offset > 0, "model has no parameters; nothing to train")
        head_names = tuple(getattr(model, "head_names", ()))
        spec = cls(tuple(names), tuple(shapes), tuple(offsets), offset, head_names)
        object.__setattr__(spec, "head_mask", spec.mask(head_names))
        return spec

    @property
    def sizes(self) -> tuple[int, ...]:
        """Number of scalars of each parameter."""
        return tuple(math.prod(s) for s in self.shapes)

    def slice(self, name: str) -> slice:
        """Coordinates of parameter ``name`` inside a row."""
        try:
            i = self.names.index(name)
        except ValueError:
            raise SfgError(f"model has no parameter {name!r}; it has {list(self.names)}") from None
        return slice(self.offsets[i], self.offsets[i] + self.sizes[i])

    def mask(self, names: Iterable[str]) -> torch.Tensor:
        """``bool[D]``, True on the coordinates of the given parameters."""
        out = torch.zeros(self.D, dtype=torch.bool)
        for name in names:
            out[self.slice(name)] = True
        return out

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``flat: [..., D]`` -> ``{name: [..., *shape]}``; views into ``flat`` (no copy) whenever
        its last dimension is contiguous, e.g. for an ``[N, D]`` store or one row of it."""
        check(flat.shape[-1] == self.D,
              f"flat parameters have last dimension {flat.shape[-1]}, model needs D={self.D}")
        lead = tuple(flat.shape[:-1])
        return {name: flat[..., off:off + size].reshape(*lead, *shape)
                for name, shape, off, size in zip(self.names, self.shapes, self.offsets,
                                                  self.sizes, strict=True)}

    def flatten_tensors(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """Inverse of :meth:`unflatten`: ``{name: [..., *shape]}`` -> ``[..., D]`` (a copy)."""
        first = tensors[self.names[0]]
        lead = first.shape[:first.dim() - len(self.shapes[0])]
        return torch.cat([tensors[n].reshape(*lead, -1) for n in self.names], dim=-1)


def flatten(module: nn.Module) -> torch.Tensor:
    """The parameters of ``module`` as one ``[D]`` float32 vector (a detached copy)."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).to(torch.float32)


def unflatten(spec: ParamSpec, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """``flat: [..., D]`` -> ``{name: [..., *shape]}`` views; see :meth:`ParamSpec.unflatten`."""
    return spec.unflatten(flat)


def load_flat(module: nn.Module, flat: torch.Tensor) -> nn.Module:
    """Copy ``flat: [D]`` into ``module``'s parameters in place."""
    spec = ParamSpec.from_module(module)
    check(tuple(flat.shape) == (spec.D,),
          f"flat parameters must be [{spec.D}], got {tuple(flat.shape)}")
    views = spec.unflatten(flat)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(views[name])  # a copy: the module never aliases the store
    return module


def init_params(model_factory: Callable[[], nn.Module], n: int, *, seed: int) -> torch.Tensor:
    """``[n, D]`` float32: the same freshly initialised model in every row.

    Every client starts from one common model, as is usual in decentralised learning (and
    needed for averaging to make sense early on). The model is built by ``model_factory()``
    under torch's RNG seeded with ``sfg.util.rng.torch_seed(seed, "init")``; the global RNG state
    is restored afterwards, so nothing else is disturbed (docs/concepts/training.md#pairing: shared initial model).
    """
    check(isinstance(n, int) and n >= 1, f"number of clients must be a positive int, got {n!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(seed, "init"))
        model = model_factory()
    row = flatten(model)
    return row.unsqueeze(0).expand(n, -1).clone()


def functional_forward(model: nn.Module, spec: ParamSpec, flat: torch.Tensor,
                       x: torch.Tensor) -> torch.Tensor:
    """Run ``model`` with the parameters ``flat: [D]`` on ``x: [B, *input_shape]`` -> logits."""
    return functional_call(model, spec.unflatten(flat), (x,))
