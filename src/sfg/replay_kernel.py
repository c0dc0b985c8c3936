"""The compiled replay engine (SPEC §9): one lane's whole replay in a numba kernel.

The numpy engine (:func:`sfg.replay.replay_batch` with ``engine="numpy"``) runs the same round
code as the training simulator (:mod:`sfg.engine`), one vectorised numpy pass per round. At
N = 100 that pass is dominated by numpy's per-call overhead (about 60 calls a round), and the
self-return H by a sparse product per round. This module runs a lane's rounds in one compiled
loop instead: per receiver, its candidates, the rule's scores, the shared normalisation (SPEC
§1), the analyses and the staleness update (SPEC §2) in a single pass over its slots, then the
H columns of the adopters (SPEC §9).

Every model-free rule of SPEC §3.1–3.3 and the modifiers ``+ipw``, ``+rounded`` and ``c`` are
written here a second time, as scalar loops over one receiver's slots. The numpy library
(:mod:`sfg.rules.library`) stays the definition: the tests compare this kernel with the numpy
engine weight by weight, round by round, for every rule and modifier, anatomy mode and link
failures. The oracles (§3.4) read the missed-fraction matrix A and run on the numpy engine.
Numerics: sums run in slot order, as in the numpy engine, so weights and metrics agree to
rounding (tested to 1e-9); each engine on its own is bit-for-bit deterministic.
"""

from __future__ import annotations

import numpy as np

from .rules import Rule
from .rules.library import TIE_TOL
from .staleness import Q_HAT_BETA, Q_HAT_FLOOR

try:  # the compiled engine is optional: without numba the numpy engine runs everything
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a declared dependency
    numba = None
    HAVE_NUMBA = False

# Rule ids of the kernel's switch; the names are the registry's.
RULE_IDS = {
    "sfg": 0, "sfg-l": 1, "sfg-cut": 2, "sfg-counts": 3, "dfedavg": 4, "local": 5, "aoi": 6,
    "dfl-aa": 7, "gl-age": 8, "limited-merging": 9, "local-counts": 10,
    "update-amplification": 11, "self-weight": 12, "self-only": 13, "reset-on-return": 14,
    "neighbour-only-lags": 15, "neighbour-only-counts": 16, "pinned-receiver": 17,
    "copy-random": 18, "placebo-cut": 19, "cut-ages": 20, "receiver-kept": 21,
}
# params vector: gamma, L, c (self-weight multiplier, 1 = none), base, ipw, rounded
N_PARAMS = 6
# totals vector, in this order (see sfg.replay._TOTALS)
TOTALS = ("agg", "returns", "ret_nb", "stalest", "spread_age", "spread_lag", "kept", "self_w",
          "messages")


def supports(rule: Rule) -> bool:
    """Whether the compiled kernel implements ``rule`` (all model-free rules but the oracles)."""
    return HAVE_NUMBA and rule.name in RULE_IDS and not rule.reads_models and not rule.oracle


def rule_params(rule: Rule) -> tuple[int, np.ndarray]:
    """(rule id, params vector) for the kernel."""
    p = rule.params
    c = float(p.get("c", 1.0))
    if rule.flags.get("amplify"):
        c = 1.0  # update amplification's c is a training-side cap, not a self-weight
    base = 0.0 if rule.name == "reset-on-return" else float(p.get("base", 0.5))
    vec = np.array([float(p.get("gamma", 0.5)), float(p.get("L", 1.0)), c, base,
                    1.0 if rule.ipw else 0.0, 1.0 if "rounded" in rule.modifiers else 0.0])
    return RULE_IDS[rule.name], vec


def _jit(fn=None, **kw):
    if fn is None:
        return lambda f: _jit(f, **kw)
    if not HAVE_NUMBA:  # pragma: no cover
        return fn
    return numba.njit(cache=True, nogil=True, **kw)(fn)


@_jit
def _pow(gamma, e):
    # np.power(gamma, max(e, 0)) as in sfg.rules.library._pow (0^0 = 1)
    if e < 0:
        e = 0.0
    return np.power(gamma, e)


