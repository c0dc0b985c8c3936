"""Interchangeable local-training backends (docs/concepts/round.md#one-round step 3, docs/concepts/training.md#the-training-protocol).

A backend runs K SGD steps for each of n clients at once, on rows of the flat ``[N, D]`` store
(:mod:`sfg.sim.params`), and evaluates many clients' models::

    backend = make_backend("auto", model)              # or "loop", "vmap", "batched"
    new = backend.train(X[live], xs, ys, lr=0.05, weight_decay=5e-4)   # [n, D]
    acc = backend.evaluate(X, test_xs, test_ys)                          # [N] in [0, 1]

Every backend computes, per client, exactly the step of ``torch.optim.SGD(lr, weight_decay,
momentum, dampening=0, nesterov=False)`` on the mean cross-entropy of its minibatch (plus
``prox_lam/2 ||x - center||²`` for Ditto), so they agree with each other and with a plain
per-client optimiser to float tolerance; each is bit-for-bit deterministic on CPU.

* ``loop`` -- one client after the other on a single set of weights; convolutions get
  channels_last inputs. Any model.
* ``vmap`` -- ``torch.func.vmap(grad(loss))`` over clients with ``functional_call``. Any model.
* ``batched`` -- all clients in one pass: batched matmuls (``baddbmm``) for linear layers and
  grouped convolutions (``groups=n``, channels_last) for conv layers. Sequential models of
  Linear / Conv2d / ReLU / MaxPool2d / AvgPool2d / Flatten layers (``mlp``, ``small-cnn``,
  ``cnn``); others raise :class:`SfgError`.
* ``auto`` -- a fixed rule derived from measurements (:func:`auto_choice`), so the choice never
  depends on timing noise and results stay reproducible.

Every backend takes a ``precision`` (:mod:`sfg.sim.precision`): ``fp32`` (default), ``tf32``
(CUDA's TF32 matrix products and convolutions; a no-op on CPU) or ``bf16`` (the local
training's forward and backward under bf16 autocast; parameters and SGD steps float32).

On CPU the clients are split into ``workers`` contiguous chunks (default: torch's intra-op
thread count) trained concurrently by threads that each use one intra-op thread. Per-client
kernels are too small to scale across cores while independent clients do, and a single
multi-threaded kernel stalls whenever another process holds one of the cores (measured on the
shared 2-core development machine: batched MLP steps 10× slower with two intra-op threads
than with two single-threaded workers while one core was busy; on an idle machine the two
are within 10 %, K = 10: 16-19 k vs 15-17 k client-steps/s). The numbers do not depend on
the number of workers or threads, by construction: every kernel runs on one intra-op thread,
and the stacked backends cut the clients into blocks that depend only on N and ``chunk``
(:func:`_run_chunks`), so the same kernels see the same blocks on 1, 2 or 16 cores.
"""

from __future__ import annotations

import copy
import math
import os
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from sfg.errors import SfgError, check
from sfg.sim.params import ParamSpec
from sfg.sim.precision import autocast_scope, check_precision, device_precision
from sfg.util.alloc import tune_cpu_allocator
from sfg.util.components import Component, Registry, parse_component

BACKENDS = Registry("backend")


class Backend(Protocol):
    """What the round loop needs from a local-training backend."""

    name: str
    spec: ParamSpec
    device: torch.device

    def train(self, params: Tensor, xs: Tensor, ys: Tensor, *, lr: float, weight_decay: float,
              momentum: float = 0.0, momentum_buf: Tensor | None = None,
              prox_center: Tensor | None = None, prox_lam: float = 0.0,
              trainable_mask: Tensor | None = None) -> Tensor: ...

    def evaluate(self, params: Tensor, xs: Sequence[Tensor] | Tensor,
                 ys: Sequence[Tensor] | Tensor, *, batch_size: int = 1024) -> Tensor: ...


# ----------------------------------------------------------------------------------------------
# the SGD step shared by every backend


def sgd_step_(p: Tensor, g: Tensor, *, lr: float, weight_decay: float, momentum: float,
              buf: Tensor | None, center: Tensor | None, prox_lam: float,
              mask: Tensor | None) -> None:
    """One in-place SGD step on ``p: [..., D]`` with gradient ``g: [..., D]`` (overwritten).

    Same arithmetic as ``torch.optim.SGD`` (single-tensor path): the proximal gradient
    ``prox_lam (p - center)`` joins the loss gradient, then ``d = g + wd·p``; with momentum
    ``buf ← momentum·buf + d`` (a zero buffer reproduces torch's first step) and ``d = buf``;
    finally ``p ← p - lr·d``. Coordinates outside ``mask: bool[D]`` keep ``p`` and ``buf``.
    """
    if prox_lam:
        g.add_(p - center, alpha=prox_lam)
    if weight_decay:
        g.add_(p, alpha=weight_decay)
    d = g
    if momentum:
        if mask is None:
            buf.mul_(momentum).add_(g)
        else:
            buf.copy_(torch.where(mask, buf * momentum + g, buf))
        d = buf
    if mask is not None:
        d = d.masked_fill(~mask, 0.0)
    p.add_(d, alpha=-lr)


# ----------------------------------------------------------------------------------------------
# sequential "plans": models the batched backend (and fast single-client paths) can run


@dataclass(frozen=True)
class _Op:
    kind: str                      # conv | linear | relu | maxpool | avgpool | flatten
    weight: str = ""
    bias: str = ""
    args: tuple[Any, ...] = ()     # conv: (stride, padding, dilation, groups); pool: (k, s, p)


_SKIP = (nn.Identity,)


def sequential_plan(model: nn.Module) -> tuple[list[_Op] | None, str]:
    """The model as a list of simple ops, or ``(None, reason)`` when it is not such a chain.

    Supported: ``nn.Sequential`` of Conv2d (zero padding), Linear, ReLU, MaxPool2d,
    AvgPool2d, Flatten (from dim 1), Identity, Dropout(p=0). A ReLU directly followed by a
    max-pool is run as pool-then-ReLU: both orders give identical values and gradients
    (ReLU is monotone, so it commutes with max; ties resolve to the same element), and the
    ReLU then touches 4× fewer elements.
    """
    if not isinstance(model, nn.Sequential):
        return None, f"{type(model).__name__} is not an nn.Sequential chain"
    ops: list[_Op] = []
    for name, layer in model.named_children():
        if isinstance(layer, nn.Conv2d):
            if layer.padding_mode != "zeros" or isinstance(layer.padding, str):
                return None, f"layer {name}: only numeric zero padding is supported"
            ops.append(_Op("conv", f"{name}.weight", f"{name}.bias" if layer.bias is not None
                           else "", (layer.stride, layer.padding, layer.dilation, layer.groups)))
        elif isinstance(layer, nn.Linear):
            ops.append(_Op("linear", f"{name}.weight",
                           f"{name}.bias" if layer.bias is not None else ""))
        elif isinstance(layer, nn.ReLU):
            ops.append(_Op("relu"))
        elif isinstance(layer, nn.MaxPool2d):
            if layer.return_indices or layer.dilation not in (1, (1, 1)):
                return None, f"layer {name}: MaxPool2d with indices/dilation is not supported"
            ops.append(_Op("maxpool", args=(layer.kernel_size, layer.stride, layer.padding,
                                             layer.ceil_mode)))
        elif isinstance(layer, nn.AvgPool2d):
            ops.append(_Op("avgpool", args=(layer.kernel_size, layer.stride, layer.padding,
                                             layer.ceil_mode, layer.count_include_pad)))
        elif isinstance(layer, nn.Flatten):
            if layer.start_dim != 1 or layer.end_dim != -1:
                return None, f"layer {name}: only Flatten(1, -1) is supported"
            ops.append(_Op("flatten"))
        elif isinstance(layer, _SKIP) or (isinstance(layer, nn.Dropout) and layer.p == 0):
            continue
        else:
            return None, f"layer {name} ({type(layer).__name__}) is not supported"
    # ReLU then max-pool == max-pool then ReLU (values and gradients); ReLU on fewer elements.
    out: list[_Op] = []
    for op in ops:
        if op.kind == "maxpool" and out and out[-1].kind == "relu":
            out[-1] = op
            out.append(_Op("relu"))
        else:
            out.append(op)
    return out, ""


