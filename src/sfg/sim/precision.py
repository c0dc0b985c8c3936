"""Arithmetic precision of the local training (``precision``: fp32, tf32 or bf16).

* ``fp32`` (the default): float32 throughout. On CUDA it is enforced: TF32 is switched off
  for matrix products and convolutions (torch's own default lets cuDNN convolutions use TF32).
  On CPU nothing is touched, so results are bit for bit those of a run without the setting.
* ``tf32``: on CUDA, matrix products and cuDNN convolutions of float32 tensors may use
  TensorFloat-32 (10-bit mantissa inputs, float32 accumulation; Ampere and later). On CPU it
  is a no-op: the run is the fp32 run, bit for bit (tested).
* ``bf16``: the local training's forward and backward passes run under
  ``torch.autocast(device_type, dtype=torch.bfloat16)`` (CPU and CUDA); parameters, momentum
  buffers, SGD steps, gossip and evaluation stay float32.

Imported by the run schema (:mod:`sfg.experiments.config`), so torch is imported only when a
scope is entered.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, get_args

from sfg.errors import check

Precision = Literal["fp32", "tf32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def check_precision(value: Any) -> str:
    """``value`` if it is one of :data:`PRECISIONS`, else a one-line :class:`SfgError`."""
    check(isinstance(value, str) and value in PRECISIONS,
          f"precision must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


def _tf32_flags() -> list[tuple[Any, str, Any]]:
    """``(object, attribute, (off, on))`` for each of torch's TF32 switches:
    the ``fp32_precision`` settings where torch has them (2.9 and later), else the legacy
    ``allow_tf32`` ones (never both: torch refuses a mix of the two APIs)."""
    import torch

    conv = getattr(torch.backends.cudnn, "conv", None)
    if hasattr(torch.backends.cuda.matmul, "fp32_precision") and conv is not None:
        return [(torch.backends.cuda.matmul, "fp32_precision", ("ieee", "tf32")),
                (conv, "fp32_precision", ("ieee", "tf32"))]
    return [(torch.backends.cuda.matmul, "allow_tf32", (False, True)),
            (torch.backends.cudnn, "allow_tf32", (False, True))]


@contextmanager
def device_precision(precision: str, device: Any) -> Iterator[None]:
    """Within the block, CUDA's float32 matrix products and convolutions use TF32 exactly when
    ``precision == "tf32"`` (restored afterwards). A no-op on other devices. Process-wide
    switches: the block is entered by the thread that drives the device."""
    import torch

    if torch.device(device).type != "cuda":
        yield
        return
    flags = _tf32_flags()
    before = [getattr(obj, attr) for obj, attr, _ in flags]
    try:
        for obj, attr, (off, on) in flags:
            setattr(obj, attr, on if precision == "tf32" else off)
        yield
    finally:
        for (obj, attr, _), old in zip(flags, before, strict=True):
            setattr(obj, attr, old)


def autocast_scope(precision: str, device: Any):
    """The context the local training's forward and backward run in: bf16 autocast for
    ``precision == "bf16"``, else a null context. Autocast is thread-local: every worker
    thread enters its own."""
    import contextlib

    import torch

    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
