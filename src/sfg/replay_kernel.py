"""The compiled replay engine (SPEC §9): one lane's whole replay in a numba kernel.

The numpy engine (:func:`sfg.replay.replay_batch` with ``engine="numpy"``) runs the same round
code as the training simulator (:mod:`sfg.engine`), one vectorised numpy pass per round. At
N = 100 that pass is dominated by numpy's per-call overhead (about 60 calls a round), and the
self-return H by a sparse product per round. This module runs a lane's rounds in compiled
loops instead: :func:`run_rounds` takes, per receiver, its candidates, the rule's scores, the
shared normalisation (SPEC §1), the analyses and the staleness update (SPEC §2) in three
passes over its slots; :func:`horizon_rounds` then follows the self-return's (start,
receiver) pairs through those rounds' weights (SPEC §9), on disjoint sets of pairs in
parallel threads (the kernels release the GIL). The driver is
:func:`sfg.replay._replay_compiled`.

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
# params vector (rule_params): gamma, L, c (self-weight multiplier, 1 = none), base, ipw, rounded
# run_rounds adds into a totals vector in the order of sfg.replay._TOTALS: agg, returns,
# ret_nb, stalest, spread_age, spread_lag, kept, self_w, messages


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
def _rel(x, lo):
    """x − min over the candidates, 0 where not finite or within the tie tolerance (float)."""
    r = x - lo
    if np.isfinite(r) and r > TIE_TOL:
        return r
    return 0.0


@_jit
def _scores(rule, prm, t, indptr, cand, sa, lagv, sc, slc, q, u_r, key, red_i, red_f, h):
    """The rule's raw scores h over every receiver's segment (slot indptr[i] is receiver i),
    from per-slot ages ``sa``, lags ``lagv`` (rounded for +rounded), counts ``sc`` and local
    counts ``slc``, and each receiver's reductions over its candidates (``red_i``: amin,
    amax, amin_nb, amax_nb, cmax, cmax_nb, lcmax, kc, n_nb; ``red_f``: lmin, lmin_nb, ...).
    Mirrors sfg.rules.library. One call per round: numba passes arrays with reference
    counting, which costs more than a receiver's scores."""
    for i in range(indptr.shape[0] - 1):
        if red_i[i, 7] == 0:  # no candidates: the row is masked anyway
            continue
        _scores_one(rule, prm, t, indptr[i], indptr[i + 1], cand, sa, lagv, sc, slc, q,
                    u_r[i] if u_r.shape[0] > 0 else 0.5, key, red_i[i, 0], red_i[i, 2],
                    red_f[i, 0], red_f[i, 1], red_i[i, 4], red_i[i, 5], red_i[i, 6],
                    red_i[i, 7], red_i[i, 8], h)