def plan_forward(plan: list[_Op], w: dict[str, Tensor], x: Tensor) -> Tensor:
    """One client: ``x: [B, *input_shape]`` -> logits ``[B, C]`` with weights ``w``."""
    for op in plan:
        if op.kind == "conv":
            stride, padding, dilation, groups = op.args
            x = F.conv2d(x, w[op.weight], w[op.bias] if op.bias else None, stride, padding,
                         dilation, groups)
        elif op.kind == "linear":
            x = F.linear(x, w[op.weight], w[op.bias] if op.bias else None)
        elif op.kind == "relu":
            x = F.relu(x)
        elif op.kind == "maxpool":
            x = F.max_pool2d(x, op.args[0], op.args[1], op.args[2], ceil_mode=op.args[3])
        elif op.kind == "avgpool":
            x = F.avg_pool2d(x, op.args[0], op.args[1], op.args[2], op.args[3], op.args[4])
        elif op.kind == "flatten":
            x = x.flatten(1)
    return x


def plan_forward_batched(plan: list[_Op], w: dict[str, Tensor], x: Tensor,
                         channels_last: bool = False) -> Tensor:
    """n clients at once: ``x: [n, B, *input_shape]``, ``w[name]: [n, *shape]`` -> ``[n, B, C]``.

    Image activations live as ``[B, n·C, H, W]`` so that a conv layer is one grouped
    convolution (``groups = n·groups``); flat activations as ``[n, B, F]`` so that a linear
    layer is one ``baddbmm``.
    """
    n, B = x.shape[0], x.shape[1]
    grouped = False  # layout: False -> [n, B, ...]; True -> [B, n*C, H, W]
    for op in plan:
        if op.kind == "conv":
            if not grouped:
                x = x.transpose(0, 1).reshape(B, n * x.shape[2], *x.shape[3:])
                if channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                grouped = True
            weight = w[op.weight]
            stride, padding, dilation, groups = op.args
            x = F.conv2d(x, weight.reshape(n * weight.shape[1], *weight.shape[2:]),
                         w[op.bias].reshape(-1) if op.bias else None, stride, padding,
                         dilation, groups * n)
        elif op.kind == "linear":
            if x.dim() != 3:
                x = x.reshape(n, B, -1)
            weight = w[op.weight].transpose(1, 2)
            x = (torch.baddbmm(w[op.bias].unsqueeze(1), x, weight) if op.bias
                 else torch.bmm(x, weight))
        elif op.kind == "relu":
            x = F.relu(x)
        elif op.kind in ("maxpool", "avgpool"):
            if not grouped:  # a pool on [n, B, C, H, W]: fold clients into the batch
                y = x.reshape(n * B, *x.shape[2:])
            else:
                y = x
            if op.kind == "maxpool":
                y = F.max_pool2d(y, op.args[0], op.args[1], op.args[2], ceil_mode=op.args[3])
            else:
                y = F.avg_pool2d(y, op.args[0], op.args[1], op.args[2], op.args[3], op.args[4])
            x = y if grouped else y.reshape(n, B, *y.shape[1:])
        elif op.kind == "flatten":
            if grouped:
                x = x.reshape(B, n, -1).transpose(0, 1)
                grouped = False
            else:
                x = x.reshape(n, B, -1)
    if grouped:  # a plan ending in a conv: logits per channel map
        x = x.reshape(B, n, -1).transpose(0, 1)
    return x


_LSM_BACKWARD = torch.ops.aten._log_softmax_backward_data
_RELU_BACKWARD = torch.ops.aten.threshold_backward


def is_linear_chain(plan: list[_Op] | None) -> bool:
    """Whether a plan is only Linear / ReLU / Flatten layers (an MLP): then
    :func:`chain_grads` gives its gradients without autograd."""
    return bool(plan) and any(op.kind == "linear" for op in plan) and all(
        op.kind in ("linear", "relu", "flatten") for op in plan)


def _chain_forward_loss(plan: list[_Op], w: dict[str, Tensor], x: Tensor, y: Tensor
                        ) -> tuple[list[tuple[_Op, Tensor]], Tensor]:
    """Forward pass of a linear chain and the gradient of Σ_clients mean_b CE w.r.t. the
    logits: ``(tape, d)`` with ``tape`` the (op, saved tensor) pairs (a linear layer's input,
    a ReLU's output) and ``d: [n, B, C]``."""
    n, B = x.shape[0], x.shape[1]
    h = x.reshape(n, B, -1)
    tape: list[tuple[_Op, Tensor]] = []
    last = len(plan) - 1
    logits_t = None                       # [n, C, B] when the chain ends in a linear layer
    for i, op in enumerate(plan):
        if op.kind == "linear":
            tape.append((op, h))
            if i == last:                 # the head, class-major: W h^T + b
                logits_t = (torch.baddbmm(w[op.bias].unsqueeze(2), w[op.weight],
                                          h.transpose(1, 2)) if op.bias
                            else torch.bmm(w[op.weight], h.transpose(1, 2)))
                break
            weight = w[op.weight].transpose(1, 2)
            h = (torch.baddbmm(w[op.bias].unsqueeze(1), h, weight) if op.bias
                 else torch.bmm(h, weight))
        elif op.kind == "relu":
            h = F.relu(h)
            tape.append((op, h))
        else:  # flatten
            h = h.reshape(n, B, -1)
    if logits_t is None:
        logits_t = h.transpose(1, 2)
    C = logits_t.shape[1]
    # log-softmax over the classes, class-major [C, n·B], and its backward
    lsm = torch.log_softmax(logits_t.transpose(0, 1).reshape(C, n * B), 0)
    g = torch.zeros_like(lsm)   # d loss / d log-softmax: -1/B at each example's label
    g.scatter_(0, y.reshape(1, -1), -1.0 / B)
    d_t = _LSM_BACKWARD(g, lsm, 0, lsm.dtype).view(C, n, B).transpose(0, 1).contiguous()
    first = next(i for i, (op, _) in enumerate(tape) if op.kind == "linear")
    return tape[first:], d_t.transpose(1, 2)