@_jit(inline="always")
def _scores(rule, prm, t, a, b, send, cand, ages, lagv, counts, lcounts, q, u_i, key, h):
    """The rule's scores h[a:b] over receiver segment [a, b) (slot a is the receiver).

    ``lagv`` is the per-slot lag (already rounded for +rounded). Mirrors sfg.rules.library.
    """
    gamma = prm[0]
    L = prm[1]
    big = np.iinfo(np.int64).max
    small = np.iinfo(np.int64).min
    # candidate reductions
    amin = big
    amin_nb = big
    lmin = np.inf
    lmin_nb = np.inf
    cmax = small
    cmax_nb = small
    lcmax = small
    kc = 0
    n_nb = 0
    for e in range(a, b):
        if cand[e]:
            j = send[e]
            kc += 1
            if ages[j] < amin:
                amin = ages[j]
            if lagv[e] < lmin:
                lmin = lagv[e]
            if counts[j] > cmax:
                cmax = counts[j]
            if lcounts[j] > lcmax:
                lcmax = lcounts[j]
            if e != a:
                n_nb += 1
                if ages[j] < amin_nb:
                    amin_nb = ages[j]
                if lagv[e] < lmin_nb:
                    lmin_nb = lagv[e]
                if counts[j] > cmax_nb:
                    cmax_nb = counts[j]
    for e in range(a, b):
        j = send[e]
        s = e == a
        # relative lag (float): 0 where not finite or within the tie tolerance
        rl = lagv[e] - lmin
        if not (np.isfinite(rl) and rl > TIE_TOL):
            rl = 0.0
        if rule == 0:  # sfg
            v = _pow(gamma, float(ages[j] - amin))
        elif rule == 1:  # sfg-l
            v = _pow(gamma, rl)
        elif rule == 2:  # sfg-cut
            v = max(1.0 + t - lagv[e], 0.0) if rl <= L + TIE_TOL else 0.0
        elif rule == 3:  # sfg-counts
            v = _pow(gamma, float(cmax - counts[j]))
        elif rule == 4 or rule == 11 or rule == 12:  # dfedavg, update-amplification, self-weight
            v = 1.0
        elif rule == 5:  # local
            v = 1.0 if s else 0.0
        elif rule == 6:  # aoi
            v = 1.0 if s else _pow(gamma, float(ages[j]))
        elif rule == 7:  # dfl-aa
            v = 1.0 if s else _pow(gamma, float(ages[j] - amin_nb)) / q[e]
        elif rule == 8:  # gl-age
            v = float(counts[j])
        elif rule == 9:  # limited-merging
            v = float(counts[j]) if counts[j] >= cmax - L else 0.0
        elif rule == 10:  # local-counts
            v = float(lcounts[j]) if lcounts[j] >= lcmax - L else 0.0
        elif rule == 13 or rule == 14:  # self-only, reset-on-return
            tau = ages[send[a]]
            v = _pow(prm[3], float(tau)) if (s and tau >= 1 and n_nb >= 1) else 1.0
        elif rule == 15:  # neighbour-only-lags
            rn = lagv[e] - lmin_nb
            if not (np.isfinite(rn) and rn > TIE_TOL):
                rn = 0.0
            v = 1.0 if s else _pow(gamma, rn)
        elif rule == 16:  # neighbour-only-counts
            v = 1.0 if s else _pow(gamma, float(cmax_nb - counts[j]))
        elif rule == 17:  # pinned-receiver
            v = 1.0 if s else _pow(gamma, rl)
        elif rule == 18:  # copy-random: one candidate drawn uniformly
            pick = min(int(np.floor(u_i * kc)), max(kc - 1, 0))
            before = 0
            for f in range(a, e):
                if cand[f]:
                    before += 1
            v = 1.0 if before == pick else 0.0
        elif rule == 19:  # placebo-cut: scored below, needs the sfg-cut count first
            v = 0.0
        elif rule == 20:  # cut-ages
            v = 1.0 if ages[j] - amin <= 1 else 0.0
        else:  # 21 receiver-kept
            cut = max(1.0 + t - lagv[e], 0.0)
            v = cut if (s or rl <= L + TIE_TOL) else 0.0
        h[e] = v
    if rule == 19:
        kept = 0
        for e in range(a, b):
            rl = lagv[e] - lmin
            if not (np.isfinite(rl) and rl > TIE_TOL):
                rl = 0.0
            if cand[e] and rl <= L + TIE_TOL and 1.0 + t - lagv[e] > 0.0:
                kept += 1
        for e in range(a, b):
            # rank by key among candidates, ties by slot order (non-candidates rank last)
            ke = key[e] if cand[e] else np.inf
            r = 0
            for f in range(a, b):
                kf = key[f] if cand[f] else np.inf
                if kf < ke or (kf == ke and f < e):
                    r += 1
            h[e] = 1.0 if r < kept else 0.0
    # modifiers: +ipw divides neighbours by q̂; c multiplies the receiver's own score
    if prm[4] != 0.0:
        for e in range(a + 1, b):
            h[e] = h[e] / q[e]
    if prm[2] != 1.0:
        h[a] = h[a] * prm[2]


