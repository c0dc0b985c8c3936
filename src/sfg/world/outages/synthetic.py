"""Synthetic outage processes (docs/concepts/outages.md#outage-processes): ``iid``, ``bursty``, ``heterogeneous``, ``regional``, ``none``.

Each factory returns a frozen process object with ``name`` and
``sample(T, N, *, seed, positions=None) -> bool[T, N]`` (True = available).

**Calibration (docs/concepts/outages.md#outage-processes).** A trace is drawn from ``sfg.util.rng.stream(seed, "outage", kind, attempt)``
for attempt = 0, 1, ... and accepted as soon as its realised unavailability (the fraction of
offline client-rounds) is within ±0.005 of the target ``u``; at most 200 attempts. When none
qualifies:

* if the process structurally cannot reach ``u`` -- the mean over the attempts of each draw's own
  stationary unavailability differs from ``u`` by more than the tolerance -- the closest realised
  trace is returned (the five draws whose expectation is nearest ``u`` are always realised). This is the ``heterogeneous`` process of docs/concepts/outages.md#outage-processes: per-client rates are clipped at 0.98 and a
  chain with mean outage ``mean_off`` cannot be offline more than ``mean_off/(mean_off+1)`` of
  the time, so high targets come out low. Because the closest of many rate draws is kept, the
  realised value depends on N: u = 0.8 realises ≈ 0.76 with N = 100, T = 300 (the study: ≈ 0.77) but
  ≈ 0.73 with N = 10^5, and u = 0.5 calibrates exactly at N = 100 but realises ≈ 0.487 at
  N = 10^5 where the rate draws hardly vary. Attempts whose own expectation is more than
  0.005 + 6 sigma (chain noise) from u are not realised, since they cannot qualify;
* otherwise (the model is right on average but the trace is too small for ±0.005, e.g. N·T tiny)
  an :class:`SfgError` names the process, the target, the closest value and the fix.

Requests no process can satisfy (u >= 1, a Gilbert–Elliott stationary rate above
``mean_off/(mean_off+1)``, ``regional`` below its individual failure rate) raise up front.
Every chain starts from its stationary distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

import numpy as np

from sfg.errors import SfgError, check
from sfg.util.components import format_component
from sfg.util.rng import stream
from sfg.util.safety import check_cells
from sfg.world.outages.registry import PROCESSES

__all__ = [
    "MAX_ATTEMPTS",
    "TOLERANCE",
    "Bursty",
    "Heterogeneous",
    "Iid",
    "NoOutages",
    "Regional",
    "gilbert_elliott",
    "kmeans_labels",
    "region_labels",
]

TOLERANCE = 0.005
MAX_ATTEMPTS = 200
_EPS = 1e-12
_BLOCK = 1 << 20  # uniforms drawn per block (bounded memory; same values as one big draw)

# --------------------------------------------------------------------------------------------
# Validation


def _num(x: float) -> int | float:
    """10.0 -> 10 for readable names."""
    return int(x) if float(x).is_integer() else x


def _check_u(kind: str, u: object) -> float:
    if u is None:
        raise SfgError(f"outage process {kind!r} needs a target unavailability u, "
                       f"e.g. '{kind}:u=0.5'")
    if isinstance(u, bool) or not isinstance(u, Real) or not np.isfinite(float(u)):
        raise SfgError(f"{kind}: u={u!r} must be a number in [0, 1)")
    u = float(u)
    if u == 1:
        raise SfgError(f"{kind}: u=1 would keep every client offline in every round; use u < 1")
    check(0 <= u < 1, f"{kind}: target unavailability u={u} must lie in [0, 1)")
    return u


def _check_mean_off(kind: str, mean_off: object) -> float:
    if isinstance(mean_off, bool) or not isinstance(mean_off, Real):
        raise SfgError(f"{kind}: mean_off={mean_off!r} must be a number of rounds >= 1")
    mean_off = float(mean_off)
    check(np.isfinite(mean_off) and mean_off >= 1,
          f"{kind}: mean outage length mean_off={mean_off} must be at least 1 round")
    # beyond ~1e9 rounds the chain's per-round return probability 1/mean_off is lost in
    # rounding (1 - 1/mean_off == 1) and its calibration divides by zero
    check(mean_off <= 1e9, f"{kind}: mean outage length mean_off={mean_off:g} must be at most "
                           "1e9 rounds (longer than any run)")
    return mean_off


def _max_chain_rate(mean_off: float) -> float:
    """Highest stationary unavailability of a chain with mean outage ``mean_off`` (on-periods of
    exactly one round)."""
    return mean_off / (mean_off + 1)


def _check_chain_rate(kind: str, rate: float, mean_off: float, what: str) -> None:
    top = _max_chain_rate(mean_off)
    check(rate <= top + _EPS,
          f"{kind}: {what} {rate:.4g} is unreachable with mean outage mean_off={mean_off:g} "
          f"(at most mean_off/(mean_off+1) = {top:.4g}); raise mean_off or lower u")


def _check_shape(T: object, N: object) -> tuple[int, int]:
    for name, v in (("T", T), ("N", N)):
        if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
            raise SfgError(f"{name}={v!r} must be a positive integer (rounds T, clients N)")
    # the availability matrix, and as much again for the draws behind it
    check_cells(int(T), int(N), 2, "the availability of this run", cols_name="clients",  # type: ignore[arg-type]
                fix="lower --rounds or --clients")
    return int(T), int(N)  # type: ignore[arg-type]


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
        raise SfgError(f"seed={seed!r} must be a non-negative integer")
    return int(seed)


def _check_positions(positions: object, N: int) -> np.ndarray:
    pos = np.asarray(positions, dtype=np.float64)
    check(pos.shape == (N, 2), f"positions must have shape [N, 2] = [{N}, 2], got {pos.shape}")
    check(bool(np.isfinite(pos).all()), "positions must be finite")
    return pos


# --------------------------------------------------------------------------------------------
# Building blocks


def _bernoulli(rng: np.random.Generator, T: int, N: int, prob: float | np.ndarray) -> np.ndarray:
    """``bool[T, N]`` with P(True) = prob (scalar or [N]), drawn in bounded blocks of rounds."""
    out = np.empty((T, N), dtype=bool)
    rows = max(1, _BLOCK // N)
    for t0 in range(0, T, rows):
        t1 = min(T, t0 + rows)
        out[t0:t1] = rng.random((t1 - t0, N)) < prob
    return out


def _on_off_probability(rates: np.ndarray, q: float) -> np.ndarray:
    """On->off probability giving stationary unavailability ``rates`` with off->on ``q``,
    capped at 1."""
    rates = np.asarray(rates, dtype=np.float64)
    p = np.where(rates < 1, q * rates / np.maximum(1 - rates, 1e-300), 1.0)
    return np.minimum(p, 1.0)


def _stationary(rates: np.ndarray, mean_off: float) -> np.ndarray:
    """Realised stationary unavailability of chains aiming at ``rates`` (after the cap)."""
    q = 1.0 / mean_off
    p = _on_off_probability(rates, q)
    return p / (p + q)


def gilbert_elliott(rng: np.random.Generator, T: int, rates: np.ndarray, *,
                    mean_off: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-state Gilbert–Elliott chains, one per column (docs/concepts/outages.md#outage-processes).

    ``rates: [K]`` target stationary unavailabilities. Off->on probability ``q = 1/mean_off``
    (mean outage ``mean_off`` rounds); on->off probability ``p = q r/(1-r)``, capped at 1 (then
    the chain is offline ``mean_off/(mean_off+1)`` of the time, its ceiling). Initial states come
    from the stationary distribution. Returns ``off: bool[T, K]`` and the realised stationary
    unavailabilities ``[K] float64`` (= rates unless capped).
    """
    rates = np.asarray(rates, dtype=np.float64)
    q = 1.0 / mean_off
    p = _on_off_probability(rates, q)
    stationary = p / (p + q)
    off = np.empty((T, len(rates)), dtype=bool)
    state = rng.random(len(rates)) < stationary
    off[0] = state
    for t in range(1, T):
        draw = rng.random(len(rates))
        state = np.where(state, draw >= q, draw < p)
        off[t] = state
    return off, stationary