def chain_grads(plan: list[_Op], w: dict[str, Tensor], x: Tensor, y: Tensor
                ) -> dict[str, Tensor]:
    """Per-client gradients of each client's mean cross-entropy for a linear chain
    (:func:`is_linear_chain`): ``x: [n, B, ...]``, ``y: [n, B]``, ``w[name]: [n, *shape]``;
    returns ``{name: [n, *shape]}`` (contiguous).

    The backward pass written out with batched matmuls, without autograd's graph. The logits
    and their gradient are kept class-major (``[n, C, B]`` per client, ``[C, n·B]`` for the
    log-softmax): with few classes the row-wise log-softmax kernels are 6-8× slower than the
    column-wise ones, and the ``[out, in]`` weight gradients come out of one ``bmm`` in
    place. Agrees with autograd to float rounding (about 1e-7 relative; tested), not bit for
    bit: autograd's forms of the same sums are slower here (``bmm(h^T, d)`` with 10 output
    columns, the row-wise log-softmax).
    """
    tape, d = _chain_forward_loss(plan, w, x, y)
    grads: dict[str, Tensor] = {}
    for i in range(len(tape) - 1, -1, -1):
        op, saved = tape[i]
        if op.kind == "relu":
            d = _RELU_BACKWARD(d, saved, 0)
            continue
        d_t = d.transpose(1, 2)
        grads[op.weight] = torch.bmm(d_t, saved)          # [n, out, in]
        if op.bias:
            grads[op.bias] = d_t.sum(2)
        if i > 0:
            d = torch.bmm(d, w[op.weight])                # [n, B, in]
    return grads


def chain_sgd_step_(plan: list[_Op], w: dict[str, Tensor], x: Tensor, y: Tensor, *,
                    lr: float, weight_decay: float) -> None:
    """One plain SGD step (no momentum, proximal term or mask) of a linear chain, in place on
    the contiguous per-parameter tensors ``w``: the gradients of :func:`chain_grads`, each
    weight stepped as it is computed, ``W ← W − lr·wd·W`` then ``W ← W − lr·(d^T h)`` in the
    same ``baddbmm_`` that computes the gradient: torch.optim.SGD's ``W − lr·(∇ + wd·W)``
    with the gradient never stored (agrees to about 1e-6 relative; tested). The weight decay
    is its own small term, as in torch, not a factor ``1 − lr·wd`` folded into the product,
    whose float32 rounding would shrink every weight by a biased 1e-8 a step."""
    tape, d = _chain_forward_loss(plan, w, x, y)
    decay = -lr * weight_decay
    for i in range(len(tape) - 1, -1, -1):
        op, saved = tape[i]
        if op.kind == "relu":
            d = _RELU_BACKWARD(d, saved, 0)
            continue
        d_t = d.transpose(1, 2)
        weight = w[op.weight]
        d_in = torch.bmm(d, weight) if i > 0 else None   # with the weight before its step
        if decay:
            weight.add_(weight, alpha=decay)
        weight.baddbmm_(d_t, saved, alpha=-lr)
        if op.bias:
            bias = w[op.bias]
            if decay:
                bias.add_(bias, alpha=decay)
            bias.sub_(d_t.sum(2), alpha=lr)
        d = d_in


# ----------------------------------------------------------------------------------------------
# shared plumbing: validation, worker threads, evaluation data


def _uses_conv(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d | nn.Conv1d | nn.Conv3d) for m in model.modules())


def forward_macs(model: nn.Module, input_shape: Sequence[int] | None = None) -> int:
    """Multiply-accumulates of one forward pass on one example (Linear and Conv layers)."""
    shape = tuple(input_shape or model.input_shape)
    total = 0

    def hook(mod: nn.Module, inp: tuple[Tensor, ...], out: Tensor) -> None:
        nonlocal total
        if isinstance(mod, nn.Linear):
            total += mod.in_features * mod.out_features * (out.numel() // mod.out_features)
        elif isinstance(mod, nn.Conv2d):
            k = mod.weight[0].numel()  # in_channels/groups * kh * kw
            total += k * out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, nn.Linear | nn.Conv2d)]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *shape, device=next(model.parameters()).device))
    finally:
        for h in handles:
            h.remove()
    return total




def _default_workers(device: torch.device) -> int:
    return torch.get_num_threads() if device.type == "cpu" else 1


def _chunks(n: int, parts: int) -> list[tuple[int, int]]:
    parts = max(1, min(parts, n))
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i + 1] > bounds[i]]


#: clients per block of the stacked backends (``vmap``, ``batched``) when ``chunk`` is 0; see
#: :func:`_run_chunks`. Measured (benchmarks/bench_backends.py --quick, N = 100, 2 workers):
#: blocks of 25 clients run within a few per cent of two halves of 50.
AUTO_UNIT = 25


