"""Training diagnostics: why self-inclusive, lag-based, steep discounting works (docs/concepts/diagnostics.md#training-diagnostics).

A :class:`Diagnostics` object is handed every round of a training run (after local training,
before the staleness update) with the models at the start of the round ``X``, after
aggregation ``X_agg`` and after training ``X_next``, the rule's weights, the candidate sets and
the staleness state at the start of the round. It records

* ``raw`` — raw staleness law (every 5 rounds): for every aggregating receiver of age 0 with
  at least one live age-0 neighbour, ``d(i, j) / mean_{fresh j'} d(i, j')`` for each live
  neighbour j, binned by the neighbour's age (receivers whose fresh mean is 0 are skipped);
* ``lag`` — lag law (every 5 rounds): over all live pairs (both ends available, link live,
  each unordered pair once) the squared distance divided by the mean over the round's pairs
  with no difference, binned by ``|τ_i − τ_j|`` and, separately, by ``round(|ℓ_i − ℓ_j|)``
  ("no difference" for lags: the rounded difference is 0). :func:`fit_rate` fits
  ``E d² / E d₀² = 1 + (ρ/2)·x`` over bins 1 ≤ x ≤ 20;
* ``finetune`` — fine-tuned geometry (every 10 rounds): up to 16 aggregating receivers of age 0
  with a live age-0 neighbour and a live neighbour of age ≥ 1 (chosen from the stream
  ``("diagnostics", "finetune", t)``) run K local steps from their own model and from each live
  neighbour's model on one common minibatch sequence of the receiver's data (stream
  ``diagnostics-finetune-<i>``), with the run's lr, weight decay and momentum; recorded per
  neighbour age: the distance to the receiver's model before and after, each divided by the
  mean over the fresh (age-0) neighbours, and the validation loss and accuracy of the
  fine-tuned neighbour model on the receiver's validation split; the receiver's own
  fine-tuned loss separately;
* ``returning`` — returning clients (every round): a client available at t and unavailable at
  t − 1, binned by D = its age at return: validation loss and accuracy of its stale model, its
  post-aggregation model, its model after this round's training and after round t + 5 (when
  the run lasts), the mean over its live neighbours' models, and the weight its rule gave its
  own model.

Distances are squared Euclidean distances between full parameter vectors. Everything is
stored as per-bin sums and counts (:class:`Binned`), so runs of several seeds pool by
addition. What is computed from the measured pairs and models — the normalisations
(:func:`normalised`), the bins, the fine-tuning, the returning clients' losses — is
:class:`Recorder`'s, shared with the virtual clock's async and event protocols
(:mod:`sfg.clock.diagnostics`, where a round is one staleness unit). Diagnostics only read
the models and draw from their own streams: training with them is bit-identical to training
without them (docs/concepts/diagnostics.md#training-diagnostics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where models are read, so reports start fast
    import torch

import numpy as np
from numpy.typing import ArrayLike

from sfg.errors import SfgError, check
from sfg.util.components import did_you_mean
from sfg.util.rng import stream

KINDS = ("raw", "lag", "finetune", "returning")
LAW_EVERY = 5
FINETUNE_EVERY = 10
FINETUNE_RECEIVERS = 16
LATER = 5
FIT_RANGE = (1, 20)
RETURN_COLUMNS = ("loss_stale", "acc_stale", "loss_agg", "acc_agg", "loss_trained",
                  "acc_trained", "loss_later", "acc_later", "loss_neighbours",
                  "acc_neighbours", "self_weight")
FINETUNE_COLUMNS = ("before", "after", "loss", "acc")


def parse_diagnostics(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"raw,lag"`` / ``"all"`` / ``""`` -> the diagnostics to record, in :data:`KINDS` order."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    names = {str(x).strip().lower() for x in items if str(x).strip()}
    if "all" in names:
        return KINDS
    for name in names:
        if name not in KINDS:
            raise SfgError(f"unknown diagnostic {name!r}{did_you_mean(name, KINDS)} "
                           "(write e.g. raw,lag,finetune,returning or all)")
    return tuple(k for k in KINDS if k in names)


# ----------------------------------------------------------------------------- accumulators
class Binned:
    """Per-bin sums and counts of named columns over non-negative integer bins."""

    def __init__(self, columns: Iterable[str]):
        self.columns = tuple(columns)
        self.sums = {c: np.zeros(0) for c in self.columns}
        self.counts = {c: np.zeros(0, np.int64) for c in self.columns}

    def add(self, column: str, bins, values, counts=None) -> None:
        """Add ``values`` [P] to their ``bins`` [P], one count each; with ``counts`` [P] the
        values are sums of that many measurements each (pooled blocks, :func:`lag_law`)."""
        bins = np.asarray(bins, np.int64).reshape(-1)
        values = np.asarray(values, np.float64).reshape(-1)
        ok = np.isfinite(values)
        bins, values = bins[ok], values[ok]
        if bins.size == 0:
            return
        n = max(int(bins.max()) + 1, self.sums[column].size)
        s = np.zeros(n)
        s[:self.sums[column].size] = self.sums[column]
        c = np.zeros(n, np.int64)
        c[:self.counts[column].size] = self.counts[column]
        s += np.bincount(bins, weights=values, minlength=n)
        if counts is None:
            c += np.bincount(bins, minlength=n)
        else:
            k = np.asarray(counts, np.int64).reshape(-1)[ok]
            c += np.bincount(bins, weights=k, minlength=n).astype(np.int64)
        self.sums[column], self.counts[column] = s, c

    def to_json(self) -> dict[str, dict[str, list]]:
        return {c: {"sum": self.sums[c].tolist(), "count": self.counts[c].tolist()}
                for c in self.columns}


def binned_means(block: Mapping[str, Any], column: str) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """``(bins, means, counts)`` of ``column`` of a stored :class:`Binned` (bins with data)."""
    s = np.asarray(block[column]["sum"], np.float64)
    c = np.asarray(block[column]["count"], np.int64)
    keep = np.flatnonzero(c > 0)
    return keep, s[keep] / c[keep], c[keep]


def pool(blocks: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list]]:
    """Add stored :class:`Binned` blocks (of several runs) bin by bin."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for block in blocks:
        for col, v in block.items():
            s, c = np.asarray(v["sum"], np.float64), np.asarray(v["count"], np.int64)
            acc = out.setdefault(col, {"sum": np.zeros(0), "count": np.zeros(0, np.int64)})
            n = max(s.size, acc["sum"].size)
            acc["sum"] = np.pad(acc["sum"], (0, n - acc["sum"].size)) + np.pad(s, (0, n - s.size))
            acc["count"] = (np.pad(acc["count"], (0, n - acc["count"].size))
                            + np.pad(c, (0, n - c.size)))
    return {col: {"sum": v["sum"].tolist(), "count": v["count"].tolist()}
            for col, v in out.items()}


