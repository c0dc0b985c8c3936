"""Centralised pre-training of a backbone (docs/concepts/training.md#the-training-protocol: ResNet-18-GN from a pretrained backbone).

``sfg pretrain --dataset cifar100 --model resnet18-gn --data-root DIR --out backbone.safetensors``
trains one model on a dataset's whole training split and writes its parameters as safetensors;
``sfg run --model resnet18-gn --backbone-from backbone.safetensors`` then starts every client
from that body with a freshly (seeded) initialised classifier head
(:func:`sfg.world.models.load_backbone`), so the head may have another number of classes.

Recipe (defaults): SGD with Nesterov momentum 0.9, weight decay 5e-4, batch 256, a one-cycle
learning-rate schedule (linear warm-up over the first 30 % of the steps from peak/25 to the
peak 0.1, then cosine annealing to peak/10⁴; stepped per minibatch), random 32×32 crops of
the 4-pixel zero-padded image (for images of any size: crops of the original size) and
horizontal flips, 40 epochs. Images are standardised with the training split's per-channel
statistics, as in the federated runs.

Randomness: the initial model from ``torch_seed(seed, "pretrain-init")``; the shuffle,
crops and flips of epoch e from ``stream(seed, "pretrain", e)``, so a resumed run draws
exactly what an uninterrupted one would.

Resuming: after every epoch the model, the momentum buffers and the epoch count are written to
``<out>.ckpt.safetensors`` (a temporary file renamed into place, so a kill never leaves a torn
checkpoint). Running the same command again continues after the last finished epoch; a
checkpoint written with other settings is refused with the fix. When all epochs are done the
backbone is written (atomically) and the checkpoint removed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sfg.errors import SfgError, check
from sfg.util.atomic import write_bytes
from sfg.util.components import parse_component
from sfg.util.rng import stream, torch_seed

PCT_START = 0.3
DIV_FACTOR = 25.0
FINAL_DIV = 1e4
PAD = 4


def one_cycle_lr(step: int, total: int, peak: float) -> float:
    """The one-cycle learning rate at ``step`` of ``total`` (module docstring)."""
    warm = max(1, int(PCT_START * total))
    start, end = peak / DIV_FACTOR, peak / (DIV_FACTOR * FINAL_DIV)
    if step < warm:
        return start + (peak - start) * step / warm
    frac = (step - warm) / max(1, total - warm)
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))


def training_pool(dataset: str, data_root: str | None, *, seed: int):
    """The pooled training split of ``dataset`` (cifar10, cifar100, imagefolder, digits)."""
    comp = parse_component(dataset, kind="dataset")
    opts = dict(comp.params)
    if comp.name in ("cifar10", "cifar100"):
        from sfg.world.data.cifar import cifar_pool

        return cifar_pool(data_root, int(comp.name[5:]), **opts)
    if comp.name == "imagefolder":
        from sfg.world.data.imagefolder import (
            folder_options,
            image_folder_pool,
            locate_image_folder,
        )

        fo = folder_options(opts.pop("limit_per_class", None), opts.pop("workers", None),
                            opts.pop("grayscale", False), opts.pop("resize", None))
        check(not opts, f"pretrain: imagefolder takes no option {sorted(opts)[:1]}")
        return image_folder_pool(locate_image_folder(data_root), **fo)
    if comp.name == "digits":
        from sfg.world.data.digits import digits_pool

        return digits_pool(seed)
    raise SfgError(f"pretrain supports cifar10, cifar100, imagefolder and digits, not "
                   f"{comp.name!r}")


def augment(x: torch.Tensor, g: np.random.Generator, *, crop: bool, flip: bool) -> torch.Tensor:
    """Random crops of the ``PAD``-padded images (same size) and horizontal flips, vectorised.

    ``x``: [B, C, H, W]; offsets and flips come from ``g``.
    """
    B, _, H, W = x.shape
    if crop:
        xp = torch.nn.functional.pad(x, (PAD, PAD, PAD, PAD))
        oy = torch.from_numpy(g.integers(0, 2 * PAD + 1, B))
        ox = torch.from_numpy(g.integers(0, 2 * PAD + 1, B))
        rows = (oy[:, None] + torch.arange(H)[None, :])[:, :, None]  # [B, H, 1]
        cols = (ox[:, None] + torch.arange(W)[None, :])[:, None, :]  # [B, 1, W]
        x = xp[torch.arange(B)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)
    if flip:
        from sfg.world.data.base import hflip

        x = hflip(x, g.random(B) < 0.5)
    return x


def _atomic_save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """The tensors as safetensors with ``metadata``, written atomically
    (:func:`sfg.util.atomic.write_bytes`)."""
    from safetensors.torch import save

    write_bytes(path, save({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                           metadata=metadata))


def checkpoint_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".ckpt.safetensors")


def pretrain(*, dataset: str, model: str = "resnet18-gn", data_root: str | None = None,
             out: str | Path, epochs: int = 40, batch_size: int = 256, lr: float = 0.1,
             momentum: float = 0.9, weight_decay: float = 5e-4, seed: int = 0,
             device: str = "cpu", max_epochs_now: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Pre-train ``model`` on ``dataset`` and write the backbone to ``out`` (module docstring).

    ``max_epochs_now`` stops after that many epochs of this call (the checkpoint stays; calling
    again resumes). Returns a summary: epochs done, final training loss, whether it resumed,
    ``out`` (None while unfinished), seconds.
    """
    from safetensors import safe_open

    from sfg.world.data.base import ClientImages
    from sfg.world.models import make_model

    check(isinstance(epochs, int) and epochs >= 1, f"epochs must be >= 1, got {epochs!r}")
    check(isinstance(batch_size, int) and batch_size >= 1,
          f"batch size must be >= 1, got {batch_size!r}")
    check(lr > 0 and 0 <= momentum < 1 and weight_decay >= 0,
          "need lr > 0, momentum in [0, 1) and weight decay >= 0")
    out = Path(out)
    check(out.suffix == ".safetensors", f"--out {str(out)!r} must end in .safetensors")
    check(out.parent.is_dir() or not out.parent.exists(),
          f"--out {str(out)!r}: {out.parent} is not a folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pool = training_pool(dataset, data_root, seed=seed)
    image = pool.train_x.ndim == 4
    n = int(pool.train_y.size)
    # the images as stored, normalised per batch (the floats of normalising them all first)
    x_all = ClientImages(pool.train_x, np.arange(n), np.array([n]), scale=pool.scale,
                         mean=pool.mean, std=pool.std)
    y_all = torch.from_numpy(pool.train_y.astype(np.int64))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(seed, "pretrain-init"))
        net = make_model(model, input_shape=pool.input_shape, num_classes=pool.num_classes)
    dev = torch.device(device)
    net.to(dev)
    settings = {"dataset": dataset, "model": model, "epochs": epochs, "batch_size": batch_size,
                "lr": lr, "momentum": momentum, "weight_decay": weight_decay, "seed": seed,
                "train_examples": n, "num_classes": pool.num_classes}
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, nesterov=momentum > 0,
                          weight_decay=weight_decay)
    steps_per_epoch = math.ceil(n / batch_size)
    total = epochs * steps_per_epoch
    ckpt = checkpoint_path(out)
    start_epoch, resumed = 0, False
    if ckpt.exists():
        try:
            with safe_open(str(ckpt), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        except Exception as exc:  # noqa: BLE001 - a damaged file is bad input
            raise SfgError(f"cannot read checkpoint {ckpt}: {exc}; delete it to start over") \
                from None
        saved = json.loads(meta.get("settings", "{}"))
        if saved != settings:
            diff = sorted(k for k in settings if saved.get(k) != settings[k])
            raise SfgError(f"checkpoint {ckpt} was written with other settings ({', '.join(diff)}"
                           "); use the same settings to resume, or delete it to start over")
        params = dict(net.named_parameters())
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[f"model.{name}"])
                if f"momentum.{name}" in tensors:
                    opt.state[p]["momentum_buffer"] = tensors[f"momentum.{name}"].to(dev).clone()
        start_epoch, resumed = int(meta["epoch"]), True
    last_loss = math.nan
    stop = epochs if max_epochs_now is None else min(epochs, start_epoch + max_epochs_now)
    crop = image and pool.input_shape[-1] > 1
    for epoch in range(start_epoch, stop):
        g = stream(seed, "pretrain", epoch)
        order = torch.from_numpy(g.permutation(n))
        net.train()
        total_loss, seen = 0.0, 0
        for k in range(steps_per_epoch):
            step = epoch * steps_per_epoch + k
            for group in opt.param_groups:
                group["lr"] = one_cycle_lr(step, total, lr)
            idx = order[k * batch_size:(k + 1) * batch_size]
            xb = x_all.take(idx)
            if image:
                xb = augment(xb, g, crop=crop, flip=True)
            xb, yb = xb.to(dev), y_all[idx].to(dev)
            loss = torch.nn.functional.cross_entropy(net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += float(loss.detach()) * len(idx)
            seen += len(idx)
            if progress is not None:
                progress(step + 1, total)
        last_loss = total_loss / max(seen, 1)
        tensors = {f"model.{name}": p for name, p in net.named_parameters()}
        for name, p in net.named_parameters():
            buf = opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                tensors[f"momentum.{name}"] = buf
        _atomic_save(tensors, ckpt, {"epoch": str(epoch + 1), "settings": json.dumps(settings),
                                     "loss": repr(last_loss)})
    done = stop >= epochs
    if done:
        _atomic_save(dict(net.named_parameters()), out, {
            "format": "sfg-backbone", "model": model, "dataset": dataset,
            "num_classes": str(pool.num_classes), "epochs": str(epochs),
            "head_names": json.dumps(list(getattr(net, "head_names", ())))})
        ckpt.unlink(missing_ok=True)
    return {"epochs_done": stop, "epochs": epochs, "loss": last_loss, "resumed": resumed,
            "start_epoch": start_epoch, "out": str(out) if done else None,
            "checkpoint": None if done else str(ckpt), "seconds": time.perf_counter() - t0}
