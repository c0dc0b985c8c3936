"""``sfg pretrain``: centralised pre-training of a backbone (:mod:`sfg.sim.pretrain`)."""

from __future__ import annotations

from pathlib import Path

import typer

from sfg.cli import console
from sfg.cli.options import opt


def register(app: typer.Typer) -> None:
    """Add ``pretrain`` to the ``sfg`` app."""
    app.command("pretrain")(pretrain_cmd)


def pretrain_cmd(
    dataset: str = typer.Option("cifar100", help="cifar100, cifar10, imagefolder or digits"),
    model: str = typer.Option("resnet18-gn", help="Model to pre-train (its head is replaced later)"),
    data_root: str | None = opt("data_root"),
    out: Path = typer.Option(Path("backbone.safetensors"), "--out", "-o", help="Backbone file to write (.safetensors)"),
    epochs: int = typer.Option(40, help="Epochs (one-cycle schedule over all of them)"),
    batch_size: int = opt("batch_size", 256),
    lr: float = typer.Option(0.1, help="Peak learning rate of the one-cycle schedule"),
    momentum: float = typer.Option(0.9, help="Nesterov momentum"),
    weight_decay: float = opt("weight_decay", 5e-4),
    seed: int = opt("seed", 0),
    device: str = typer.Option("cpu", help="cpu or cuda"),
) -> None:
    """Pre-train a backbone on a whole training split; rerun the same command to resume."""
    from sfg.util.extras import require

    require("sfg pretrain", "torch", "safetensors")
    from sfg.sim.pretrain import pretrain

    with console.progress("pre-training") as update:
        res = pretrain(dataset=dataset, model=model, data_root=data_root, out=out,
                       epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                       weight_decay=weight_decay, seed=seed, device=device, progress=update)
    if res["resumed"]:
        console.echo(f"resumed after epoch {res['start_epoch']}")
    console.echo(f"wrote {res['out']}: {res['epochs']} epochs, last epoch's training loss "
                 f"{res['loss']:.4f}, {res['seconds']:.1f} s")