@_jit
def run_rounds(t0, t1, rule, prm, indptr, send, edge_id, train, sendc, aggr, adopt, live,
               u, key, ages, lags, counts, lcounts, q, new_ages, new_lags, new_counts,
               h, w, cand, totals, mean_age, mean_lag, hz_C, hz_tmp, hz_recv, hz_acc,
               hz_ptr, hz_pairs, hz_out, hz_h, hz_tile, w_out):
    """Rounds [t0, t1) of one lane, updating the state arrays in place.

    Per-round inputs are indexed by ``t - t0`` (train, sendc, aggr, adopt: [R, N] bool;
    live: [R, M] bool or [0, 0]; u: [R, N], key: [R, E] or [0, 0]). H columns live in the ring
    buffer ``hz_C`` [N, width] (see :func:`_horizon_step`); the pairs of start t are
    hz_pairs[hz_ptr[t]:hz_ptr[t+1]] (hz_ptr has T+1 entries) and their H values go to hz_out.
    ``w_out`` [R, E] receives the weights when it has rows (tests), else [0, 0].
    """
    n = indptr.shape[0] - 1
    use_live = live.shape[0] > 0
    use_draws = u.shape[0] > 0
    rounded = prm[5] != 0.0
    big = np.iinfo(np.int64).max
    E = send.shape[0]
    lagv = np.empty(E)
    kmax = 1
    for i in range(n):
        kmax = max(kmax, indptr[i + 1] - indptr[i])
    m_ad = hz_tmp.shape[0]
    nz_row = np.empty(m_ad, np.int64)
    nz_len = np.empty(m_ad, np.int64)
    nz_j = np.empty((m_ad, kmax), np.int64)
    nz_w = np.empty((m_ad, kmax))
    for t in range(t0, t1):
        r = t - t0
        # ---- candidates, scores, weights, analyses and the state update, receiver by receiver
        sa = 0
        sl = 0.0
        for i in range(n):
            sa += ages[i]
            sl += lags[i]
        mean_age[t] = sa / n
        mean_lag[t] = sl / n
        for i in range(n):
            a = indptr[i]
            b = indptr[i + 1]
            agg_i = aggr[r, i]
            for e in range(a, b):
                j = send[e]
                if e == a:
                    c = agg_i
                else:
                    c = agg_i and sendc[r, j]
                    if c and use_live:
                        c = live[r, edge_id[e]]
                cand[e] = c
                lagv[e] = np.rint(lags[j]) if rounded else lags[j]
            u_i = u[r, i] if use_draws else 0.5
            key_r = key[r] if use_draws else lagv  # placeholder, unused when no draws
            _scores(rule, prm, t, a, b, send, cand, ages, lagv, counts, lcounts, q, u_i,
                    key_r, h)
            # normalise (SPEC §1): mask, row sum, identity rows where not adopting or all zero
            row = 0.0
            for e in range(a, b):
                v = h[e]
                if cand[e] and np.isfinite(v):
                    v = max(v, 0.0)
                else:
                    v = 0.0
                h[e] = v
                row += v
            ok = row > 0.0 and adopt[r, i]
            for e in range(a, b):
                if ok:
                    w[e] = h[e] / row
                else:
                    w[e] = 1.0 if e == a else 0.0
            # analyses (SPEC §9) on the state before the update
            n_nb = 0
            kept = 0
            amax = -1
            amin = big
            lmax = -np.inf
            lmin = np.inf
            nb_amax = -1
            for e in range(a, b):
                if cand[e]:
                    j = send[e]
                    if e != a:
                        n_nb += 1
                        if ages[j] > nb_amax:
                            nb_amax = ages[j]
                    if ages[j] > amax:
                        amax = ages[j]
                    if ages[j] < amin:
                        amin = ages[j]
                    if lags[j] > lmax:
                        lmax = lags[j]
                    if lags[j] < lmin:
                        lmin = lags[j]
                    if w[e] > 0.0:
                        kept += 1
            ad = adopt[r, i]
            agg = ad and n_nb >= 1
            returning = ad and ages[i] >= 1
            totals[8] += n_nb
            if returning:
                totals[1] += 1.0
            if agg:
                totals[0] += 1.0
                totals[4] += amax - amin
                totals[5] += lmax - lmin
                totals[6] += kept
                if returning:
                    totals[2] += 1.0
                    totals[7] += w[a]
                    if ages[i] > nb_amax:
                        totals[3] += 1.0
            # staleness update (SPEC §2), from the senders' state before the round
            not_trained = 0.0 if train[r, i] else 1.0
            if ad:
                mix = 0.0
                youngest = big
                inherited = 0
                for e in range(a, b):
                    j = send[e]
                    mix += w[e] * lags[j]
                    if w[e] > 0.0:
                        if ages[j] < youngest:
                            youngest = ages[j]
                        if counts[j] > inherited:
                            inherited = counts[j]
                new_lags[i] = mix + not_trained
                new_ages[i] = 0 if train[r, i] else youngest + 1
                new_counts[i] = inherited + (1 if train[r, i] else 0)
            else:
                new_lags[i] = lags[i] + not_trained
                new_ages[i] = 0 if train[r, i] else ages[i] + 1
                new_counts[i] = counts[i] + (1 if train[r, i] else 0)
            if agg_i:
                for e in range(a + 1, b):
                    x = (1.0 - Q_HAT_BETA) * q[e] + Q_HAT_BETA * (1.0 if cand[e] else 0.0)
                    q[e] = max(x, Q_HAT_FLOOR)
        if w_out.shape[0] > 0:
            w_out[r, :] = w
        # ---- the self-return H (SPEC §9): C <- W^t C on the adopters' rows, then the diagonal
        _horizon_step(t, n, indptr, send, w, adopt[r], hz_C, hz_tmp, hz_recv, hz_acc,
                      hz_ptr, hz_pairs, hz_out, hz_h, hz_tile, nz_row, nz_j, nz_w, nz_len)
        for i in range(n):
            ages[i] = new_ages[i]
            lags[i] = new_lags[i]
            counts[i] = new_counts[i]
            if train[r, i]:
                lcounts[i] += 1


