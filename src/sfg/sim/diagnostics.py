"""Training diagnostics: why self-inclusive, lag-based, steep discounting works (SPEC §10.1–10.3).

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
addition. Diagnostics only read the models and draw from their own streams: training with
them is bit-identical to training without them (SPEC §10).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where models are read, so reports start fast
    import torch

import numpy as np

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

    def add(self, column: str, bins, values) -> None:
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
        c += np.bincount(bins, minlength=n)
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
    """Least-squares ρ in ``y = 1 + (ρ/2)·x`` over the points with lo ≤ x ≤ hi (SPEC §10.1):
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

        self.model, self.spec, self.chunk = model, spec, chunk
        self.sizes = np.array([len(y) for y in val_y], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.x = torch.cat(list(val_x)).to(device, torch.float32)
        self.y = torch.cat(list(val_y)).to(device, torch.int64)

    def losses(self, P: torch.Tensor, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch
        from torch.func import functional_call, vmap

        owner = np.asarray(owner, np.int64)
        m = P.shape[0]
        loss = np.full(m, np.nan)
        acc = np.full(m, np.nan)

        def logits(p, x):
            return functional_call(self.model, p, (x,))

        dev = self.x.device
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
                xs, ys = self.x[gidx], self.y[gidx]  # [r, V, ...], [r, V]
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
class Diagnostics:
    """Records the diagnostics ``kinds`` of one run; call :meth:`observe` every round.

    ``rg``: the run's RoundGraph; ``available``: bool [T, N] availability; ``seed``: the run's
    seed (the diagnostics' own streams hang off it). ``finetune`` and ``returning`` also need
    ``val`` (a :class:`ValidationLoss`); ``finetune`` needs ``train_batches(i, t)`` ->
    (xs [K, B, ...], ys [K, B]) of client i and ``train(P, xs, ys)`` -> trained P (the run's
    local training).
    """

    def __init__(self, kinds: Iterable[str], *, rg, available: np.ndarray, seed: int,
                 val: ValidationLoss | None = None, train_batches=None, train=None):
        self.kinds = parse_diagnostics(list(kinds))
        self.rg, self.available, self.seed = rg, np.asarray(available, bool), int(seed)
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
        self.pending: dict[int, list[tuple[int, int]]] = {}  # round -> [(client, D)]
        self.returns = 0

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
        recv, fresh = rg.recv[slots], ages[rg.send[slots]] == 0
        n = rg.n
        fsum = np.bincount(recv, weights=np.where(fresh, d, 0.0), minlength=n)
        fcnt = np.bincount(recv, weights=fresh.astype(np.float64), minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = fsum / fcnt
        ok = (fcnt[recv] > 0) & (mean[recv] > 0)
        self.raw.add("ratio", ages[rg.send[slots]][ok], d[ok] / mean[recv][ok])

    def _lag(self, r) -> None:
        rg, st = self.rg, r["state"]
        slots = self._neighbour_slots(r)
        slots = slots[rg.recv[slots] < rg.send[slots]]
        if slots.size == 0:
            return
        a, b = rg.recv[slots], rg.send[slots]
        d = sq_dist(r["X"], a, b)
        diffs = {"age": np.abs(st.ages[a] - st.ages[b]).astype(np.int64),
                 "lag": np.rint(np.abs(st.lags[a] - st.lags[b])).astype(np.int64)}
        used = False
        for by, x in diffs.items():
            zero = x == 0
            if not zero.any():
                continue
            d0 = float(d[zero].mean())
            if d0 <= 0:
                continue
            self.lag[by].add("ratio", x, d / d0)
            used = True
        self.lag_snapshots += int(used)

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
        X = r["X"]
        owners, starts, xs, ys = [], [], [], []
        for i in chosen:  # at most 16 receivers: one batched training call below
            nb = send[recv == i]
            rows = np.concatenate([[i], nb])
            bx, by = self.train_batches(int(i), t)
            owners.append(np.full(rows.size, i))
            starts.append(rows)
            xs.append(bx.unsqueeze(0).expand(rows.size, *bx.shape))
            ys.append(by.unsqueeze(0).expand(rows.size, *by.shape))
        owner = np.concatenate(owners)
        start_rows = np.concatenate(starts)
        P0 = X[torch.as_tensor(start_rows, device=X.device)]
        P1 = self.train(P0, torch.cat(xs), torch.cat(ys))
        loss, acc = self.val.losses(P1, owner)
        # per receiver: its own row first, then its neighbours
        offsets = np.concatenate([[0], np.cumsum([s.size for s in starts])])
        for k in range(chosen.size):
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            nb = start_rows[lo + 1:hi]
            own0, own1 = P0[lo:lo + 1], P1[lo:lo + 1]
            before = ((P0[lo + 1:hi] - own0).double() ** 2).sum(1).cpu().numpy()
            after = ((P1[lo + 1:hi] - own1).double() ** 2).sum(1).cpu().numpy()
            fresh = ages[nb] == 0
            for col, dist in (("before", before), ("after", after)):
                base = dist[fresh].mean()
                if base > 0:
                    self.ft.add(col, ages[nb], dist / base)
            self.ft.add("loss", ages[nb], loss[lo + 1:hi])
            self.ft.add("acc", ages[nb], acc[lo + 1:hi])
            for col, v in (("loss", loss[lo]), ("acc", acc[lo])):
                if np.isfinite(v):
                    self.ft_own[col][0] += float(v)
                    self.ft_own[col][1] += 1
        self.ft_receivers += int(chosen.size)

    def _returning(self, r) -> None:
        import torch

        t, rg = int(r["t"]), self.rg
        T = self.available.shape[0]
        X, X_agg, X_next = r["X"], r["X_agg"], r["X_next"]
        due = self.pending.pop(t, [])
        if due:
            who = np.array([c for c, _ in due])
            loss, acc = self.val.losses(X_next[torch.as_tensor(who, device=X.device)], who)
            D = np.array([d for _, d in due])
            self.ret.add("loss_later", D, loss)
            self.ret.add("acc_later", D, acc)
        if t == 0:
            return
        back = np.flatnonzero(self.available[t] & ~self.available[t - 1])
        if back.size == 0:
            return
        D = np.asarray(r["state"].ages)[back].astype(np.int64)
        self.returns += int(back.size)
        idx = torch.as_tensor(back, device=X.device)
        P = torch.cat([X[idx], X_agg[idx], X_next[idx]])
        loss, acc = self.val.losses(P, np.tile(back, 3))
        m = back.size
        for k, name in enumerate(("stale", "agg", "trained")):
            self.ret.add(f"loss_{name}", D, loss[k * m:(k + 1) * m])
            self.ret.add(f"acc_{name}", D, acc[k * m:(k + 1) * m])
        weights = np.asarray(r["weights"], np.float64)
        self.ret.add("self_weight", D, weights[rg.indptr[back]])
        slots = self._neighbour_slots(r)
        is_back = np.zeros(rg.n, bool)
        is_back[back] = True
        slots = slots[is_back[rg.recv[slots]]]
        if slots.size:
            nl, na = self.val.losses(X[torch.as_tensor(rg.send[slots], device=X.device)],
                                     rg.recv[slots])
            for col, v in (("loss_neighbours", nl), ("acc_neighbours", na)):
                ok = np.isfinite(v)
                s = np.bincount(rg.recv[slots][ok], weights=v[ok], minlength=rg.n)
                c = np.bincount(rg.recv[slots][ok], minlength=rg.n)
                with np.errstate(invalid="ignore", divide="ignore"):
                    mean = s / c
                self.ret.add(col, D, mean[back])
        if t + LATER < T:
            self.pending.setdefault(t + LATER, []).extend(
                (int(c), int(d)) for c, d in zip(back, D, strict=True))

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