def _blocks(n: int, unit: int) -> list[tuple[int, int]]:
    """Contiguous blocks of at most ``unit`` clients, balanced; a function of (n, unit) only."""
    return _chunks(n, -(-n // max(1, unit))) if n > 0 else []


def _calls(n: int, workers: int, unit: int) -> list[tuple[int, int]]:
    """The (lo, hi) ranges :func:`_run_chunks` calls ``fn`` on: blocks of ``unit`` clients,
    or with ``unit`` = 0 one range per worker."""
    if n <= 0:
        return []
    return _blocks(n, unit) if unit > 0 else _chunks(n, workers)


def _run_chunks(n: int, workers: int, fn: Callable[[int, int, int], None],
                scope: Callable[[], AbstractContextManager[Any]] | None = None, *,
                unit: int = 0, one_thread: bool = True) -> None:
    """Call ``fn(slot, lo, hi)`` over a split of ``range(n)``; ``slot`` numbers the worker
    (0..workers-1) that makes the call, concurrently when there are several. ``scope()``: a
    context every call runs in, entered by the thread that makes it (autocast is
    thread-local).

    Why the numbers do not depend on the thread count, by construction:

    * every call runs with one intra-op thread (``one_thread``, on CPU), so no kernel splits
      a reduction over threads;
    * with ``unit`` > 0 (the stacked backends, whose kernels see a whole block of clients at
      once) the blocks are :func:`_blocks` (n, unit) — the same whatever ``workers`` is — and
      each worker runs whole blocks, so every kernel sees the same shapes and values with 1,
      2 or 16 workers; with ``unit`` = 0 (the loop backend, one client at a time) the split
      only decides who trains which client.
    """
    if scope is not None:
        inner = fn

        def fn(slot: int, lo: int, hi: int) -> None:
            with scope():
                inner(slot, lo, hi)

    blocks = _calls(n, workers, unit)
    groups = [blocks[a:b] for a, b in _chunks(len(blocks), workers)] if blocks else []

    def work(slot: int) -> None:
        for lo, hi in groups[slot]:
            fn(slot, lo, hi)

    threads_before = torch.get_num_threads()
    if workers <= 1 or len(groups) <= 1:
        try:
            if one_thread:
                torch.set_num_threads(1)
            for slot in range(len(groups)):
                work(slot)
        finally:
            torch.set_num_threads(threads_before)
        return
    errors: list[BaseException] = []

    def target(slot: int) -> None:
        try:
            torch.set_num_threads(1)
            work(slot)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    pool = _worker_pool(max(len(groups) - 1, 1))
    futures = [pool.submit(target, slot) for slot in range(1, len(groups))]
    try:
        torch.set_num_threads(1)
        work(0)
    finally:
        for f in futures:
            f.result()
        torch.set_num_threads(threads_before)
    if errors:
        raise errors[0]


def _threaded(n: int, workers: int, unit: int = 0) -> bool:
    """Whether :func:`_run_chunks` runs calls concurrently (then each writes private rows)."""
    return workers > 1 and len(_calls(n, workers, unit)) > 1


_POOL: tuple[int, int, Any] | None = None   # (pid, size, ThreadPoolExecutor)
_POOL_LOCK = threading.Lock()


def _worker_pool(size: int):
    """A process-wide pool of at least ``size`` worker threads, kept between calls (a round
    of the simulator trains and evaluates in several calls; starting threads for each cost
    about a millisecond). Rebuilt after a fork, whose child inherits no threads."""
    global _POOL
    from concurrent.futures import ThreadPoolExecutor

    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < size:
            if _POOL is not None and _POOL[0] == os.getpid():
                _POOL[2].shutdown(wait=False)
            _POOL = (os.getpid(), size, ThreadPoolExecutor(size, thread_name_prefix="sfg-train"))
        return _POOL[2]


def _check_float(value: Any, what: str, *, low: float = 0.0, high: float = math.inf,
                 high_open: bool = False) -> float:
    check(isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
          f"{what} must be a finite number, got {value!r}")
    ok = low <= value and (value < high if high_open else value <= high)
    bound = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
    check(ok, f"{what} must be in {bound}, got {value!r}")
    return float(value)


def _check_rows(t: Tensor | None, what: str, n: int, D: int) -> None:
    if t is None:
        return
    check(isinstance(t, Tensor) and tuple(t.shape) == (n, D) and t.dtype == torch.float32,
          f"{what} must be a float32 tensor of shape ({n}, {D}), got "
          f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")


class _BackendBase:
    """Validation, device handling and the shared train/evaluate skeleton."""

    name = "base"

    def __init__(self, model: nn.Module, *, device: str | torch.device = "cpu", workers: int = 0):
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError):
            raise SfgError(f"unknown device {device!r}; use 'cpu' or 'cuda'") from None
        if self.device.type == "cuda":
            check(torch.cuda.is_available(),
                  "device 'cuda' requested but CUDA is not available; use device='cpu'")
        check(isinstance(workers, int) and not isinstance(workers, bool) and workers >= 0,
              f"workers must be a non-negative int (0 = automatic), got {workers!r}")
        self.workers = workers or _default_workers(self.device)
        self.precision = "fp32"  # sfg.sim.precision; set by make_backend
        if self.device.type == "cpu":
            tune_cpu_allocator()
        self.model = model
        self.spec = ParamSpec.from_module(model)
        self.input_shape = tuple(getattr(model, "input_shape", ()))
        self.num_classes = getattr(model, "num_classes", None)
        self.uses_conv = _uses_conv(model)
        self._eval_cache: tuple[tuple[Any, ...], _EvalData] | None = None
        # one module copy per worker thread, for functional_call (a module is not thread-safe)
        self._modules: list[nn.Module] = []
        self._lock = threading.Lock()
        check(not any(True for _ in model.buffers()),
              f"model {getattr(model, 'model_name', type(model).__name__)!r} has buffers "
              "(e.g. BatchNorm running statistics); sfg models keep all state in parameters - "
              "use GroupNorm")

    #: clients per block of one kernel call (0: one client at a time, the loop backend)
    def _unit(self) -> int:
        return 0

    def _run(self, n: int, fn: Callable[[int, int, int], None],
             scope: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        """:func:`_run_chunks` with this backend's workers and blocks."""
        _run_chunks(n, self.workers, fn, scope, unit=self._unit(),
                    one_thread=self.device.type == "cpu")

    def _module(self, slot: int) -> nn.Module:
        """Worker ``slot``'s private copy of the model (gradients off)."""
        with self._lock:
            while len(self._modules) <= slot:
                module = copy.deepcopy(self.model).to(self.device)
                self._modules.append(module.requires_grad_(False))
            return self._modules[slot]

    # -- validation
    def _check_inputs(self, xs: Tensor, n_lead: int, what: str) -> None:
        shape = tuple(xs.shape[n_lead:])
        want = self.input_shape
        if not want:
            return
        ok = shape == want or (len(want) != 3 and math.prod(shape) == math.prod(want))
        check(ok, f"{what} has example shape {shape}; model {self.model.model_name!r} "
                  f"expects {want}")

    def _check_labels(self, ys: Tensor, what: str) -> None:
        check(ys.dtype == torch.int64, f"{what} must be int64 class labels, got {ys.dtype}")
        if ys.numel() and self.num_classes is not None:
            lo, hi = torch.stack(torch.aminmax(ys)).tolist()  # one copy to the host
            check(lo >= 0 and hi < self.num_classes,
                  f"{what} has labels in [{lo}, {hi}], model has {self.num_classes} classes")

    def _prepare_train(self, params: Tensor, xs: Tensor, ys: Tensor, lr: float,
                       weight_decay: float, momentum: float, momentum_buf: Tensor | None,
                       prox_center: Tensor | None, prox_lam: float,
                       trainable_mask: Tensor | None) -> dict[str, Any]:
        D = self.spec.D
        check(isinstance(params, Tensor) and params.dim() == 2 and params.shape[1] == D
              and params.dtype == torch.float32,
              f"params must be a float32 tensor [n, {D}], got "
              f"{getattr(params, 'dtype', type(params).__name__)} "
              f"{tuple(getattr(params, 'shape', ()))}")
        n = params.shape[0]
        # a tensor, or a PoolBatch (sfg.world.data.base): rows of the data's pool, made into
        # float examples block by block as the kernels below read xs[c0:c1] or xs[i, k]
        lazy = hasattr(xs, "images") and hasattr(xs, "rows")
        check((isinstance(xs, Tensor) or lazy) and xs.dim() >= 4 and xs.shape[0] == n,
              f"xs must be a tensor [n={n}, K, B, *input_shape], got "
              f"{tuple(getattr(xs, 'shape', ()))}")
        K, B = xs.shape[1], xs.shape[2]
        check(isinstance(ys, Tensor) and tuple(ys.shape) == (n, K, B),
              f"ys must be a tensor [n, K, B] = {(n, K, B)}, got {tuple(getattr(ys, 'shape', ()))}")
        check(B >= 1 or K == 0, "minibatches must hold at least one example (B >= 1)")
        self._check_inputs(xs, 3, "xs")
        self._check_labels(ys, "ys")
        lr = _check_float(lr, "lr")
        weight_decay = _check_float(weight_decay, "weight_decay")
        momentum = _check_float(momentum, "momentum", high=1.0, high_open=True)
        prox_lam = _check_float(prox_lam, "prox_lam")
        check(not prox_lam or prox_center is not None,
              "prox_lam > 0 needs prox_center (the [n, D] models to pull towards)")
        _check_rows(momentum_buf, "momentum_buf", n, D)
        _check_rows(prox_center, "prox_center", n, D)
        if momentum_buf is not None:
            check(momentum_buf.device == self.device,
                  f"momentum_buf must live on {self.device} (it is updated in place)")
        if trainable_mask is not None:
            check(isinstance(trainable_mask, Tensor) and trainable_mask.dtype == torch.bool
                  and tuple(trainable_mask.shape) == (D,),
                  f"trainable_mask must be a bool tensor [{D}]")
            trainable_mask = trainable_mask.to(self.device)
        dev = self.device
        buf = momentum_buf
        if momentum and buf is None:  # a fresh optimiser: zero buffer == torch's first step
            buf = torch.zeros(n, D, device=dev)
        return dict(n=n, K=K, B=B, lr=lr, weight_decay=weight_decay, momentum=momentum,
                    buf=buf if momentum else None,
                    center=prox_center.to(dev) if prox_lam else None, prox_lam=prox_lam,
                    mask=trainable_mask,
                    xs=xs.to(dev, torch.float32), ys=ys.to(dev))

    # -- public API
    def train(self, params: Tensor, xs: Tensor, ys: Tensor, *, lr: float, weight_decay: float,
              momentum: float = 0.0, momentum_buf: Tensor | None = None,
              prox_center: Tensor | None = None, prox_lam: float = 0.0,
              trainable_mask: Tensor | None = None) -> Tensor:
        """K SGD steps for each of n clients (docs/concepts/round.md#local-training).

        params: [n, D] float32 (the aggregated models x̃; not modified);
        xs: [n, K, B, *input_shape] float32, a tensor or a
        :class:`~sfg.world.data.base.PoolBatch` (rows of the data's pool, made into examples
        block by block as the backend reads them); ys: [n, K, B] int64 (step k uses
        ``xs[:, k]``);
        momentum_buf: [n, D] heavy-ball buffers, updated in place (None: fresh zero buffers);
        prox_center: [n, D] with ``prox_lam`` > 0 adds ``prox_lam/2 ||x - center||²``;
        trainable_mask: bool[D], only these coordinates change.
        Returns [n, D] float32 on the backend's device.
        """
        a = self._prepare_train(params, xs, ys, lr, weight_decay, momentum, momentum_buf,
                                prox_center, prox_lam, trainable_mask)
        out = params.detach().to(self.device, torch.float32, copy=True)
        if a["K"] == 0 or a["n"] == 0:
            return out
        with torch.enable_grad(), device_precision(self.precision, self.device):
            self._train(out, a)
        return out

    def _scope(self) -> AbstractContextManager[Any]:
        """The context of the local training's forward and backward passes (bf16 autocast
        under ``precision="bf16"``, :mod:`sfg.sim.precision`); entered by each worker."""
        return autocast_scope(self.precision, self.device)

    def evaluate(self, params: Tensor, xs: Sequence[Tensor] | Tensor,
                 ys: Sequence[Tensor] | Tensor, *, batch_size: int = 1024) -> Tensor:
        """Top-1 accuracy of each client's model on its own examples -> [n] float32 in [0, 1].

        params: [n, D]; xs: n tensors [m_i, *input_shape] (or one [n, m, *input_shape], or a
        :class:`~sfg.world.data.ClientImages`: rows of the data's pool, normalised per batch);
        ys: n int64 tensors [m_i] (or [n, m]). ``batch_size`` bounds the examples in one
        forward pass (summed over the clients evaluated together).
        """
        D = self.spec.D
        check(isinstance(params, Tensor) and params.dim() == 2 and params.shape[1] == D,
              f"params must be a tensor [n, {D}], got {tuple(getattr(params, 'shape', ()))}")
        check(isinstance(batch_size, int) and batch_size >= 1,
              f"batch_size must be a positive int, got {batch_size!r}")
        n = params.shape[0]
        data = _EvalData.build(xs, ys, n)
        key = data.key()
        if self._eval_cache is not None and self._eval_cache[0] == key:
            data = self._eval_cache[1]  # same inputs as last time: reuse their concatenation
        else:
            check(self.input_shape == () or data.example_shape == self.input_shape
                  or (len(self.input_shape) != 3
                      and math.prod(data.example_shape) == math.prod(self.input_shape)),
                  f"evaluation inputs have example shape {data.example_shape}; model "
                  f"{self.model.model_name!r} expects {self.input_shape}")
            lo, hi = data.label_range()
            check(self.num_classes is None or (lo >= 0 and hi < self.num_classes),
                  f"evaluation labels lie in [{lo}, {hi}], model has {self.num_classes} classes")
            check(all(y.dtype == torch.int64 for y in data.parts_y),
                  "evaluation labels must be int64 class indices")
            self._eval_cache = (key, data)
        correct = torch.zeros(n, dtype=torch.float64)
        P = params.detach().to(self.device, torch.float32)
        with torch.inference_mode(), device_precision(self.precision, self.device):
            self._evaluate(P, data, batch_size, correct)
        return (correct / data.counts.to(torch.float64)).to(torch.float32)

    # -- to implement
    def _train(self, out: Tensor, a: dict[str, Any]) -> None:
        raise NotImplementedError

    def _evaluate(self, P: Tensor, data: _EvalData, batch_size: int, correct: Tensor) -> None:
        raise NotImplementedError


class _EvalData:
    """Evaluation examples of n clients, without copying shared sets n times.

    Client i's examples are rows ``starts[i] : starts[i] + counts[i]`` of part ``part_of[i]``;
    clients given the same tensor (e.g. one common test set) share its part. ``x``/``y``
    concatenate the parts (lazily, once) for the backends that gather many clients at once;
    ``offsets`` then index into them.
    """

    def __init__(self, parts_x: list[Tensor], parts_y: list[Tensor], part_of: list[int],
                 starts: list[int], counts: list[int]):
        self.parts_x, self.parts_y = parts_x, parts_y
        self.part_of, self.starts = part_of, starts
        self.counts = torch.tensor(counts, dtype=torch.int64)           # [n]
        bases = [0]
        for part in parts_x[:-1]:
            bases.append(bases[-1] + part.shape[0])
        self.offsets = torch.tensor([bases[p] + s for p, s in zip(part_of, starts, strict=True)],
                                    dtype=torch.int64)                 # [n]
        self._xy: tuple[Tensor, Tensor] | None = None

    @classmethod
    def build(cls, xs: Sequence[Tensor] | Tensor, ys: Sequence[Tensor] | Tensor,
              n: int) -> _EvalData:
        if hasattr(xs, "rows") and hasattr(xs, "take"):  # sfg.world.data.ClientImages
            return _PooledEvalData(xs, ys, n)
        if isinstance(xs, Tensor):
            check(isinstance(ys, Tensor) and xs.dim() >= 2 and xs.shape[0] == n
                  and tuple(ys.shape) == tuple(xs.shape[:2]),
                  f"evaluation xs must be [n={n}, m, ...] with ys [n, m], got "
                  f"{tuple(xs.shape)} and {tuple(getattr(ys, 'shape', ()))}")
            m = xs.shape[1]
            check(m >= 1, "every client needs at least one evaluation example")
            return cls([xs.reshape(n * m, *xs.shape[2:])], [ys.reshape(-1)], [0] * n,
                       [i * m for i in range(n)], [m] * n)
        xs, ys = list(xs), list(ys)
        check(len(xs) == n and len(ys) == n,
              f"evaluation needs one x and one y tensor per client: {n} clients, got "
              f"{len(xs)} and {len(ys)}")
        seen: dict[tuple[Any, ...], int] = {}
        parts_x, parts_y, part_of, counts = [], [], [], []
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            check(isinstance(x, Tensor) and isinstance(y, Tensor) and x.dim() >= 1
                  and y.dim() == 1 and x.shape[0] == y.shape[0],
                  f"client {i}: evaluation x must be [m, ...] and y [m] with the same m")
            check(x.shape[0] >= 1, f"client {i} has no evaluation examples")
            key = (x.data_ptr(), x.storage_offset(), tuple(x.shape), tuple(x.stride()),
                   y.data_ptr(), y.storage_offset(), tuple(y.stride()))
            if key not in seen:
                seen[key] = len(parts_x)
                parts_x.append(x)
                parts_y.append(y)
            part_of.append(seen[key])
            counts.append(x.shape[0])
        shapes = {tuple(p.shape[1:]) for p in parts_x}
        check(len(shapes) == 1, f"evaluation examples differ in shape across clients: {shapes}")
        return cls(parts_x, parts_y, part_of, [0] * n, counts)

    def key(self) -> tuple[Any, ...]:
        """Identity of the inputs (storage, layout and in-place version) for caching."""
        return tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t._version)
                     for t in (*self.parts_x, *self.parts_y)) + (tuple(self.part_of),
                                                                  tuple(self.starts))

    def client(self, i: int) -> tuple[Tensor, Tensor]:
        """Client i's examples ``[m_i, ...]`` and labels ``[m_i]`` (views)."""
        p, s, m = self.part_of[i], self.starts[i], int(self.counts[i])
        return self.parts_x[p][s:s + m], self.parts_y[p][s:s + m]

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.parts_x[0].shape[1:])

    def label_range(self) -> tuple[int, int]:
        return (min(int(y.min()) for y in self.parts_y), max(int(y.max()) for y in self.parts_y))

    def _concatenated(self) -> tuple[Tensor, Tensor]:
        if self._xy is None:
            x = self.parts_x[0] if len(self.parts_x) == 1 else torch.cat(self.parts_x)
            y = self.parts_y[0] if len(self.parts_y) == 1 else torch.cat(self.parts_y)
            self._xy = (x, y)
        return self._xy

    def batch(self, lo: int, hi: int, start: int, size: int,
              device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """Examples ``start : start+size`` of clients lo..hi-1 as ``x [c, size, ...]``,
        ``y [c, size]`` and ``valid: bool[c, size]`` (clients with fewer examples repeat
        their last one, masked out)."""
        X, Y = self._concatenated()
        pos = start + torch.arange(size)
        counts = self.counts[lo:hi, None]
        valid = pos[None, :] < counts
        idx = self.offsets[lo:hi, None] + torch.minimum(pos[None, :], counts - 1)
        x = X[idx.to(X.device)].to(device, torch.float32, non_blocking=True)
        return x, Y[idx.to(Y.device)].to(device), valid.to(device)


class _PooledEvalData(_EvalData):
    """Evaluation examples as rows of one shared image pool
    (:class:`sfg.world.data.ClientImages`): each batch is gathered as stored and normalised
    (the floats of normalising every image first), so evaluating N clients holds the pool
    once and one batch, not N test sets of floats."""

    def __init__(self, images: Any, ys: Sequence[Tensor] | Tensor, n: int):
        check(len(images) == n, f"evaluation needs one test set per client: {n} clients, got "
                                f"{len(images)}")
        sizes = np.asarray(images.sizes, np.int64)
        check(bool((sizes >= 1).all()), "every client needs at least one evaluation example")
        if isinstance(ys, Tensor):
            y = ys.reshape(-1)
        else:
            parts = [t.reshape(-1) for t in ys]
            y = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        check(y.dim() == 1 and y.shape[0] == int(sizes.sum()),
              f"evaluation labels: {y.shape[0]} for {int(sizes.sum())} examples")
        self.images = images
        self.parts_x: list[Tensor] = []
        self.parts_y = [y]
        self.counts = torch.from_numpy(sizes.copy())                          # [n]
        self.offsets = torch.from_numpy(np.asarray(images.offsets[:-1], np.int64).copy())
        self.rows = torch.from_numpy(np.asarray(images.rows, np.int64))
        self._xy = None

    def key(self) -> tuple[Any, ...]:
        # the cache holds this object, so the ids and addresses below are not reused meanwhile
        y = self.parts_y[0]
        return ("pooled", id(self.images), id(self.images.images),
                self.images.rows.__array_interface__["data"][0], int(self.rows.shape[0]),
                y.data_ptr(), tuple(y.shape), y._version)

    def client(self, i: int) -> tuple[Tensor, Tensor]:
        s, m = int(self.offsets[i]), int(self.counts[i])
        return self.images.take(self.rows[s:s + m]), self.parts_y[0][s:s + m]

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.images.example_shape)

    def batch(self, lo: int, hi: int, start: int, size: int,
              device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        Y = self.parts_y[0]
        pos = start + torch.arange(size)
        counts = self.counts[lo:hi, None]
        valid = pos[None, :] < counts
        idx = self.offsets[lo:hi, None] + torch.minimum(pos[None, :], counts - 1)
        x = self.images.take(self.rows[idx], device)
        return x, Y[idx.to(Y.device)].to(device), valid.to(device)


# ----------------------------------------------------------------------------------------------
# loop


class LoopBackend(_BackendBase):
    """Clients one after another (per worker thread); channels_last inputs for convolutions."""

    name = "loop"

    def __init__(self, model: nn.Module, *, device: str | torch.device = "cpu", workers: int = 0,
                 channels_last: bool = True):
        super().__init__(model, device=device, workers=workers)
        self.channels_last = bool(channels_last) and self.uses_conv
        self.plan, _ = sequential_plan(model)

    def _forward(self, slot: int, w: dict[str, Tensor], x: Tensor) -> Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.plan is not None:
            return plan_forward(self.plan, w, x)
        return functional_call(self._module(slot), w, (x,))

    def _train(self, out: Tensor, a: dict[str, Any]) -> None:
        spec, xs, ys = self.spec, a["xs"], a["ys"]

        def run(slot: int, lo: int, hi: int) -> None:
            g = torch.empty(spec.D, device=self.device)
            p = torch.empty(spec.D, device=self.device)  # private: other threads bump `out`
            for i in range(lo, hi):
                p.copy_(out[i])
                buf = a["buf"][i] if a["buf"] is not None else None
                center = a["center"][i] if a["center"] is not None else None
                for k in range(a["K"]):
                    leaves = {name: t.detach().requires_grad_()
                              for name, t in spec.unflatten(p).items()}
                    loss = F.cross_entropy(self._forward(slot, leaves, xs[i, k]), ys[i, k])
                    grads = torch.autograd.grad(loss, list(leaves.values()))
                    torch.cat([gr.reshape(-1) for gr in grads], out=g)
                    sgd_step_(p, g, lr=a["lr"], weight_decay=a["weight_decay"],
                              momentum=a["momentum"], buf=buf, center=center,
                              prox_lam=a["prox_lam"], mask=a["mask"])
                out[i].copy_(p)

        self._run(a["n"], run, self._scope)

    def _evaluate(self, P: Tensor, data: _EvalData, batch_size: int, correct: Tensor) -> None:
        spec, n = self.spec, P.shape[0]

        with torch.inference_mode(False):  # worker threads run outside inference mode
            hits = torch.zeros(n, dtype=torch.int64, device=self.device)  # on the device

        def run(slot: int, lo: int, hi: int) -> None:
            for i in range(lo, hi):
                w = spec.unflatten(P[i])
                xi, yi = data.client(i)
                for s in range(0, xi.shape[0], batch_size):
                    x = xi[s:s + batch_size].to(self.device, torch.float32)
                    pred = self._forward(slot, w, x).argmax(-1)
                    hits[i] += (pred == yi[s:s + batch_size].to(self.device)).sum()

        self._run(n, run)
        correct += hits.cpu().to(torch.float64)  # one copy to the host per call


# ----------------------------------------------------------------------------------------------
# stacked backends: a chunk of clients per pass (vmap and batched)


class _StackedBackend(_BackendBase):
    """Shared driver of the backends that train a chunk of clients in one pass. A subclass
    gives, per worker slot, the chunk's flat gradients (:meth:`_grads_fn`) and logits
    (:meth:`_logits_fn`); the driver runs the local steps and the evaluation batches."""

    def __init__(self, model: nn.Module, *, device: str | torch.device = "cpu", workers: int = 0,
                 chunk: int = 0):
        super().__init__(model, device=device, workers=workers)
        check(isinstance(chunk, int) and chunk >= 0,
              f"{self.name} chunk must be a non-negative int (0 = automatic), "
              f"got {chunk!r}")
        self.chunk = chunk

    #: copy a chunk's minibatches to step-major order ``[K, m, B, ...]`` once per call, so
    #: that every step reads a contiguous ``[m, B, ...]`` block (same values, no per-step copy)
    step_major = False

    def _unit(self) -> int:  # on CUDA (one worker) all clients in one pass unless chunk says
        return self.chunk or (AUTO_UNIT if self.device.type == "cpu" else 0)

    def _parts(self, lo: int, hi: int) -> list[tuple[int, int]]:
        return [(lo, hi)]  # one block per call (_run_chunks cuts them, by n and chunk only)

    def _grads_fn(self, slot: int) -> Callable[[Tensor, Tensor, Tensor, Tensor], None]:
        """(params [m, D], x [m, B, ...], y [m, B], out g [m, D]) -> per-client gradients of
        each client's mean loss, written into g."""
        raise NotImplementedError

    def _logits_fn(self, slot: int) -> Callable[[dict[str, Tensor], Tensor], Tensor]:
        """(unflattened params of m clients, x [m, B, ...]) -> logits [m, B, classes]."""
        raise NotImplementedError

    def _train(self, out: Tensor, a: dict[str, Any]) -> None:
        xs, ys = a["xs"], a["ys"]
        threaded = _threaded(a["n"], self.workers, self._unit())

        def run(slot: int, lo: int, hi: int) -> None:
            grads = self._grads_fn(slot)
            for c0, c1 in self._parts(lo, hi):
                # threads get private rows: in-place steps elsewhere in `out` bump its version
                p = out[c0:c1].clone() if threaded else out[c0:c1]
                g = torch.empty_like(p)
                buf = a["buf"][c0:c1] if a["buf"] is not None else None
                center = a["center"][c0:c1] if a["center"] is not None else None
                # step-major minibatches: one copy per call instead of one per step
                xk = xs[c0:c1].transpose(0, 1).contiguous() if self.step_major else None
                for k in range(a["K"]):
                    grads(p, xk[k] if xk is not None else xs[c0:c1, k], ys[c0:c1, k], g)
                    sgd_step_(p, g, lr=a["lr"], weight_decay=a["weight_decay"],
                              momentum=a["momentum"], buf=buf, center=center,
                              prox_lam=a["prox_lam"], mask=a["mask"])
                if threaded:
                    out[c0:c1] = p

        self._run(a["n"], run, self._scope)

    def _evaluate(self, P: Tensor, data: _EvalData, batch_size: int, correct: Tensor) -> None:
        spec, n = self.spec, P.shape[0]
        longest = int(data.counts.max())

        with torch.inference_mode(False):  # worker threads run outside inference mode
            hits = torch.zeros(n, dtype=torch.int64, device=self.device)  # on the device

        def run(slot: int, lo: int, hi: int) -> None:
            logits_of = self._logits_fn(slot)
            for c0, c1 in self._parts(lo, hi):
                step = max(1, batch_size // (c1 - c0))
                w = spec.unflatten(P[c0:c1])
                for s in range(0, longest, step):
                    x, y, valid = data.batch(c0, c1, s, min(step, longest - s), self.device)
                    hit = (logits_of(w, x).argmax(-1) == y) & valid
                    hits[c0:c1] += hit.sum(1)

        self._run(n, run)
        correct += hits.cpu().to(torch.float64)  # one copy to the host per call


class VmapBackend(_StackedBackend):
    """``vmap(grad(loss))`` over clients with ``functional_call`` (any model)."""

    name = "vmap"

    def _grads_fn(self, slot: int) -> Callable[[Tensor, Tensor, Tensor, Tensor], None]:
        spec, module = self.spec, self._module(slot)

        def loss(w: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            return F.cross_entropy(functional_call(module, w, (x,)), y)

        grad_fn = vmap(grad(loss))

        def grads(p: Tensor, x: Tensor, y: Tensor, g: Tensor) -> None:
            per_client = grad_fn(spec.unflatten(p), x, y)
            torch.cat([per_client[name].reshape(p.shape[0], -1) for name in spec.names],
                      dim=1, out=g)

        return grads

    def _logits_fn(self, slot: int) -> Callable[[dict[str, Tensor], Tensor], Tensor]:
        module = self._module(slot)
        return vmap(lambda w, x: functional_call(module, w, (x,)))


class BatchedBackend(_StackedBackend):
    """All clients in one pass: ``baddbmm`` for linear layers, grouped conv for conv layers."""

    name = "batched"
    step_major = True

    def __init__(self, model: nn.Module, *, device: str | torch.device = "cpu", workers: int = 0,
                 chunk: int = 0, channels_last: bool = True):
        plan, reason = sequential_plan(model)
        check(plan is not None,
              f"backend 'batched' cannot run model "
              f"{getattr(model, 'model_name', type(model).__name__)!r} ({reason}); use backend "
              "'loop', 'vmap' or 'auto'")
        super().__init__(model, device=device, workers=workers, chunk=chunk)
        self.plan = plan
        self.channels_last = bool(channels_last)

    def _train(self, out: Tensor, a: dict[str, Any]) -> None:
        if not is_linear_chain(self.plan):
            super()._train(out, a)
            return
        # an MLP: the backward pass written out. Plain float32 SGD (no momentum, proximal
        # term or mask) runs on contiguous per-parameter copies of the chunk's rows, updated in place
        # by chain_sgd_step_ and copied back once; otherwise chain_grads' gradients are
        # copied into a flat buffer for the shared sgd_step_.
        spec, xs, ys, K = self.spec, a["xs"], a["ys"], a["K"]
        plain = a["buf"] is None and a["center"] is None and a["mask"] is None
        # bf16: chain_sgd_step_'s in-place float32 products cannot take autocast's operands
        plain = plain and self.precision != "bf16"

        def run(slot: int, lo: int, hi: int) -> None:
            for c0, c1 in self._parts(lo, hi):
                p = out[c0:c1]
                pv = spec.unflatten(p)
                xk = xs[c0:c1].transpose(0, 1).contiguous()  # step-major: [K, m, B, ...]
                yk = ys[c0:c1].transpose(0, 1).contiguous()  # [K, m, B]
                if plain:
                    w = {name: view.clone(memory_format=torch.contiguous_format)
                         for name, view in pv.items()}
                    for k in range(K):
                        chain_sgd_step_(self.plan, w, xk[k], yk[k], lr=a["lr"],
                                        weight_decay=a["weight_decay"])
                    for name, view in pv.items():
                        view.copy_(w[name])
                    continue
                g = torch.empty_like(p)
                gv = spec.unflatten(g)
                buf = a["buf"][c0:c1] if a["buf"] is not None else None
                center = a["center"][c0:c1] if a["center"] is not None else None
                for k in range(K):
                    grads = chain_grads(self.plan, pv, xk[k], yk[k])
                    for name, view in gv.items():
                        view.copy_(grads[name])
                    sgd_step_(p, g, lr=a["lr"], weight_decay=a["weight_decay"],
                              momentum=a["momentum"], buf=buf, center=center,
                              prox_lam=a["prox_lam"], mask=a["mask"])

        self._run(a["n"], run, self._scope)

    def _grads_fn(self, slot: int) -> Callable[[Tensor, Tensor, Tensor, Tensor], None]:
        spec = self.spec

        def grads(p: Tensor, x: Tensor, y: Tensor, g: Tensor) -> None:
            m = p.shape[0]
            leaves = {name: t.detach().requires_grad_() for name, t in spec.unflatten(p).items()}
            logits = plan_forward_batched(self.plan, leaves, x, self.channels_last)
            B = logits.shape[1]
            # sum over clients of each client's mean loss: per-client gradients
            loss = F.cross_entropy(logits.reshape(m * B, -1), y.reshape(-1),
                                   reduction="sum") / B
            per_client = torch.autograd.grad(loss, [leaves[name] for name in spec.names])
            torch.cat([gr.reshape(m, -1) for gr in per_client], dim=1, out=g)

        return grads

    def _logits_fn(self, slot: int) -> Callable[[dict[str, Tensor], Tensor], Tensor]:
        return lambda w, x: plan_forward_batched(self.plan, w, x, self.channels_last)


# ----------------------------------------------------------------------------------------------
# auto and the registry


def auto_choice(model: nn.Module, device: str | torch.device = "cpu") -> str:
    """The backend ``auto`` uses for ``model`` on ``device``: a fixed rule, never a timing.

    A timed probe could pick differently from run to run, and backends agree only to float
    tolerance, so results would stop being bit-for-bit reproducible; the rule depends only on
    the architecture and the device type. Measured with ``benchmarks/bench_backends.py`` on the
    2-core development CPU (n = 100 clients, batch 32; client-steps/s, quiet machine):

    ===================================  ======  ======  ======================  =========
    model (forward MACs per example)      loop    vmap    batched (grouped conv)  choice
    ===================================  ======  ======  ======================  =========
    mlp 8×8 digits (8.8 k)                1,820   6,110   6,540 (13-15 k at K≥4)   batched
    small-cnn 1×8×8 (84 k)                  565   1,130   1,280                    batched
    small-cnn 1×28×28, 62 cls (1.1 M)        68      49      96                    batched
    cnn 1×28×28, 62 cls (4.3 M)              54       -      42                    loop
    paper cnn 3×32×32 (7.8 M)                72      26      42                    loop
    ===================================  ======  ======  ======================  =========

    Hence on CPU: models the batched backend can run go batched up to
    :data:`AUTO_BATCHED_MAX_MACS` forward MACs per example (per-client kernels are too small
    to keep the cores busy), loop above it (mkldnn's per-client convolutions beat grouped
    ones); other models (ResNet-18-GN) go to the loop. On CUDA: ``vmap``, the approach the
    paper's simulator used on an A100 (not measured here: no GPU in development).
    """
    dev = torch.device(device)
    plan, _ = sequential_plan(model)
    if dev.type != "cpu":
        return "vmap"
    if plan is None:
        return "loop"
    macs = forward_macs(copy.deepcopy(model).cpu())
    return "batched" if macs <= AUTO_BATCHED_MAX_MACS else "loop"


# Crossover between batched (small models) and the per-client loop on CPU, in forward
# multiply-accumulates per example: between 1.1 M (batched 1.4× faster) and 4.3 M (loop 1.3×
# faster), see auto_choice.
AUTO_BATCHED_MAX_MACS = 2_000_000


_CLASSES: dict[str, type[_BackendBase]] = {
    "loop": LoopBackend, "vmap": VmapBackend, "batched": BatchedBackend,
}


def _factory(cls: type[_BackendBase]) -> Callable[..., Callable[..., _BackendBase]]:
    def make(**params: Any) -> Callable[..., _BackendBase]:
        return lambda model, device: cls(model, device=device, **params)
    return make


BACKENDS.register("loop", _factory(LoopBackend), params={"workers": 0, "channels_last": True},
                  doc="per-client loop; channels_last convolutions")
BACKENDS.register("vmap", _factory(VmapBackend), params={"workers": 0, "chunk": 0},
                  doc="torch.func.vmap over clients")
BACKENDS.register("batched", _factory(BatchedBackend),
                  params={"workers": 0, "chunk": 0, "channels_last": True},
                  doc="batched matmul / grouped convolution over clients")
BACKENDS.register("auto", lambda **p: None, params={"workers": 0},
                  doc="the fastest of the above for the model and device (fixed rule)")


def make_backend(name: str | Component, model: nn.Module, *,
                 device: str | torch.device = "cpu", precision: str = "fp32") -> Backend:
    """Build a backend by name (``"loop"``, ``"vmap"``, ``"batched"``, ``"auto"``; options as
    ``"vmap:chunk=25"``, ``"loop:workers=1"``). ``model`` fixes the architecture; its own
    parameter values are never used (training reads the flat rows it is given). ``"auto"``
    returns the backend :func:`auto_choice` names; its ``name`` says which.

    Options: ``workers`` (CPU threads over client chunks; 0 = torch's thread count on CPU,
    1 on CUDA; never changes the numbers), ``chunk`` (vmap/batched: at most this many clients
    per pass, bounds memory; part of the arithmetic: 0 = blocks of :data:`AUTO_UNIT` on CPU,
    all clients on CUDA), ``channels_last`` (loop/batched convolutions; default on). ``precision``:
    ``fp32``, ``tf32`` or ``bf16`` (:mod:`sfg.sim.precision`)."""
    check_precision(precision)
    comp = name if isinstance(name, Component) else parse_component(name, kind="backend")
    check(not comp.modifiers, f"backend {comp.text!r} takes no '+' modifiers")
    params = BACKENDS.check_params(comp.name, comp.params)
    check(isinstance(model, nn.Module),
          f"make_backend needs an nn.Module, got {type(model).__name__}")
    if comp.name == "auto":
        backend = _CLASSES[auto_choice(model, device)](model, device=device, **params)
    else:
        backend = BACKENDS.entry(comp.name).factory(**params)(model, device)
    backend.precision = precision
    return backend