def kmeans_labels(points: np.ndarray, k: int, rng: np.random.Generator, *,
                  iters: int = 100) -> np.ndarray:
    """Seeded k-means (k-means++ initialisation, Lloyd iterations): ``[N, 2]`` -> ``int64[N]``.

    Every cluster is non-empty (an emptied cluster is re-seeded at the point farthest from its
    centre).
    """
    n = len(points)
    check(1 <= k <= n, f"k-means needs 1 <= k <= N, got k={k}, N={n}")
    centres = np.empty((k, points.shape[1]))
    centres[0] = points[rng.integers(n)]
    d2 = ((points - centres[0]) ** 2).sum(1)
    for c in range(1, k):
        total = d2.sum()
        pick = rng.choice(n, p=d2 / total) if total > 0 else rng.integers(n)
        centres[c] = points[pick]
        d2 = np.minimum(d2, ((points - centres[c]) ** 2).sum(1))
    labels = np.full(n, -1, dtype=np.int64)
    for _ in range(iters):
        dist = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(-1)  # [N, k]
        new = dist.argmin(1)
        counts = np.bincount(new, minlength=k)
        for c in np.flatnonzero(counts == 0):  # rare: re-seed empty clusters
            far = int(dist[np.arange(n), new].argmax())
            new[far] = c
            dist[far] = 0.0
            counts = np.bincount(new, minlength=k)
        if np.array_equal(new, labels):
            break
        labels = new
        sums = np.zeros_like(centres)
        np.add.at(sums, labels, points)
        centres = sums / np.bincount(labels, minlength=k)[:, None]
    return labels