def fit_rate(x, y, *, lo: int = FIT_RANGE[0], hi: int = FIT_RANGE[1]) -> float:
    """Least-squares ρ in ``y = 1 + (ρ/2)·x`` over the points with lo ≤ x ≤ hi (docs/concepts/diagnostics.md#distance-laws):
    ``ρ = 2 Σ x (y − 1) / Σ x²``; NaN without such points."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    m = (x >= lo) & (x <= hi) & np.isfinite(y)
    if not m.any():
        return float("nan")
    return float(2.0 * np.sum(x[m] * (y[m] - 1.0)) / np.sum(x[m] ** 2))


def law_rates(lag_block: Mapping[str, Any]) -> dict[str, float]:
    """ρ against ages and lags of a stored lag-law block, and their ratio (lag ÷ age)."""
    out = {}
    for by in ("age", "lag"):
        bins, means, _ = binned_means(lag_block[by], "ratio")
        out[f"rho_{by}"] = fit_rate(bins, means)
    age = out["rho_age"]
    out["rho_ratio"] = out["rho_lag"] / age if age and np.isfinite(age) else float("nan")
    return out


# ----------------------------------------------------------------------------- helpers
def sq_dist(X: torch.Tensor, a: np.ndarray, b: np.ndarray, *, chunk: int = 64) -> np.ndarray:
    """float64 [P]: ``||X[a_p] − X[b_p]||²`` for row pairs (differences, not the Gram trick)."""
    import torch

    out = np.zeros(len(a))
    for lo in range(0, len(a), chunk):
        ia = torch.as_tensor(a[lo:lo + chunk], device=X.device)
        ib = torch.as_tensor(b[lo:lo + chunk], device=X.device)
        d = (X[ia] - X[ib]).double()
        out[lo:lo + chunk] = (d * d).sum(dim=1).cpu().numpy()
    return out


class ValidationLoss:
    """Cross-entropy loss and accuracy of flat models on clients' validation splits.

    ``losses(P, owner)``: P [m, D] rows, owner [m] client ids -> (loss [m], acc [m]) float64,
    each row on its owner's validation split; NaN where the owner has no validation example.
    The splits are kept concatenated on the device; each chunk of rows gathers its owners'
    examples padded to the chunk's largest split (memory bounded by the chunk) and is
    evaluated with ``torch.func.vmap`` over ``functional_call``.
    """

    def __init__(self, model: torch.nn.Module, spec, val_x, val_y, device, *,
                 chunk: int = 32):
        import torch

        from sfg.world.data.base import ClientImages

        self.model, self.spec, self.chunk = model, spec, chunk
        self.sizes = np.array([len(y) for y in val_y], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        # rows of the dataset's pool, gathered and normalised per chunk
        self.images = ClientImages.of(val_x)
        self.images.on(device)
        self.device = torch.device(device)
        self.y = (torch.cat(list(val_y)) if len(val_y) else torch.zeros(0, dtype=torch.int64)
                  ).to(device, torch.int64)

    def losses(self, P: torch.Tensor, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch
        from torch.func import functional_call, vmap

        owner = np.asarray(owner, np.int64)
        m = P.shape[0]
        loss = np.full(m, np.nan)
        acc = np.full(m, np.nan)

        def logits(p, x):
            return functional_call(self.model, p, (x,))

        dev = self.device
        with torch.no_grad():
            for lo in range(0, m, self.chunk):
                rows = np.arange(lo, min(m, lo + self.chunk))
                rows = rows[self.sizes[owner[rows]] > 0]
                if rows.size == 0:
                    continue
                n = self.sizes[owner[rows]]
                V = int(n.max())
                pos = np.arange(V)[None, :]
                idx = self.offsets[owner[rows]][:, None] + np.minimum(pos, n[:, None] - 1)
                gidx = torch.as_tensor(idx, device=dev)
                mask = torch.as_tensor(pos < n[:, None], device=dev)
                params = self.spec.unflatten(P[torch.as_tensor(rows, device=P.device)])
                xs = self.images.take(self.images.rows[idx], dev)  # [r, V, ...]
                ys = self.y[gidx]  # [r, V]
                out = vmap(logits)(params, xs)  # [r, V, C]
                ce = torch.nn.functional.cross_entropy(
                    out.flatten(0, 1), ys.flatten(), reduction="none").view(out.shape[:2])
                mk = mask.to(ce.dtype)
                right = (out.argmax(dim=2) == ys).to(ce.dtype)
                cnt = torch.as_tensor(n, device=dev, dtype=ce.dtype)
                loss[rows] = ((ce * mk).sum(1) / cnt).double().cpu().numpy()
                acc[rows] = ((right * mk).sum(1) / cnt).double().cpu().numpy()
        return loss, acc


# ----------------------------------------------------------------------------- the recorder
def lag_bins(ages: tuple[ArrayLike, ArrayLike],
             lags: tuple[ArrayLike, ArrayLike]) -> dict[str, np.ndarray]:
    """The lag law's bins of pairs with the two ends' ages ``(τ_a, τ_b)`` and lags
    ``(ℓ_a, ℓ_b)`` [P] each: ``{"age": |τ_a − τ_b|, "lag": round(|ℓ_a − ℓ_b|)}`` (int64 [P])."""
    return {"age": np.abs(np.asarray(ages[0], np.int64) - np.asarray(ages[1], np.int64)),
            "lag": np.rint(np.abs(np.asarray(lags[0], np.float64)
                                  - np.asarray(lags[1], np.float64))).astype(np.int64)}


def lag_law(units: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The lag law (JSON as :meth:`Recorder.result`'s ``lag``) from per-snapshot sums: each
    of ``units`` holds one snapshot's squared distances binned as :func:`lag_bins` says,
    unnormalised — ``{"age": {"d": {"sum", "count"}}, "lag": {...}}`` (a stored
    :class:`Binned` of column ``d`` per binning, e.g. pooled over the receivers that measured
    the snapshot's pairs). Each bin's sum is divided by the snapshot's mean over its pairs
    with difference 0 (:func:`normalised` on the bins' means, bin 0 the base): the same
    ratios' sums and counts as :meth:`Recorder.record_lag` on the snapshot's pairs, added in
    another order."""
    units = list(units)
    out = {"age": Binned(["ratio"]), "lag": Binned(["ratio"])}
    used = np.zeros(len(units), bool)
    for by, b in out.items():
        parts = [binned_means(u[by], "d") for u in units]
        bins, means, counts = (np.concatenate([np.zeros(0), *(p[k] for p in parts)])
                               for k in range(3))
        bins, counts = bins.astype(np.int64), counts.astype(np.int64)
        group = np.repeat(np.arange(len(units)), [p[0].size for p in parts])
        ok, ratio = normalised(means, group, bins == 0)
        b.add("ratio", bins[ok], ratio[ok] * counts[ok], counts[ok])
        used[group[ok]] = True
    block = {by: b.to_json() for by, b in out.items()}
    return {**block, "snapshots": int(used.sum()), **law_rates(block)}


