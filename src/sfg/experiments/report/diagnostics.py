"""Tables and plots of the training diagnostics stored with runs (docs/concepts/diagnostics.md#training-diagnostics).

:func:`write_diagnostics` pools the per-bin sums and counts of every run that recorded
diagnostics over the seeds of each (dataset, process, rule) and writes into ``out_dir``:

* ``raw_law.csv`` / ``raw_law.png`` — distance to a live neighbour ÷ mean distance to the
  receiver's fresh neighbours, per neighbour age;
* ``lag_law.csv`` / ``lag_law.png`` — pair distance ÷ mean zero-difference pair distance, per
  age difference and per rounded lag difference; ``lag_rates.csv`` — the fitted rates ρ
  (``E d²/E d₀² = 1 + (ρ/2)·x`` over 1 ≤ x ≤ 20) against ages and lags and their ratio;
* ``finetune.csv`` / ``finetune.png`` — normalised distance before and after K local steps
  from each neighbour's model, and the fine-tuned validation loss, per neighbour age;
* ``returning.csv`` / ``returning.png`` — validation loss and accuracy of returning clients'
  models (stale, after aggregation, after training, five rounds later), their live
  neighbours' models, and the weight on their own model, per outage length D (the plot groups
  D into 1, 2, 3–4, 5–8, …).

Every plot is titled with what it shows and the datasets, processes and seeds of the runs it
pools (:func:`sfg.util.units.context_of`); each panel names its (dataset, process).

Only numpy, csv and matplotlib; no torch.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError

# the pure-numpy pieces of the diagnostics module (it imports torch only where models are read)
from sfg.sim.diagnostics import (
    FINETUNE_COLUMNS,
    RETURN_COLUMNS,
    binned_means,
    law_rates,
    pool,
)
from sfg.util.units import context_of, title

FILES = ("raw_law.csv", "lag_law.csv", "lag_rates.csv", "finetune.csv", "returning.csv",
         "raw_law.png", "lag_law.png", "finetune.png", "returning.png")
PLOT_MAX_DIFF = 20  # the fit range; beyond it the bins hold few pairs


def _groups(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[dict]]:
    out: dict[tuple[str, str, str], list[dict]] = {}
    for r in records:
        d = r.get("diagnostics")
        if isinstance(d, Mapping):
            out.setdefault((r["dataset"], r["process"], r["rule"]), []).append(dict(d))
    return out


def pooled(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """``{(dataset, process, rule): {"runs", "raw", "lag", "finetune", "returning"}}`` with the
    bins of every run of the group added up (kinds no run recorded are absent)."""
    out = {}
    for key, runs in sorted(_groups(records).items()):
        g: dict[str, Any] = {"runs": len(runs)}
        raws = [d["raw"] for d in runs if "raw" in d]
        if raws:
            g["raw"] = pool(raws)
        lags = [d["lag"] for d in runs if "lag" in d]
        if lags:
            block = {by: pool([b[by] for b in lags]) for by in ("age", "lag")}
            g["lag"] = {**block, **law_rates(block)}
        fts = [d["finetune"] for d in runs if "finetune" in d]
        if fts:
            g["finetune"] = pool([{c: b[c] for c in FINETUNE_COLUMNS} for b in fts])
            s = sum(b["own_loss"][0] for b in fts)
            n = sum(b["own_loss"][1] for b in fts)
            g["finetune_own_loss"] = s / n if n else math.nan
        rets = [d["returning"] for d in runs if "returning" in d]
        if rets:
            g["returning"] = pool([{c: b[c] for c in RETURN_COLUMNS} for b in rets])
        out[key] = g
    return out


def _write_csv(path: Path, header: Sequence[str], rows: list[list]) -> Path:
    try:
        with path.open("w", newline="") as handle:
            w = csv.writer(handle)
            w.writerow(header)
            w.writerows(rows)
    except OSError as exc:
        raise SfgError(f"cannot write {path}: {exc.strerror}; choose a writable out_dir") from None
    return path


def _tables(groups: Mapping[tuple[str, str, str], Mapping[str, Any]], out: Path
            ) -> dict[str, Path]:
    files: dict[str, Path] = {}
    raw, lag, rates, ft, ret = [], [], [], [], []
    for (dataset, process, rule), g in groups.items():
        head = [dataset, process, rule, g["runs"]]
        if "raw" in g:
            bins, means, counts = binned_means(g["raw"], "ratio")
            raw += [[*head, int(b), float(m), int(c)] for b, m, c in zip(bins, means, counts,
                                                                          strict=True)]
        if "lag" in g:
            for by in ("age", "lag"):
                bins, means, counts = binned_means(g["lag"][by], "ratio")
                lag += [[*head, by, int(b), float(m), int(c)]
                        for b, m, c in zip(bins, means, counts, strict=True)]
            rates.append([*head, g["lag"]["rho_age"], g["lag"]["rho_lag"],
                          g["lag"]["rho_ratio"]])
        if "finetune" in g:
            cols = {c: dict(zip(*binned_means(g["finetune"], c)[:2], strict=True))
                    for c in FINETUNE_COLUMNS}
            _, _, counts = binned_means(g["finetune"], "before")
            for b, c in zip(binned_means(g["finetune"], "before")[0], counts, strict=True):
                ft.append([*head, int(b), *(cols[k].get(b, math.nan) for k in FINETUNE_COLUMNS),
                           int(c), g["finetune_own_loss"]])
        if "returning" in g:
            cols = {c: dict(zip(*binned_means(g["returning"], c)[:2], strict=True))
                    for c in RETURN_COLUMNS}
            bins, _, counts = binned_means(g["returning"], "self_weight")
            for b, c in zip(bins, counts, strict=True):
                ret.append([*head, int(b), int(c),
                            *(cols[k].get(b, math.nan) for k in RETURN_COLUMNS)])
    base = ["dataset", "process", "rule", "runs"]
    kinds = {k for g in groups.values() for k in g}  # a recorded kind gets its table, even empty
    if "raw" in kinds:
        files["raw_law.csv"] = _write_csv(out / "raw_law.csv",
                                          [*base, "neighbour_age", "mean_ratio", "count"], raw)
    if "lag" in kinds:
        files["lag_law.csv"] = _write_csv(out / "lag_law.csv",
                                          [*base, "by", "difference", "mean_ratio", "count"], lag)
        files["lag_rates.csv"] = _write_csv(out / "lag_rates.csv",
                                            [*base, "rho_age", "rho_lag", "rho_lag_over_age"],
                                            rates)
    if "finetune" in kinds:
        files["finetune.csv"] = _write_csv(
            out / "finetune.csv", [*base, "neighbour_age", "distance_before", "distance_after",
                                   "val_loss", "val_acc", "count", "own_val_loss"], ft)
    if "returning" in kinds:
        files["returning.csv"] = _write_csv(out / "returning.csv",
                                            [*base, "outage_length", "count", *RETURN_COLUMNS],
                                            ret)
    return files


# ----------------------------------------------------------------------------- plots
def _panels(groups, kind: str) -> dict[tuple[str, str], dict[str, Mapping[str, Any]]]:
    out: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for (dataset, process, rule), g in groups.items():
        if kind in g:
            out.setdefault((dataset, process), {})[rule] = g
    return out


def _figure(n_panels: int, rows_per_panel: int = 1):
    from matplotlib.figure import Figure

    cols = min(3, n_panels) if rows_per_panel == 1 else rows_per_panel
    nrows = math.ceil(n_panels / cols) if rows_per_panel == 1 else n_panels
    return Figure(figsize=(4.8 * cols, 3.6 * nrows + 0.8)), nrows, cols


def _suptitle(fig, what: str, where: str) -> None:
    """The figure's title: what it shows, then the data (datasets, processes, seeds)."""
    fig.suptitle(title(what, where, width=int(12 * fig.get_figwidth())), fontsize=10)