def region_labels(positions: np.ndarray | None, *, groups: int, layout: str,
                  seed: int) -> np.ndarray:
    """Region of every client for ``regional`` (docs/concepts/outages.md#outage-processes): ``int64[N]`` in ``0..groups-1``.

    ``spatial``: k-means clusters of the node positions; ``scattered``: the same labels randomly
    permuted over the clients (same region sizes, no spatial coherence). Keyed by
    ``(seed, "outage", "regional", "regions")``, so regions do not change across calibration
    attempts.
    """
    rng = stream(seed, "outage", "regional", "regions")
    spatial = kmeans_labels(np.asarray(positions, dtype=np.float64), groups, rng)
    if layout == "spatial":
        return spatial
    return rng.permutation(spatial)


def _chain_sigma(stationary: np.ndarray, mean_off: float, T: int) -> float:
    """Standard deviation of the offline fraction of independent stationary chains over T rounds.

    Per chain with lam = 1 - p - q: Var(sum) = T pi(1-pi) [(1+lam)/(1-lam)
    - 2 lam (1-lam^T) / (T (1-lam)^2)]. Used only to skip attempts that cannot calibrate.
    """
    pi = np.asarray(stationary, dtype=np.float64)
    q = 1.0 / mean_off
    lam = 1.0 - _on_off_probability(pi, q) - q  # 1 - lam >= q > 0
    one = 1.0 - lam
    factor = (1 + lam) / one - 2 * lam * (1 - lam ** T) / (T * one ** 2)
    var = T * pi * (1 - pi) * factor
    return float(np.sqrt(max(var.sum(), 0.0)) / (T * len(pi)))


_SKIP_Z = 6.0  # attempts whose expectation is this many sigmas off cannot calibrate
_STRUCTURAL_TRIES = 5  # unreachable target: realise this many of the closest draws


