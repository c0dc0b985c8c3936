"""Plots of replay results: every curve metric of :mod:`sfg.modelfree.metrics` over rounds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.modelfree.metrics import curves
from sfg.util.units import context, title


def plot_path(path: str | Path, default_name: str) -> Path:
    """Where a plot asked for as ``path`` goes: into an existing folder as ``default_name``;
    a name without a suffix gets ``.png``; an image format matplotlib cannot write is bad
    input (one line, before anything is drawn)."""
    path = Path(path)
    if path.is_dir():
        return path / default_name
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if path.suffix.lower().lstrip(".") not in ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg",
                                               "jpeg", "tif", "tiff", "webp"):
        raise SfgError(f"cannot write plot {path}: unknown image format {path.suffix!r}; "
                       "use .png, .pdf or .svg")
    return path


def plot_staleness(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """PNG of each curve metric (mean age, mean effective lag, …) over rounds, one line per
    rule (mean over seeds), one column per process. ``rows`` from :func:`sfg.modelfree.replay`
    with ``with_curves=True``. The figure is titled with the metrics, the processes, seeds and
    rounds of ``rows`` (and their attacks, when rows carry one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = curves()
    processes = list(dict.fromkeys(r["process"] for r in rows))
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    fig, axes = plt.subplots(len(shown), len(processes),
                             figsize=(5 * len(processes), 3.25 * len(shown)), squeeze=False,
                             sharex=True)
    for j, proc in enumerate(processes):
        for rule in rules:
            sel = [r["curves"] for r in rows if r["process"] == proc and r["rule"] == rule]
            if not sel:
                continue
            for i, m in enumerate(shown):
                y = np.mean([c[m.name] for c in sel], axis=0)
                axes[i, j].plot(sel[0]["round"], y, label=rule, lw=1.2)
        axes[0, j].set_title(proc)
        for i, m in enumerate(shown):
            axes[i, j].set_ylabel(m.label or m.name)
        axes[-1, j].set_xlabel("round")
    axes[0, 0].legend(fontsize=8)
    attacks = list(dict.fromkeys(str(r["attack"]) for r in rows if "attack" in r))
    rounds = sorted({len(r["curves"]["round"]) for r in rows})
    where = context(processes=processes, seeds=[int(r["seed"]) for r in rows if "seed" in r],
                    extra=[f"T = {'/'.join(map(str, rounds))} rounds",
                           *(["attacks " + ", ".join(attacks)] if attacks else [])])
    what = ("Model-free replay (no dataset): " + " and ".join(m.label or m.name for m in shown)
            + " over rounds, mean over seeds")
    fig.suptitle(title(what, where, width=int(12 * fig.get_figwidth())), fontsize=10)
    fig.tight_layout()
    path = plot_path(path, "staleness.png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise SfgError(f"cannot write plot {path}: {e.strerror}; choose a writable path") from None
    finally:
        plt.close(fig)
    return path