def _save(fig, path: Path) -> Path:
    from sfg.experiments.report.figures import save_png

    return save_png(fig, path, tight=True)


def _plot_panels(groups, kind: str, path: Path, draw, *, xlabel: str, ylabel: str,
                 title: str, what: str, where: str) -> Path | None:
    """One panel per (dataset, process) holding ``kind`` diagnostics: ``draw(ax, colour,
    rule, g)`` plots each rule's lines; None when nothing holds them. The figure is titled
    ``what`` over ``where``."""
    panels = _panels(groups, kind)
    if not panels:
        return None
    fig, nrows, cols = _figure(len(panels))
    for k, ((dataset, process), rules) in enumerate(sorted(panels.items())):
        ax = fig.add_subplot(nrows, cols, k + 1)
        for j, (rule, g) in enumerate(sorted(rules.items())):
            draw(ax, f"C{j}", rule, g)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} · {dataset} · {process}", fontsize=9)
        ax.legend(fontsize=6)
    _suptitle(fig, what, where)
    return _save(fig, path)


def _plot_lag(groups, path: Path, where: str) -> Path | None:
    def draw(ax, color, rule, g):
        for by, style in (("lag", "-"), ("age", "--")):
            bins, means, _ = binned_means(g["lag"][by], "ratio")
            keep = bins <= PLOT_MAX_DIFF
            rho = g["lag"][f"rho_{by}"]
            ax.plot(bins[keep], means[keep], style, marker="o" if by == "lag" else None,
                    ms=3, color=color, label=f"{rule}, by {by} (ρ={rho:.3g})")

    return _plot_panels(groups, "lag", path, draw,
                        xlabel="|difference| (rounds): lag solid, age dashed",
                        ylabel="E d² / E d₀²", title="lag law",
                        what="Lag law: E d²/E d₀² of live model pairs by difference in "
                             "effective lag and in age, pooled over seeds", where=where)