def _calibrate(kind: str, u: float, T: int, N: int, seed: int, plan, realise) -> np.ndarray:
    """Resample until the realised unavailability is within ±TOLERANCE of u (module docstring).

    ``plan(rng) -> (expected, sigma, state)`` draws what fixes the draw's own stationary
    unavailability ``expected`` (e.g. per-client rates; ``sigma`` its chain noise);
    ``realise(rng, state) -> available bool[T, N]`` continues the same stream. Attempts whose
    ``expected`` is more than TOLERANCE + 6 sigma from u are not realised (they cannot qualify).
    """
    total = T * N
    best, best_gap, best_x = None, np.inf, np.nan
    expectations = np.empty(MAX_ATTEMPTS)
    realised = set()

    def attempt_trace(attempt: int, rng=None, state=None):
        nonlocal best, best_gap, best_x
        if rng is None:
            rng = stream(seed, "outage", kind, attempt)
            _, _, state = plan(rng)
        available = realise(rng, state)
        realised.add(attempt)
        x = 1.0 - np.count_nonzero(available) / total
        if abs(x - u) < best_gap:
            best, best_gap, best_x = available, abs(x - u), x
        return abs(x - u) <= TOLERANCE + _EPS

    for attempt in range(MAX_ATTEMPTS):
        rng = stream(seed, "outage", kind, attempt)
        expected, sigma, state = plan(rng)
        expectations[attempt] = expected
        if abs(expected - u) <= TOLERANCE + _SKIP_Z * sigma + _EPS:
            if attempt_trace(attempt, rng, state):
                return best
    if abs(float(expectations.mean()) - u) > TOLERANCE:
        # Structurally unreachable target: the closest trace among the draws nearest to u.
        for attempt in np.argsort(np.abs(expectations - u), kind="stable")[:_STRUCTURAL_TRIES]:
            if int(attempt) not in realised:
                attempt_trace(int(attempt))
        return best
    step = 1.0 / total  # the unavailabilities a T x N trace can have: multiples of 1/(T N)
    nearest = round(u * total) * step
    if abs(nearest - u) > TOLERANCE + _EPS and abs(best_x - u) <= abs(nearest - u) + step / 2:
        # no T x N trace lies within the tolerance of u: the nearest value a trace can have
        from sfg.errors import notice

        notice(f"outage process {kind!r}: with T={T} rounds x N={N} clients no trace has "
               f"unavailability within ±{TOLERANCE} of u={u:g}; using the nearest "
               f"achievable, {best_x:.4f} (more clients or rounds resolve u)")
        return best
    raise SfgError(
        f"outage process {kind!r} could not reach unavailability u={u:g} within "
        f"±{TOLERANCE} in {MAX_ATTEMPTS} attempts with T={T} rounds x N={N} clients "
        f"(closest {best_x:.4f}); use more clients or rounds"
    )


# --------------------------------------------------------------------------------------------
# Processes


@dataclass(frozen=True)
class NoOutages:
    """``none``: every client available in every round (the no-outage control)."""

    kind: ClassVar[str] = "none"

    @property
    def name(self) -> str:
        return "none"

    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray:
        T, N = _check_shape(T, N)
        _check_seed(seed)
        return np.ones((T, N), dtype=bool)


@dataclass(frozen=True)
class Iid:
    """``iid(u)``: each client offline independently with probability u in every round."""

    u: float
    kind: ClassVar[str] = "iid"

    def __post_init__(self) -> None:
        object.__setattr__(self, "u", _check_u(self.kind, self.u))

    @property
    def name(self) -> str:
        return format_component(self.kind, {"u": _num(self.u)})

    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray:
        T, N = _check_shape(T, N)
        seed = _check_seed(seed)
        return _calibrate(self.kind, self.u, T, N, seed, lambda rng: (self.u, 0.0, None),
                          lambda rng, _: ~_bernoulli(rng, T, N, self.u))