@_jit(inline="always")
def _scores_one(rule, prm, t, a, b, cand, sa, lagv, sc, slc, q, u_i, key, amin, amin_nb, lmin,
                lmin_nb, cmax, cmax_nb, lcmax, kc, n_nb, h):
    """One receiver's raw scores h[a:b] (slot a is the receiver)."""
    gamma = prm[0]
    L = prm[1]
    # one loop per rule (the switch stays outside the slot loop)
    if rule == 0:  # sfg
        for e in range(a, b):
            h[e] = _pow(gamma, float(sa[e] - amin))
    elif rule == 1:  # sfg-l
        for e in range(a, b):
            h[e] = _pow(gamma, _rel(lagv[e], lmin))
    elif rule == 2:  # sfg-cut
        for e in range(a, b):
            h[e] = max(1.0 + t - lagv[e], 0.0) if _rel(lagv[e], lmin) <= L + TIE_TOL else 0.0
    elif rule == 3:  # sfg-counts
        for e in range(a, b):
            h[e] = _pow(gamma, float(cmax - sc[e]))
    elif rule == 4 or rule == 11 or rule == 12:  # dfedavg, update-amplification, self-weight
        for e in range(a, b):
            h[e] = 1.0
    elif rule == 5:  # local
        h[a] = 1.0
        for e in range(a + 1, b):
            h[e] = 0.0
    elif rule == 6:  # aoi
        h[a] = 1.0
        for e in range(a + 1, b):
            h[e] = _pow(gamma, float(sa[e]))
    elif rule == 7:  # dfl-aa
        h[a] = 1.0
        for e in range(a + 1, b):
            h[e] = _pow(gamma, float(sa[e] - amin_nb)) / q[e]
    elif rule == 8:  # gl-age
        for e in range(a, b):
            h[e] = float(sc[e])
    elif rule == 9:  # limited-merging
        for e in range(a, b):
            h[e] = float(sc[e]) if sc[e] >= cmax - L else 0.0
    elif rule == 10:  # local-counts
        for e in range(a, b):
            h[e] = float(slc[e]) if slc[e] >= lcmax - L else 0.0
    elif rule == 13 or rule == 14:  # self-only, reset-on-return
        tau = sa[a]
        h[a] = _pow(prm[3], float(tau)) if (tau >= 1 and n_nb >= 1) else 1.0
        for e in range(a + 1, b):
            h[e] = 1.0
    elif rule == 15:  # neighbour-only-lags
        h[a] = 1.0
        for e in range(a + 1, b):
            h[e] = _pow(gamma, _rel(lagv[e], lmin_nb))
    elif rule == 16:  # neighbour-only-counts
        h[a] = 1.0
        for e in range(a + 1, b):
            h[e] = _pow(gamma, float(cmax_nb - sc[e]))
    elif rule == 17:  # pinned-receiver
        h[a] = 1.0
        for e in range(a + 1, b):
            h[e] = _pow(gamma, _rel(lagv[e], lmin))
    elif rule == 18:  # copy-random: one candidate drawn uniformly
        pick = min(int(np.floor(u_i * kc)), max(kc - 1, 0))
        before = 0
        for e in range(a, b):
            h[e] = 1.0 if before == pick else 0.0
            if cand[e]:
                before += 1
    elif rule == 20:  # cut-ages
        for e in range(a, b):
            h[e] = 1.0 if sa[e] - amin <= 1 else 0.0
    elif rule == 21:  # receiver-kept
        h[a] = max(1.0 + t - lagv[a], 0.0)
        for e in range(a + 1, b):
            h[e] = max(1.0 + t - lagv[e], 0.0) if _rel(lagv[e], lmin) <= L + TIE_TOL else 0.0
    if rule == 19:
        kept = 0
        for e in range(a, b):
            if cand[e] and _rel(lagv[e], lmin) <= L + TIE_TOL and 1.0 + t - lagv[e] > 0.0:
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


