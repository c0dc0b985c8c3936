"""The reports' one PNG writer (every plot of :mod:`sfg.experiments.report` goes through it)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sfg.errors import SfgError


def save_png(fig: Figure, path: Path, *, tight: bool = False) -> Path:
    """Write ``fig`` as a PNG (``tight``: lay it out first); an unwritable path is one error line."""
    FigureCanvasAgg(fig)
    if tight:
        fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=110)
    except OSError as exc:
        raise SfgError(f"cannot write plot {path}: {exc.strerror}; choose a writable "
                       "out_dir") from None
    return path