@dataclass(frozen=True)
class Bursty:
    """``bursty(u, mean_off=10)``: one Gilbert–Elliott chain per client, stationary
    unavailability u, mean outage ``mean_off`` (off->on probability 1/mean_off)."""

    u: float
    mean_off: float = 10
    kind: ClassVar[str] = "bursty"

    def __post_init__(self) -> None:
        object.__setattr__(self, "u", _check_u(self.kind, self.u))
        object.__setattr__(self, "mean_off", _check_mean_off(self.kind, self.mean_off))
        _check_chain_rate(self.kind, self.u, self.mean_off, "unavailability u =")

    @property
    def name(self) -> str:
        return format_component(self.kind, {"u": _num(self.u), "mean_off": _num(self.mean_off)})

    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray:
        T, N = _check_shape(T, N)
        seed = _check_seed(seed)

        def realise(rng, _):
            return ~gilbert_elliott(rng, T, np.full(N, self.u), mean_off=self.mean_off)[0]

        return _calibrate(self.kind, self.u, T, N, seed, lambda rng: (self.u, 0.0, None),
                          realise)


_RATE_CLIP = 0.98


@dataclass(frozen=True)
class Heterogeneous:
    """``heterogeneous(u, mean_off=5)``: per-client rates r_i ~ Beta(2u, 2(1-u)) rescaled to mean
    u and clipped at 0.98, each client its own Gilbert–Elliott chain with mean outage
    ``mean_off``. High targets are structurally unreachable (module docstring)."""

    u: float
    mean_off: float = 5
    kind: ClassVar[str] = "heterogeneous"

    def __post_init__(self) -> None:
        object.__setattr__(self, "u", _check_u(self.kind, self.u))
        object.__setattr__(self, "mean_off", _check_mean_off(self.kind, self.mean_off))

    @property
    def name(self) -> str:
        return format_component(self.kind, {"u": _num(self.u), "mean_off": _num(self.mean_off)})

    def rates(self, rng: np.random.Generator, N: int) -> np.ndarray:
        """``[N] float64`` per-client target rates (Beta, rescaled to mean u, clipped)."""
        if self.u == 0:
            return np.zeros(N)
        r = rng.beta(2 * self.u, 2 * (1 - self.u), size=N)
        mean = r.mean()
        if mean > 0:
            r = r * (self.u / mean)
        return np.minimum(r, _RATE_CLIP)

    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray:
        T, N = _check_shape(T, N)
        seed = _check_seed(seed)

        def plan(rng):
            rates = self.rates(rng, N)
            stationary = _stationary(rates, self.mean_off)
            sigma = _chain_sigma(stationary, self.mean_off, T)
            return float(stationary.mean()), sigma, rates

        def realise(rng, rates):
            return ~gilbert_elliott(rng, T, rates, mean_off=self.mean_off)[0]

        return _calibrate(self.kind, self.u, T, N, seed, plan, realise)


_LAYOUTS = ("spatial", "scattered")