@_jit
def run_rounds(t0, t1, rule, prm, indptr, send, edge_id, train, sendc, aggr, adopt, live,
               u, key, ages, lags, counts, lcounts, q, new_ages, new_lags, new_counts,
               h, w, cand, totals, mean_age, mean_lag, w_out):
    """Rounds [t0, t1) of one lane, updating the state arrays in place.

    Per-round inputs are indexed by ``t - t0`` (train, sendc, aggr, adopt: [R, N] bool;
    live: [R, M] bool or [0, 0]; u: [R, N], key: [R, E] or [0, 0]).
    ``w_out`` [R, E] receives the weights when it has rows (for the self-return and tests),
    else [0, 0].

    Each receiver takes three passes over its slots: candidates, gathered staleness and
    reductions; scores, modifiers and the masked row sum; weights, analyses and the update.
    """
    n = indptr.shape[0] - 1
    use_live = live.shape[0] > 0
    use_draws = u.shape[0] > 0
    rounded = prm[5] != 0.0
    ipw = prm[4] != 0.0
    c_self = prm[2]
    big = np.iinfo(np.int64).max
    small = np.iinfo(np.int64).min
    E = send.shape[0]
    sa = np.empty(E, np.int64)
    sc = np.empty(E, np.int64)
    slc = np.empty(E, np.int64)
    sl = np.empty(E)
    lagv = np.empty(E)
    red_i = np.empty((n, 9), np.int64)
    red_f = np.empty((n, 4))
    no_u = np.empty(0)
    for t in range(t0, t1):
        r = t - t0
        sum_a = 0
        sum_l = 0.0
        for i in range(n):
            sum_a += ages[i]
            sum_l += lags[i]
        mean_age[t] = sum_a / n
        mean_lag[t] = sum_l / n
        for i in range(n):
            a = indptr[i]
            b = indptr[i + 1]
            agg_i = aggr[r, i]
            ad = adopt[r, i]
            red_i[i, 7] = 0
            if not agg_i:
                # no candidate set: identity row, nothing to score (adopting implies
                # aggregating in every anatomy mode)
                for e in range(a, b):
                    cand[e] = False
                continue
            # pass 1: candidates S_i^t, the senders' staleness, reductions over candidates
            kc = 0
            n_nb = 0
            amin = big
            amax = -1
            amin_nb = big
            amax_nb = -1
            lmin = np.inf
            lmin_nb = np.inf
            lraw_min = np.inf
            lraw_max = -np.inf
            cmax = small
            cmax_nb = small
            lcmax = small
            for e in range(a, b):
                j = send[e]
                if e == a:
                    c = agg_i
                else:
                    c = agg_i and sendc[r, j]
                    if c and use_live:
                        c = live[r, edge_id[e]]
                cand[e] = c
                ag = ages[j]
                lg = lags[j]
                ct = counts[j]
                lc = lcounts[j]
                lv = np.rint(lg) if rounded else lg
                sa[e] = ag
                sl[e] = lg
                sc[e] = ct
                slc[e] = lc
                lagv[e] = lv
                if c:
                    kc += 1
                    amin = min(amin, ag)
                    amax = max(amax, ag)
                    lmin = min(lmin, lv)
                    lraw_min = min(lraw_min, lg)
                    lraw_max = max(lraw_max, lg)
                    cmax = max(cmax, ct)
                    lcmax = max(lcmax, lc)
                    if e != a:
                        n_nb += 1
                        amin_nb = min(amin_nb, ag)
                        amax_nb = max(amax_nb, ag)
                        lmin_nb = min(lmin_nb, lv)
                        cmax_nb = max(cmax_nb, ct)
            red_i[i, 0] = amin
            red_i[i, 1] = amax
            red_i[i, 2] = amin_nb
            red_i[i, 3] = amax_nb
            red_i[i, 4] = cmax
            red_i[i, 5] = cmax_nb
            red_i[i, 6] = lcmax
            red_i[i, 7] = kc
            red_i[i, 8] = n_nb
            red_f[i, 0] = lmin
            red_f[i, 1] = lmin_nb
            red_f[i, 2] = lraw_min
            red_f[i, 3] = lraw_max
        # pass 2: the rule's scores, for every receiver at once
        _scores(rule, prm, t, indptr, cand, sa, lagv, sc, slc, q, u[r] if use_draws else no_u,
                key[r] if use_draws else lagv, red_i, red_f, h)
        for i in range(n):
            a = indptr[i]
            b = indptr[i + 1]
            agg_i = aggr[r, i]
            ad = adopt[r, i]
            trained = train[r, i]
            not_trained = 0.0 if trained else 1.0
            # the staleness update (SPEC §2) of a client that keeps its model; an adopter's is
            # overwritten in pass 3
            new_lags[i] = lags[i] + not_trained
            new_ages[i] = 0 if trained else ages[i] + 1
            new_counts[i] = counts[i] + (1 if trained else 0)
            if not agg_i:
                w[a] = 1.0
                for e in range(a + 1, b):
                    w[e] = 0.0
                continue
            amin = red_i[i, 0]
            amax = red_i[i, 1]
            amax_nb = red_i[i, 3]
            n_nb = red_i[i, 8]
            lraw_min = red_f[i, 2]
            lraw_max = red_f[i, 3]
            # modifiers, masked to candidates, row sum (SPEC §1)
            row = 0.0
            for e in range(a, b):
                v = h[e]
                if e == a:
                    if c_self != 1.0:
                        v = v * c_self
                elif ipw:
                    v = v / q[e]
                if cand[e] and np.isfinite(v):
                    v = max(v, 0.0)
                else:
                    v = 0.0
                h[e] = v
                row += v
            ok = row > 0.0 and ad
            # pass 3: weights (identity rows where not adopting or all zero), kept candidates,
            # the staleness update (SPEC §2) from the senders' state before the round, and q̂
            kept = 0
            mix = 0.0
            youngest = big
            inherited = 0
            for e in range(a, b):
                if ok:
                    we = h[e] / row
                else:
                    we = 1.0 if e == a else 0.0
                w[e] = we
                if we > 0.0:
                    if cand[e]:
                        kept += 1
                    youngest = min(youngest, sa[e])
                    inherited = max(inherited, sc[e])
                mix += we * sl[e]
                if agg_i and e != a:
                    x = (1.0 - Q_HAT_BETA) * q[e] + Q_HAT_BETA * (1.0 if cand[e] else 0.0)
                    q[e] = max(x, Q_HAT_FLOOR)
            if ad:
                new_lags[i] = mix + not_trained
                new_ages[i] = 0 if trained else youngest + 1
                new_counts[i] = inherited + (1 if trained else 0)
            # analyses (SPEC §9) on the state before the update
            agg = ad and n_nb >= 1
            returning = ad and ages[i] >= 1
            totals[8] += n_nb
            if returning:
                totals[1] += 1.0
            if agg:
                totals[0] += 1.0
                totals[4] += amax - amin
                totals[5] += lraw_max - lraw_min
                totals[6] += kept
                if returning:
                    totals[2] += 1.0
                    totals[7] += w[a]
                    if ages[i] > amax_nb:
                        totals[3] += 1.0
        if w_out.shape[0] > 0:
            w_out[r, :] = w
        for i in range(n):
            ages[i] = new_ages[i]
            lags[i] = new_lags[i]
            counts[i] = new_counts[i]
            if train[r, i]:
                lcounts[i] += 1