def finetune_minibatches(size: int, i: int, t: int, *, K: int, B: int, seed: int,
                         hflip: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Client i's minibatches of the fine-tuning at t (``size``: its training examples):
    local indices [1, K, B] from the stream ``diagnostics-finetune-<i>`` keyed by t, and
    horizontal flips [1, K, B] from ``diagnostics-finetune-augment-<i>`` (None without
    augmentation) — the diagnostics' own streams, never the training's."""
    from sfg.sim.minibatches import minibatch_indices

    idx = minibatch_indices(np.array([size], np.int64), K, B, seed=seed,
                            stream_name=f"diagnostics-finetune-{i}", t=t)
    flips = (stream(seed, f"diagnostics-finetune-augment-{i}", t).random((1, K, B)) < 0.5
             if hflip else None)
    return idx, flips


def normalised(d: ArrayLike, group: ArrayLike, base: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``(ok, ratio)``: each ``d`` divided by the mean of ``d`` over the ``base`` entries of its
    group (``group`` [P] non-negative ints); ``ok`` where the group has such entries and
    their mean is positive (``ratio`` NaN elsewhere). The one normalisation of docs/concepts/diagnostics.md#training-diagnostics: the
    raw law per receiver over its fresh neighbours, the lag law per snapshot over the pairs
    with no difference, the fine-tuned distances per receiver over its fresh neighbours."""
    d = np.asarray(d, np.float64).reshape(-1)
    group = np.asarray(group, np.int64).reshape(-1)
    base = np.asarray(base, bool).reshape(-1)
    n = int(group.max()) + 1 if group.size else 0
    s = np.bincount(group, weights=np.where(base, d, 0.0), minlength=n)
    c = np.bincount(group, weights=base.astype(np.float64), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s / c
    ok = (c[group] > 0) & (mean[group] > 0)
    ratio = np.full(d.size, np.nan)
    ratio[ok] = d[ok] / mean[group][ok]
    return ok, ratio


class Recorder:
    """The accumulators of the training diagnostics (docs/concepts/diagnostics.md#training-diagnostics) and how each is recorded, for the rounds
    (:class:`Diagnostics`) and the virtual clock's async and event protocols
    (:class:`sfg.clock.diagnostics.EventDiagnostics`): the two say which pairs, models and
    ages are measured, these methods what is computed from them, once.

    ``seed``: the run's seed (the diagnostics' own streams hang off it). ``finetune`` and
    ``returning`` also need ``val`` (a :class:`ValidationLoss`); ``finetune`` needs
    ``train_batches(i, t)`` -> (xs [K, B, ...], ys [K, B]) of client i and
    ``train(P, xs, ys)`` -> trained P (the run's local training).
    """

    def __init__(self, kinds: Iterable[str], *, seed: int, val: ValidationLoss | None = None,
                 train_batches: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
                 | None = None,
                 train: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
                 | None = None):
        self.kinds = parse_diagnostics(list(kinds))
        self.seed = int(seed)
        self.val, self.train_batches, self.train = val, train_batches, train
        needs_val = {"finetune", "returning"} & set(self.kinds)
        check(not needs_val or val is not None,
              f"diagnostics {sorted(needs_val)} need the validation split")
        check("finetune" not in self.kinds or (train is not None and train_batches is not None),
              "the finetune diagnostic needs the run's local training")
        self.raw = Binned(["ratio"])
        self.lag = {"age": Binned(["ratio"]), "lag": Binned(["ratio"])}
        self.lag_snapshots = 0
        self.ft = Binned(FINETUNE_COLUMNS)
        self.ft_own = {"loss": [0.0, 0], "acc": [0.0, 0]}
        self.ft_receivers = 0
        self.ret = Binned(RETURN_COLUMNS)
        self.returns = 0

    # -- what is recorded from the measured pairs and models
    def record_raw(self, d: ArrayLike, receiver: ArrayLike, age: ArrayLike) -> None:
        """The raw law: squared distances ``d`` [P] from receivers (``receiver`` [P], one id
        per aggregating receiver of age 0) to their live neighbours of age ``age`` [P], each
        divided by the mean over its receiver's age-0 neighbours (receivers without any, or
        whose mean is 0, skipped), binned by the neighbour's age."""
        age = np.asarray(age, np.int64)
        ok, ratio = normalised(d, receiver, age == 0)
        self.raw.add("ratio", age[ok], ratio[ok])

    def record_lag(self, d: ArrayLike, ages: tuple[ArrayLike, ArrayLike],
                   lags: tuple[ArrayLike, ArrayLike], snapshot: ArrayLike) -> None:
        """The lag law: squared distances ``d`` [P] of live pairs with the two ends' ages
        ``ages = (τ_a, τ_b)`` and lags ``lags = (ℓ_a, ℓ_b)`` [P] each, binned by |τ_a − τ_b| and
        by round(|ℓ_a − ℓ_b|), each divided by the mean over its ``snapshot``'s [P] pairs with
        difference 0; a snapshot that normalised anything counts in ``snapshots``."""
        snapshot = np.asarray(snapshot, np.int64)
        _, group = np.unique(snapshot, return_inverse=True)
        diffs = lag_bins(ages, lags)
        used = np.zeros(int(group.max()) + 1 if group.size else 0, bool)
        for by, x in diffs.items():
            ok, ratio = normalised(d, group, x == 0)
            self.lag[by].add("ratio", x[ok], ratio[ok])
            used[group[ok]] = True
        self.lag_snapshots += int(used.sum())

    def record_finetune(self, P0: torch.Tensor, sizes: ArrayLike, receivers: ArrayLike, t: int,
                        age: ArrayLike) -> None:
        """Fine-tuned geometry: ``P0`` [m, D] holds per receiver (``receivers`` [k] client ids,
        ``sizes`` [k] rows each) its own model first, then its live neighbours' models
        (``age`` [m − k]: their ages, in that order). Every row trains the receiver's K local
        steps on one common minibatch sequence (``train_batches(i, t)``); recorded by
        neighbour age: the distance to the receiver's own model before and after, each
        divided by the mean over its age-0 neighbours, and the fine-tuned neighbour models'
        validation loss and accuracy on the receiver's split; the receiver's own separately."""
        import torch

        sizes = np.asarray(sizes, np.int64)
        receivers = np.asarray(receivers, np.int64)
        age = np.asarray(age, np.int64)
        if receivers.size == 0:
            return
        assert self.val is not None and self.train is not None and self.train_batches is not None
        xs, ys = [], []
        for i, m in zip(receivers, sizes, strict=True):  # at most 16: one training call below
            bx, by = self.train_batches(int(i), int(t))
            xs.append(bx.unsqueeze(0).expand(int(m), *bx.shape))
            ys.append(by.unsqueeze(0).expand(int(m), *by.shape))
        owner = np.repeat(receivers, sizes)
        P1 = self.train(P0, torch.cat(xs), torch.cat(ys))
        loss, acc = self.val.losses(P1, owner)
        own = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        is_nb = np.ones(owner.size, bool)
        is_nb[own] = False
        nb = np.flatnonzero(is_nb)
        group = np.repeat(np.arange(receivers.size), sizes - 1)
        fresh = age == 0
        for col, P in (("before", P0), ("after", P1)):
            ok, ratio = normalised(sq_dist(P, nb, own[group]), group, fresh)
            self.ft.add(col, age[ok], ratio[ok])
        self.ft.add("loss", age, loss[nb])
        self.ft.add("acc", age, acc[nb])
        for col, v in (("loss", loss[own]), ("acc", acc[own])):
            v = v[np.isfinite(v)]
            self.ft_own[col][0] += float(v.sum())
            self.ft_own[col][1] += int(v.size)
        self.ft_receivers += int(receivers.size)

    def record_returning(self, D: ArrayLike, owner: ArrayLike, stale: torch.Tensor,
                         agg: torch.Tensor, trained: torch.Tensor, self_weight: ArrayLike,
                         neighbours: torch.Tensor, of: ArrayLike) -> None:
        """Returning clients (``owner`` [m] client ids, ``D`` [m] their ages at return): the
        validation loss and accuracy on the owner's split of its ``stale``, post-aggregation
        (``agg``) and ``trained`` models [m, D] each; the mean over its live neighbours'
        models (``neighbours`` [p, D], ``of`` [p] the position 0..m−1 of the returning client
        each belongs to); its rule's ``self_weight`` [m]."""
        import torch

        D = np.asarray(D, np.int64)
        owner = np.asarray(owner, np.int64)
        of = np.asarray(of, np.int64)
        m = D.size
        if m == 0:
            return
        assert self.val is not None
        loss, acc = self.val.losses(torch.cat([stale, agg, trained]), np.tile(owner, 3))
        for k, name in enumerate(("stale", "agg", "trained")):
            self.ret.add(f"loss_{name}", D, loss[k * m:(k + 1) * m])
            self.ret.add(f"acc_{name}", D, acc[k * m:(k + 1) * m])
        self.ret.add("self_weight", D, self_weight)
        if of.size:
            nl, na = self.val.losses(neighbours, owner[of])
            for col, v in (("loss_neighbours", nl), ("acc_neighbours", na)):
                ok = np.isfinite(v)
                s = np.bincount(of[ok], weights=v[ok], minlength=m)
                c = np.bincount(of[ok], minlength=m)
                with np.errstate(invalid="ignore", divide="ignore"):
                    self.ret.add(col, D, s / c)
        self.returns += m

    def record_later(self, D: ArrayLike, owner: ArrayLike, later: torch.Tensor) -> None:
        """Returning clients' models :data:`LATER` rounds after their return (``later``
        [m, D], ``owner`` [m], ``D`` [m] as at the return): validation loss and accuracy."""
        assert self.val is not None
        loss, acc = self.val.losses(later, np.asarray(owner, np.int64))
        self.ret.add("loss_later", D, loss)
        self.ret.add("acc_later", D, acc)

    # -- the result
    def result(self) -> dict[str, Any]:
        """JSON-ready per-bin sums and counts of every recorded diagnostic (plus ρ fits)."""
        out: dict[str, Any] = {"kinds": list(self.kinds)}
        if "raw" in self.kinds:
            out["raw"] = self.raw.to_json()
        if "lag" in self.kinds:
            block = {by: b.to_json() for by, b in self.lag.items()}
            out["lag"] = {**block, "snapshots": self.lag_snapshots, **law_rates(block)}
        if "finetune" in self.kinds:
            out["finetune"] = {**self.ft.to_json(), "receivers": self.ft_receivers,
                               "own_loss": self.ft_own["loss"], "own_acc": self.ft_own["acc"]}
        if "returning" in self.kinds:
            out["returning"] = {**self.ret.to_json(), "returns": self.returns}
        return out


class Diagnostics(Recorder):
    """Records the diagnostics ``kinds`` of one round-based run; call :meth:`observe` every
    round.

    ``rg``: the run's RoundGraph; ``available``: bool [T, N] availability; ``seed``, ``val``,
    ``train_batches``, ``train``: as :class:`Recorder`.
    """

    def __init__(self, kinds: Iterable[str], *, rg, available: np.ndarray, seed: int,
                 val: ValidationLoss | None = None, train_batches=None, train=None):
        super().__init__(kinds, seed=seed, val=val, train_batches=train_batches, train=train)
        self.rg, self.available = rg, np.asarray(available, bool)
        self.pending: dict[int, list[tuple[int, int]]] = {}  # round -> [(client, D)]

    # -- the hook
    def observe(self, r: Mapping[str, Any]) -> None:
        """Record round ``r["t"]`` (keys as the simulator's observer: ``X``, ``X_agg``,
        ``X_next``, ``weights``, ``candidate``, ``state``, ``caps``)."""
        t = int(r["t"])
        if "raw" in self.kinds and t % LAW_EVERY == 0:
            self._raw(r)
        if "lag" in self.kinds and t % LAW_EVERY == 0:
            self._lag(r)
        if "finetune" in self.kinds and t % FINETUNE_EVERY == 0:
            self._finetune(r)
        if "returning" in self.kinds:
            self._returning(r)

    # -- pieces
    def _neighbour_slots(self, r) -> np.ndarray:
        rg = self.rg
        return np.flatnonzero(np.asarray(r["candidate"], bool) & ~rg.is_self)

    def _raw(self, r) -> None:
        rg, ages = self.rg, np.asarray(r["state"].ages)
        slots = self._neighbour_slots(r)
        slots = slots[ages[rg.recv[slots]] == 0]
        if slots.size == 0:
            return
        d = sq_dist(r["X"], rg.recv[slots], rg.send[slots])
        self.record_raw(d, rg.recv[slots], ages[rg.send[slots]])

    def _lag(self, r) -> None:
        rg, st = self.rg, r["state"]
        slots = self._neighbour_slots(r)
        slots = slots[rg.recv[slots] < rg.send[slots]]
        if slots.size == 0:
            return
        a, b = rg.recv[slots], rg.send[slots]
        d = sq_dist(r["X"], a, b)
        self.record_lag(d, (st.ages[a], st.ages[b]), (st.lags[a], st.lags[b]),
                        np.zeros(a.size, np.int64))

    def _finetune(self, r) -> None:
        import torch

        rg, ages, t = self.rg, np.asarray(r["state"].ages), int(r["t"])
        slots = self._neighbour_slots(r)
        slots = slots[ages[rg.recv[slots]] == 0]
        if slots.size == 0:
            return
        recv, send = rg.recv[slots], rg.send[slots]
        n = rg.n
        has_fresh = np.bincount(recv, weights=(ages[send] == 0), minlength=n) > 0
        has_stale = np.bincount(recv, weights=(ages[send] >= 1), minlength=n) > 0
        eligible = np.flatnonzero(has_fresh & has_stale)
        if eligible.size == 0:
            return
        g = stream(self.seed, "diagnostics", "finetune", t)
        chosen = np.sort(g.choice(eligible, size=min(FINETUNE_RECEIVERS, eligible.size),
                                  replace=False))
        # per receiver: its own row first, then its neighbours (slots are grouped by receiver)
        nbs = [send[recv == i] for i in chosen]
        rows = np.concatenate([np.concatenate([[i], nb]) for i, nb in zip(chosen, nbs,
                                                                          strict=True)])
        X = r["X"]
        P0 = X[torch.as_tensor(rows, device=X.device)]
        self.record_finetune(P0, [nb.size + 1 for nb in nbs], chosen, t,
                             ages[np.concatenate(nbs)])

    def _returning(self, r) -> None:
        import torch

        t, rg = int(r["t"]), self.rg
        T = self.available.shape[0]
        X, X_agg, X_next = r["X"], r["X_agg"], r["X_next"]
        due = self.pending.pop(t, [])
        if due:
            who = np.array([c for c, _ in due])
            self.record_later(np.array([d for _, d in due]), who,
                              X_next[torch.as_tensor(who, device=X.device)])
        if t == 0:
            return
        back = np.flatnonzero(self.available[t] & ~self.available[t - 1])
        if back.size == 0:
            return
        D = np.asarray(r["state"].ages)[back].astype(np.int64)
        idx = torch.as_tensor(back, device=X.device)
        slots = self._neighbour_slots(r)
        pos = np.full(rg.n, -1, np.int64)
        pos[back] = np.arange(back.size)
        slots = slots[pos[rg.recv[slots]] >= 0]
        weights = np.asarray(r["weights"], np.float64)
        self.record_returning(D, back, X[idx], X_agg[idx], X_next[idx], weights[rg.indptr[back]],
                              X[torch.as_tensor(rg.send[slots], device=X.device)],
                              pos[rg.recv[slots]])
        if t + LATER < T:
            self.pending.setdefault(t + LATER, []).extend(
                (int(c), int(d)) for c, d in zip(back, D, strict=True))