def _plot_binned(groups, kind: str, columns: Sequence[tuple[str, str]], path: Path, *,
                 xlabel: str, ylabel: str, title: str, what: str, where: str) -> Path | None:
    def draw(ax, color, rule, g):
        for (col, style) in columns:
            bins, means, _ = binned_means(g[kind], col)
            keep = bins <= PLOT_MAX_DIFF
            ax.plot(bins[keep], means[keep], style, ms=3, color=color,
                    label=f"{rule} {col}" if len(columns) > 1 else rule)

    return _plot_panels(groups, kind, path, draw, xlabel=xlabel, ylabel=ylabel, title=title,
                        what=what, where=where)


D_GROUPS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 10**9))


def _grouped_returning(block: Mapping[str, Any], column: str) -> np.ndarray:
    """Means of ``column`` over the outage-length groups :data:`D_GROUPS` (NaN when empty)."""
    s = np.asarray(block[column]["sum"], np.float64)
    c = np.asarray(block[column]["count"], np.int64)
    out = np.full(len(D_GROUPS), np.nan)
    for k, (lo, hi) in enumerate(D_GROUPS):
        n = c[lo:hi + 1].sum()
        if n:
            out[k] = s[lo:hi + 1].sum() / n
    return out


def _plot_returning(groups, path: Path, where: str) -> Path | None:
    panels = _panels(groups, "returning")
    if not panels:
        return None
    fig, nrows, cols = _figure(len(panels), rows_per_panel=3)
    labels = [f"{lo}" if lo == hi else (f"{lo}+" if hi > 1000 else f"{lo}–{hi}")
              for lo, hi in D_GROUPS]
    x = np.arange(len(D_GROUPS))
    for k, ((dataset, process), rules) in enumerate(sorted(panels.items())):
        axes = [fig.add_subplot(nrows, cols, 3 * k + m + 1) for m in range(3)]
        for j, (rule, g) in enumerate(sorted(rules.items())):
            blk, color = g["returning"], f"C{j}"
            axes[0].plot(x, _grouped_returning(blk, "loss_stale"), ":", color=color)
            axes[0].plot(x, _grouped_returning(blk, "loss_agg"), "o-", ms=3, color=color,
                         label=f"{rule}")
            axes[0].plot(x, _grouped_returning(blk, "loss_neighbours"), "--", color=color)
            axes[1].plot(x, _grouped_returning(blk, "loss_trained"), "o-", ms=3, color=color,
                         label=f"{rule} after its round")
            axes[1].plot(x, _grouped_returning(blk, "loss_later"), "s--", ms=3, color=color,
                         label=f"{rule} 5 rounds later")
            axes[2].plot(x, _grouped_returning(blk, "self_weight"), "o-", ms=3, color=color,
                         label=rule)
        titles = ("after aggregation (dotted: stale model, dashed: neighbours)",
                  "after training / five rounds later", "weight on its own model")
        for ax, t, yl in zip(axes, titles, ("validation loss", "validation loss", "weight"),
                             strict=True):
            ax.set_xticks(x, labels)
            ax.set_xlabel("outage length D (rounds)")
            ax.set_ylabel(yl)
            ax.set_title(f"{t}\n{dataset} · {process}", fontsize=8)
            ax.legend(fontsize=6)
    _suptitle(fig, "Returning clients by outage length D: validation loss of their "
              "models and the weight on their own model, pooled over seeds", where)
    return _save(fig, path)


def write_diagnostics(records: Sequence[Mapping[str, Any]], out_dir: str | Path
                      ) -> dict[str, Path]:
    """Write the diagnostics tables and plots of ``records`` into ``out_dir``; returns
    ``{file name: path}`` (empty, and nothing created, when no run recorded diagnostics)."""
    groups = pooled(records)
    if not groups:
        return {}
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SfgError(f"cannot create {out}: {exc.strerror}; choose a writable out_dir") from None
    files = _tables(groups, out)

    def where(kind: str) -> str:  # the runs a plot of ``kind`` pools
        return context_of(r for r in records if isinstance(r.get("diagnostics"), Mapping)
                          and kind in r["diagnostics"])

    plots = {
        "raw_law.png": lambda p: _plot_binned(
            groups, "raw", [("ratio", "o-")], p, xlabel="neighbour age τ_j",
            ylabel="d(i, j) / mean fresh d", title="raw staleness law",
            what="Raw staleness law: distance to a live neighbour ÷ mean fresh distance, by "
                 "neighbour age, pooled over seeds", where=where("raw")),
        "lag_law.png": lambda p: _plot_lag(groups, p, where("lag")),
        "finetune.png": lambda p: _plot_binned(
            groups, "finetune", [("before", "o--"), ("after", "s-")], p,
            xlabel="neighbour age τ_j", ylabel="distance / mean fresh distance",
            title="fine-tuned geometry",
            what="Fine-tuned geometry: normalised distance before and after K local steps "
                 "from each neighbour's model, by neighbour age, pooled over seeds",
            where=where("finetune")),
        "returning.png": lambda p: _plot_returning(groups, p, where("returning")),
    }
    for name, fn in plots.items():
        written = fn(out / name)
        if written is not None:
            files[name] = written
    return files