@_jit(inline="always")
def _row_tile(C, tk, js, ws, ln, c0, c1):
    """tk = Σ_d ws[d]·C[js[d], c0:c1] over d < ln, summed in order d = 0, 1, … (as one
    accumulation at a time would), up to four rows per pass over tk."""
    m = c1 - c0
    x0 = C[js[0], c0:c1]
    w0 = ws[0]
    if ln == 1:
        for c in range(m):
            tk[c] = w0 * x0[c]
        return
    x1 = C[js[1], c0:c1]
    w1 = ws[1]
    if ln == 2:
        for c in range(m):
            tk[c] = w0 * x0[c] + w1 * x1[c]
        return
    x2 = C[js[2], c0:c1]
    w2 = ws[2]
    if ln == 3:
        for c in range(m):
            tk[c] = (w0 * x0[c] + w1 * x1[c]) + w2 * x2[c]
        return
    x3 = C[js[3], c0:c1]
    w3 = ws[3]
    for c in range(m):
        tk[c] = ((w0 * x0[c] + w1 * x1[c]) + w2 * x2[c]) + w3 * x3[c]
    d = 4
    while d + 4 <= ln:
        x0 = C[js[d], c0:c1]
        x1 = C[js[d + 1], c0:c1]
        x2 = C[js[d + 2], c0:c1]
        x3 = C[js[d + 3], c0:c1]
        w0 = ws[d]
        w1 = ws[d + 1]
        w2 = ws[d + 2]
        w3 = ws[d + 3]
        for c in range(m):
            tk[c] = (((tk[c] + w0 * x0[c]) + w1 * x1[c]) + w2 * x2[c]) + w3 * x3[c]
        d += 4
    while d < ln:
        x0 = C[js[d], c0:c1]
        w0 = ws[d]
        for c in range(m):
            tk[c] = tk[c] + w0 * x0[c]
        d += 1


@_jit
def horizon_rounds(t0, t1, indptr, send, w, adopt, C, rowbuf, spare, recv, acc, ptr, pairs,
                   out, h, tile):
    """The self-return's rounds [t0, t1) for one set of (start, receiver) pairs, from the
    weights ``w`` [R, E] and adopters ``adopt`` [R, N] of those rounds (row t − t0).

    The pairs of start t are pairs[ptr[t]:ptr[t+1]] (ptr has T+1 entries); their H values go
    to ``out``. Disjoint sets of pairs are independent, so several threads can each run one
    (the kernel releases the GIL)."""
    n = indptr.shape[0] - 1
    kmax = 1
    for i in range(n):
        kmax = max(kmax, indptr[i + 1] - indptr[i])
    m_ad = spare.shape[0]
    nz_row = np.empty(m_ad, np.int64)
    nz_len = np.empty(m_ad, np.int64)
    nz_j = np.empty((m_ad, kmax), np.int64)
    nz_w = np.empty((m_ad, kmax))
    for t in range(t0, t1):
        _horizon_step(t, n, indptr, send, w[t - t0], adopt[t - t0], C, rowbuf, spare, recv, acc,
                      ptr, pairs, out, h, tile, nz_row, nz_j, nz_w, nz_len)