@_jit
def _horizon_step(s, n, indptr, send, w, adopt, C, tmp, recv, acc, ptr, pairs, out, h, tile,
                  nz_row, nz_j, nz_w, nz_len):
    """One round of the self-return (SPEC §9).

    Every tracked (start t, receiver i) pair p is a column of C, started at e_i and multiplied
    by each later round's W; its entry i is then [W^{s−1}⋯W^{t+1}]_ii. Pairs are numbered in
    start order (start t owns pairs ptr[t]..ptr[t+1]−1) and pair p lives in column p mod
    width, so the live pairs always form one circular range of columns and the work is exactly
    (adopters' slots) × (live pairs): only adopters' rows change, the others are identity rows.
    Columns are processed in tiles of ``tile`` so that a tile of C stays in cache.
    """
    width = C.shape[1]
    if h <= 0 or width == 0:
        return
    T = ptr.shape[0] - 1
    lo = ptr[min(max(s - h + 1, 0), T)]
    hi = ptr[min(s, T)]
    if hi > lo:
        # the adopters' rows of W, nonzero entries only, in slot order
        n_ad = 0
        for i in range(n):
            if adopt[i]:
                nz_row[n_ad] = i
                d = 0
                for e in range(indptr[i], indptr[i + 1]):
                    if w[e] != 0.0:
                        nz_j[n_ad, d] = send[e]
                        nz_w[n_ad, d] = w[e]
                        d += 1
                nz_len[n_ad] = d
                n_ad += 1
        a0 = lo % width
        n_live = hi - lo
        # at most two contiguous column ranges
        for part in range(2):
            if part == 0:
                c_lo = a0
                c_hi = min(a0 + n_live, width)
            else:
                c_lo = 0
                c_hi = a0 + n_live - width
            for c0 in range(c_lo, c_hi, tile):
                c1 = min(c0 + tile, c_hi)
                m = c1 - c0
                for k in range(n_ad):
                    tk = tmp[k, :m]
                    x = C[nz_j[k, 0], c0:c1]
                    w0 = nz_w[k, 0]
                    for c in range(m):
                        tk[c] = w0 * x[c]
                    # two slots per pass (same summation order as one at a time)
                    d = 1
                    while d + 2 <= nz_len[k]:
                        w1 = nz_w[k, d]
                        x1 = C[nz_j[k, d], c0:c1]
                        w2 = nz_w[k, d + 1]
                        x2 = C[nz_j[k, d + 1], c0:c1]
                        for c in range(m):
                            tk[c] = (tk[c] + w1 * x1[c]) + w2 * x2[c]
                        d += 2
                    if d < nz_len[k]:
                        w1 = nz_w[k, d]
                        x1 = C[nz_j[k, d], c0:c1]
                        for c in range(m):
                            tk[c] += w1 * x1[c]
                for k in range(n_ad):
                    ci = C[nz_row[k], c0:c1]
                    tk = tmp[k, :m]
                    for c in range(m):
                        ci[c] = tk[c]
                for c in range(c0, c1):
                    acc[c] += C[recv[c], c]
    # start s − h + 1 has its h terms now
    f = s - h + 1
    if 0 <= f < T:
        for p in range(ptr[f], ptr[f + 1]):
            out[p] = acc[p % width]
    # start s begins: its columns are e_i
    if s < T:
        for p in range(ptr[s], ptr[s + 1]):
            c = p % width
            for i in range(n):
                C[i, c] = 0.0
            C[pairs[p], c] = 1.0
            recv[c] = pairs[p]
            acc[c] = 1.0
        if h == 1:
            for p in range(ptr[s], ptr[s + 1]):
                out[p] = acc[p % width]
