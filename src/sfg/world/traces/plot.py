"""PNG plots of an availability trace (matplotlib's Agg canvas; no pyplot global state).

* ``availability_by_hour.png`` -- mean availability by local hour of day (round start hour)
* ``outage_lengths.png`` -- outage lengths (rounds; see :mod:`.stats`): log-binned histogram
  and complementary CDF
* ``device_availability.png`` -- per-device availability, sorted
* ``availability_raster.png`` -- the device x round matrix (devices sorted by availability)

Each plot is titled with what it shows and the trace it shows it for (source, file, rule or
variant, devices, rounds and round length, from ``trace.meta``): a measured trace has no seeds.
"""

from __future__ import annotations

from pathlib import Path, PurePath

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sfg.errors import SfgError
from sfg.util.units import title as wrapped
from sfg.world.traces.base import Trace
from sfg.world.traces.stats import outage_runs


def _title(trace: Trace) -> str:
    """"flash trace (file.json), rule strict: 29 devices, 300 rounds x 10 min"."""
    src = trace.meta.get("source", "trace")
    path = trace.meta.get("path")
    extra = trace.meta.get("rule") or trace.meta.get("variant") or ""
    kind = "rule" if trace.meta.get("rule") else "variant"
    return (f"{src} trace{f' ({PurePath(str(path)).name})' if path else ''}"
            f"{f', {kind} {extra}' if extra else ''}: {trace.n_devices} devices, "
            f"{trace.rounds} rounds x {trace.round_minutes:g} min")


def _head(fig: Figure, what: str, trace_title: str) -> str:
    """What a plot shows over the trace it shows it for, wrapped to the figure's width."""
    return wrapped(what, trace_title, width=int(12 * fig.get_figwidth()))


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def availability_by_hour(trace: Trace) -> np.ndarray:
    """float64[24]: mean availability of the rounds starting in each local hour (NaN if none)."""
    hours = trace.hour_of_day().reshape(-1)
    a = trace.available.reshape(-1).astype(np.float64)
    n = np.bincount(hours, minlength=24).astype(np.float64)
    s = np.bincount(hours, weights=a, minlength=24)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)


def plot_trace(trace: Trace, out_dir: str | Path) -> list[Path]:
    """Write the four PNGs of this module into ``out_dir`` (created); returns their paths."""
    if trace.n_devices == 0 or trace.rounds == 0:
        raise SfgError("the trace has no eligible device or no round; nothing to plot")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SfgError(f"cannot create plot folder {out}: {e.strerror}") from None
    title = _title(trace)
    paths = []

    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    ax.bar(np.arange(24), availability_by_hour(trace), color="tab:blue")
    ax.set_xlabel("local hour of day")
    ax.set_ylabel("mean availability")
    ax.set_xticks(range(0, 24, 3))
    ax.set_ylim(0, 1)
    ax.set_title(_head(fig, "Mean availability by local hour of day", title), fontsize=9)
    paths.append(_save(fig, out / "availability_by_hour.png"))

    lengths, _ = outage_runs(trace.available)
    fig = Figure(figsize=(9, 3.5))
    ax, ax2 = fig.subplots(1, 2)
    if lengths.size:
        top = int(lengths.max())
        edges = np.unique(np.round(np.geomspace(1, top + 1, 25))) - 0.5
        edges = np.append(edges, top + 0.5) if edges[-1] < top + 0.5 else edges
        counts, _ = np.histogram(lengths, bins=edges)
        ax.bar(edges[:-1], counts / np.diff(edges), width=np.diff(edges), align="edge",
               color="tab:red")
        ax.set_xscale("log")
        ax.set_yscale("log")
        x = np.sort(lengths)
        u = np.unique(x)
        ax2.step(u, 1.0 - np.searchsorted(x, u, side="left") / x.size, where="post",
                 color="tab:red")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
    ax.set_xlabel(f"outage length (rounds of {trace.round_minutes:g} min)")
    ax.set_ylabel("outages per unit length")
    ax2.set_xlabel("outage length L (rounds)")
    ax2.set_ylabel("share of outages >= L")
    fig.suptitle(_head(fig, f"Outage lengths: histogram and complementary CDF; {lengths.size} "
                       f"outages, mean {lengths.mean() if lengths.size else 0:.1f} rounds",
                       title), fontsize=9)
    paths.append(_save(fig, out / "outage_lengths.png"))

    per_dev = np.sort(trace.device_availability())[::-1]
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    ax.plot(np.arange(1, len(per_dev) + 1), per_dev, drawstyle="steps-mid", color="tab:green")
    ax.axhline(per_dev.mean(), color="gray", lw=0.8, ls="--", label=f"mean {per_dev.mean():.3f}")
    ax.set_xlabel("device (sorted)")
    ax.set_ylabel("availability")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title(_head(fig, "Availability per device, sorted", title), fontsize=9)
    paths.append(_save(fig, out / "device_availability.png"))

    order = np.argsort(-trace.device_availability(), kind="stable")
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.imshow(trace.available[:, order].T, aspect="auto", interpolation="nearest",
              cmap="Greys_r", vmin=0, vmax=1)
    ax.set_xlabel("round")
    ax.set_ylabel("device (sorted by availability)")
    ax.set_title(_head(fig, "Availability of each device by round (white = available)", title),
                 fontsize=9)
    paths.append(_save(fig, out / "availability_raster.png"))
    return paths