@_jit(inline="always")
def _arc(start, count, width, part):
    """Part 0 or 1 of the circular column range of ``count`` columns from ``start`` (mod
    ``width``) as a [lo, hi) pair; part 1 is empty unless the range wraps."""
    if part == 0:
        return start, min(start + count, width)
    return 0, max(start + count - width, 0)


@_jit
def _horizon_step(s, n, indptr, send, w, adopt, C, rowbuf, spare, recv, acc, ptr, pairs, out,
                  h, tile, nz_row, nz_j, nz_w, nz_len):
    """One round of the self-return (SPEC §9).

    Every tracked (start t, receiver i) pair p is a column of the matrix X, started at e_i and
    multiplied by each later round's W; its entry i is then [W^{s−1}⋯W^{t+1}]_ii. Pairs are
    numbered in start order (start t owns pairs ptr[t]..ptr[t+1]−1) and pair p lives in
    column p mod width, so the live pairs always form one circular range of columns and the
    work is exactly (adopters' nonzero weights) × (live pairs): only adopters' rows change,
    the others are identity rows.

    Row i of X is row ``rowbuf[i]`` of the pool ``C``; an adopter's new row is written into a
    spare pool row, which then takes the old row's place (no copy). Columns are processed in
    tiles of ``tile`` so that a tile of the rows stays in cache.
    """
    width = C.shape[1]
    if h <= 0 or width == 0:
        return
    T = ptr.shape[0] - 1
    lo = ptr[min(max(s - h + 1, 0), T)]
    hi = ptr[min(s, T)]
    if hi > lo:
        # the adopters' rows of W, nonzero entries only, in slot order, as pool rows
        n_ad = 0
        for i in range(n):
            if adopt[i]:
                nz_row[n_ad] = i
                d = 0
                for e in range(indptr[i], indptr[i + 1]):
                    if w[e] != 0.0:
                        nz_j[n_ad, d] = rowbuf[send[e]]
                        nz_w[n_ad, d] = w[e]
                        d += 1
                nz_len[n_ad] = d
                n_ad += 1
        a0 = lo % width
        n_live = hi - lo
        for part in range(2):  # the live columns: at most two contiguous ranges
            c_lo, c_hi = _arc(a0, n_live, width, part)
            for c0 in range(c_lo, c_hi, tile):
                c1 = min(c0 + tile, c_hi)
                for k in range(n_ad):
                    _row_tile(C, C[spare[k], c0:c1], nz_j[k], nz_w[k], nz_len[k], c0, c1)
        for k in range(n_ad):
            i = nz_row[k]
            old = rowbuf[i]
            rowbuf[i] = spare[k]
            spare[k] = old
        # the diagonal entries (no modulo in the loop: an integer division costs ~30 cycles)
        for part in range(2):
            c_lo, c_hi = _arc(a0, n_live, width, part)
            for c in range(c_lo, c_hi):
                acc[c] += C[rowbuf[recv[c]], c]
    # start s − h + 1 has its h terms now
    f = s - h + 1
    if 0 <= f < T:
        c = ptr[f] % width
        for p in range(ptr[f], ptr[f + 1]):
            out[p] = acc[c]
            c += 1
            if c == width:
                c = 0
    # start s begins: its columns are e_i (zeroed row by row, contiguous)
    if s < T and ptr[s + 1] > ptr[s]:
        b0 = ptr[s] % width
        nb = ptr[s + 1] - ptr[s]
        for part in range(2):
            c_lo, c_hi = _arc(b0, nb, width, part)
            if c_hi > c_lo:
                for i in range(n):
                    row = C[rowbuf[i], c_lo:c_hi]
                    for c in range(c_hi - c_lo):
                        row[c] = 0.0
        c = b0
        for p in range(ptr[s], ptr[s + 1]):
            C[rowbuf[pairs[p]], c] = 1.0
            recv[c] = pairs[p]
            acc[c] = 1.0
            if h == 1:
                out[p] = 1.0
            c += 1
            if c == width:
                c = 0