@dataclass(frozen=True)
class Regional:
    """``regional(u, groups, layout)`` (docs/concepts/outages.md#outage-processes): correlated outages by region.

    Regions come from :func:`region_labels`; each region follows one Gilbert–Elliott chain with
    mean outage ``mean_off`` and rate u_r, and every client additionally fails independently
    with probability ``p_indiv``; 1 - (1 - u_r)(1 - p_indiv) = u. ``spatial`` needs node
    positions (a graph with positions such as ``knn``); ``scattered`` uses them only for the
    region sizes and, without positions, clusters seeded uniform positions instead.
    """

    u: float
    groups: int = 5
    layout: str = "spatial"
    mean_off: float = 10
    p_indiv: float = 0.05
    kind: ClassVar[str] = "regional"

    def __post_init__(self) -> None:
        kind = self.kind
        object.__setattr__(self, "u", _check_u(kind, self.u))
        object.__setattr__(self, "mean_off", _check_mean_off(kind, self.mean_off))
        g = self.groups
        if isinstance(g, bool) or not isinstance(g, Integral) or g < 1:
            raise SfgError(f"{kind}: groups={g!r} must be a positive integer (e.g. 5 or 20)")
        object.__setattr__(self, "groups", int(g))
        layout = str(self.layout).lower()
        if layout not in _LAYOUTS:
            from sfg.util.components import did_you_mean

            raise SfgError(f"{kind}: unknown layout {self.layout!r}{did_you_mean(layout, _LAYOUTS)}")
        object.__setattr__(self, "layout", layout)
        p = self.p_indiv
        if isinstance(p, bool) or not isinstance(p, Real) or not 0 <= float(p) < 1:
            raise SfgError(f"{kind}: p_indiv={p!r} must be a probability in [0, 1)")
        object.__setattr__(self, "p_indiv", float(p))
        check(self.u >= self.p_indiv - _EPS,
              f"{kind}: u={self.u:g} is below the independent failure rate "
              f"p_indiv={self.p_indiv:g}; raise u or lower p_indiv")
        _check_chain_rate(kind, self.regional_rate, self.mean_off, "regional rate u_r =")

    @property
    def regional_rate(self) -> float:
        """u_r with 1 - (1 - u_r)(1 - p_indiv) = u."""
        return max(0.0, 1.0 - (1.0 - self.u) / (1.0 - self.p_indiv))

    @property
    def name(self) -> str:
        return format_component(self.kind, {
            "u": _num(self.u), "groups": self.groups, "layout": self.layout,
            "mean_off": _num(self.mean_off), "p_indiv": _num(self.p_indiv),
        })

    def regions(self, N: int, *, seed: int, positions: np.ndarray | None = None) -> np.ndarray:
        """``int64[N]`` region of every client for this seed."""
        check(self.groups <= N, f"{self.kind}: groups={self.groups} needs at least that many "
                                f"clients, got N={N}; lower groups or raise N")
        if positions is None:
            if self.layout == "spatial":
                raise SfgError(
                    f"{self.kind}: layout=spatial needs node positions; use a graph with "
                    "positions (knn) or layout=scattered"
                )
            positions = stream(seed, "outage", "regional", "positions").random((N, 2))
        positions = _check_positions(positions, N)
        return region_labels(positions, groups=self.groups, layout=self.layout, seed=seed)

    def sample(self, T: int, N: int, *, seed: int,
               positions: np.ndarray | None = None) -> np.ndarray:
        T, N = _check_shape(T, N)
        seed = _check_seed(seed)
        labels = self.regions(N, seed=seed, positions=positions)
        u_r = self.regional_rate

        def realise(rng, _):
            region_off, _ = gilbert_elliott(rng, T, np.full(self.groups, u_r),
                                            mean_off=self.mean_off)
            indiv_off = _bernoulli(rng, T, N, self.p_indiv)
            return ~(region_off[:, labels] | indiv_off)

        return _calibrate(self.kind, self.u, T, N, seed, lambda rng: (self.u, 0.0, None),
                          realise)


# --------------------------------------------------------------------------------------------
# Registration

PROCESSES.register("none", NoOutages, params={}, doc="always available (no-outage control)",
                   tags=("synthetic",))
PROCESSES.register("iid", Iid, params={"u": None},
                   doc="each client offline independently with probability u per round",
                   tags=("synthetic",))
PROCESSES.register("bursty", Bursty, params={"u": None, "mean_off": 10},
                   doc="per-client Gilbert-Elliott chains, mean outage mean_off",
                   tags=("synthetic",))
PROCESSES.register("heterogeneous", Heterogeneous, params={"u": None, "mean_off": 5},
                   doc="per-client Beta rates, each its own Gilbert-Elliott chain",
                   tags=("synthetic",))
PROCESSES.register("regional", Regional,
                   params={"u": None, "groups": 5, "layout": "spatial", "mean_off": 10,
                           "p_indiv": 0.05},
                   doc="region-wide Gilbert-Elliott outages plus independent failures",
                   tags=("synthetic", "needs-positions"))
