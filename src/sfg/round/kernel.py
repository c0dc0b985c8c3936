"""THE round (SPEC §1, §2, §9): candidates → weights → staleness update → per-receiver facts.

One compiled function, :func:`_round`, plays a whole round for every receiver: it forms the
candidate set S_i^t (anatomy modes through the round's capabilities, link failures), gathers
the candidates' staleness into short arrays (index 0 = the receiver), calls the rule's compiled
one-receiver function, applies the modifiers and the shared normalisation (:func:`_weights`:
``c``, ``+ipw``, non-finite or negative scores → 0, all-zero rows and non-adopters keep their
own model), updates the staleness state (ages, lags, counts, local counts, q̂) and records
the facts that the replay analyses (SPEC §9) are computed from (:data:`FACTS`).

:func:`play_round` wraps it for one round; the replay (:mod:`sfg.replay`), the training
simulator (:mod:`sfg.sim`) and :meth:`sfg.round.rules.Rule.weights_one` (through
:func:`one_receiver`, which runs the same :func:`_weights`) all call it.

Specialisation: :func:`kernels` makes, per rule, numba copies of :func:`_weights` and
:func:`_round` with that rule's function bound as a global, cached on disk under a name
that includes the rule's name and a hash of its bytecode (numba caches a kernel that takes a
dispatcher *argument* under the dispatcher's address, i.e. never across processes). A command
therefore loads only the rules it uses. Numba's cache does not see edits to helpers a rule
calls; after changing one, clear ``__pycache__`` (as for any numba cache).
"""

from __future__ import annotations

import hashlib
import re
import types
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numba import njit
from numpy.typing import ArrayLike

from sfg.round.defences import CAP, GUARD, cap_weights, clamp_claims
from sfg.round.slots import RoundGraph
from sfg.round.staleness import Q_HAT_BETA, Q_HAT_FLOOR, StalenessState
from sfg.util.rng import stream
from sfg.world.outages.anatomy import Capabilities

if TYPE_CHECKING:
    from sfg.round.rules import Rule

Candidates = namedtuple("Candidates", ["t", "u", "age", "lag", "count", "local_count", "q",
                                       "degree", "key", "given"])
Candidates.__doc__ = """One receiver's candidates as a rule sees them (index 0 = the receiver).

t: round index; u: the receiver's uniform draw (random rules); age [k] int64; lag [k] float64
(rounded under +rounded); count [k] int64 max-inherited; local_count [k] int64; q [k] float64
q̂_ij (q[0] = 1); degree [k] int64 live-neighbour counts; key [k] float64 uniform keys (random
rules); given [k] float64 scores computed outside (model-reading rules, oracles)."""

# Per-receiver facts of a round, on the state before it (SPEC §9); metrics are defined on them
# in sfg.replay.metrics.
FACTS = ("adopt", "age", "lag", "neighbours", "max_neighbour_age", "spread_age", "spread_lag",
         "kept", "self_weight", "attacker_weight", "honest", "clamped")
(F_ADOPT, F_AGE, F_LAG, F_NB, F_MAX_NB_AGE, F_SPREAD_AGE, F_SPREAD_LAG, F_KEPT,
 F_SELF_W, F_ATT_W, F_HONEST, F_CLAMPED) = range(len(FACTS))

_EMPTY_F = np.zeros(0)
_EMPTY_I = np.zeros(0, np.int64)
_EMPTY_B = np.zeros(0, bool)


# ----------------------------------------------------------------------------- compiled parts
def _weights(x, params, c_self, ipw, adopt, w):  # pragma: no cover - compiled per rule
    """One receiver's weights, written to ``w`` [k] and returned: the rule's scores, the
    modifiers (base self-weight c on the receiver, +ipw on neighbours), non-finite or negative
    scores → 0, then the shared normalisation (SPEC §1); an all-zero row, or a receiver that
    does not adopt, keeps its own model (w_ii = 1). ``rule`` is bound per rule by
    :func:`kernels`."""
    h = call_rule(x, params)  # type: ignore[name-defined]  # noqa: F821 - bound by kernels()
    k = x.age.shape[0]
    row = 0.0
    for d in range(k):
        v = h[d]
        if d == 0:
            if c_self != 1.0:
                v = v * c_self
        elif ipw:
            v = v / x.q[d]
        if not (np.isfinite(v) and v > 0.0):
            v = 0.0
        w[d] = v
        row += v
    if row > 0.0 and adopt:
        for d in range(k):
            w[d] = w[d] / row
    else:
        w[:] = 0.0
        w[0] = 1.0
    return w


def _round(t, params, c_self, ipw, rounded, indptr, send, edge_id, train, sends, aggregates,
           adopts, live, u, key, given, slot_age, slot_lag, slot_count, extra,
           defence, margin, kappa, attackers, frozen, versions, ev_ver, ev_first,
           ages, lags, counts, local_counts, q, w, cand, facts):  # pragma: no cover - compiled
    """Round t for every receiver, updating the state arrays in place (SPEC §1, §2).

    Capabilities train/sends/aggregates/adopts [N] bool; live [M] bool per undirected edge or
    empty (all live); u [N], key [E] the rule's draws or empty; given [E] scores computed
    outside, or empty; slot_age/slot_lag/slot_count [E] staleness delivered by each slot
    (remembered models) or empty (the sender's); extra [E] bool slots that are candidates
    besides the live ones (remembered models) or empty. State: ages, lags, counts,
    local_counts [N], q [E]. Out: w [E] weights, cand [E] candidate slots, facts [N, F].

    Forged claims (:mod:`sfg.round.attacks`) arrive as slot_age/slot_lag/slot_count. Defences
    (:mod:`sfg.round.defences`): ``defence`` flags, ``margin``, ``kappa``; ``+guard`` keeps its
    evidence in versions [N] (content versions; ``frozen`` [N] bool or empty: senders whose
    content never changes) and ev_ver/ev_first [E] (version last seen per slot, round first
    seen), updated in place. attackers [N] bool or empty: for the damage facts.
    """
    n = indptr.shape[0] - 1
    use_live = live.shape[0] > 0
    use_u = u.shape[0] > 0
    use_key = key.shape[0] > 0
    use_given = given.shape[0] > 0
    use_slot = slot_age.shape[0] > 0
    use_extra = extra.shape[0] > 0
    kmax = 1
    for i in range(n):
        kmax = max(kmax, indptr[i + 1] - indptr[i])
    b_slot = np.empty(kmax, np.int64)
    b_age = np.empty(kmax, np.int64)
    b_lag = np.empty(kmax)
    b_raw = np.empty(kmax)
    b_count = np.empty(kmax, np.int64)
    b_local = np.empty(kmax, np.int64)
    b_q = np.empty(kmax)
    b_deg = np.empty(kmax, np.int64)
    b_key = np.zeros(kmax)
    b_given = np.ones(kmax)
    b_w = np.empty(kmax)
    b_min_age = np.zeros(kmax, np.int64)
    guard = (defence & GUARD) != 0
    use_att = attackers.shape[0] > 0
    # live-neighbour counts d_j (whether or not j aggregates)
    degree = np.zeros(n, np.int64)
    for i in range(n):
        for e in range(indptr[i] + 1, indptr[i + 1]):
            if sends[send[e]] and (not use_live or live[edge_id[e]]):
                degree[i] += 1
    new_age = np.empty(n, np.int64)
    new_lag = np.empty(n)
    new_count = np.empty(n, np.int64)
    for i in range(n):
        a = indptr[i]
        b = indptr[i + 1]
        trained = train[i]
        not_trained = 0.0 if trained else 1.0
        # a client that keeps its model (overwritten below for adopters)
        new_lag[i] = lags[i] + not_trained
        new_age[i] = 0 if trained else ages[i] + 1
        new_count[i] = counts[i] + (1 if trained else 0)
        facts[i, :] = 0.0
        facts[i, F_AGE] = ages[i]
        facts[i, F_LAG] = lags[i]
        facts[i, F_MAX_NB_AGE] = -1.0
        facts[i, F_SELF_W] = 1.0
        facts[i, F_HONEST] = 0.0 if (use_att and attackers[i]) else 1.0
        for e in range(a, b):
            w[e] = 0.0
            cand[e] = False
        w[a] = 1.0
        if not aggregates[i]:
            continue  # no candidate set: identity row (adopting implies aggregating)
        # candidates S_i^t (the receiver first), their staleness gathered
        k = 0
        n_nb = 0
        for e in range(a, b):
            j = send[e]
            c = e == a or (sends[j] and (not use_live or live[edge_id[e]]))
            cand[e] = c
            if not (c or (use_extra and extra[e])):
                continue
            b_slot[k] = e
            b_age[k] = slot_age[e] if use_slot else ages[j]
            b_raw[k] = slot_lag[e] if use_slot else lags[j]
            b_lag[k] = np.rint(b_raw[k]) if rounded else b_raw[k]
            b_count[k] = slot_count[e] if use_slot else counts[j]
            b_local[k] = local_counts[j]
            b_q[k] = 1.0 if e == a else q[e]
            b_deg[k] = degree[j]
            if use_key:
                b_key[k] = key[e]
            if use_given:
                b_given[k] = given[e]
            b_min_age[k] = 0
            if guard and c and e != a:  # evidence: the content last seen over this slot
                if ev_ver[e] == versions[j]:
                    b_min_age[k] = t - ev_first[e]
                else:
                    ev_ver[e] = versions[j]
                    ev_first[e] = t
            if c and e != a:
                n_nb += 1
            k += 1
        n_clamped = 0
        if defence != 0:
            n_clamped = clamp_claims(t, defence, margin, k, b_age, b_raw, b_count, b_min_age)
            for d in range(k):
                b_lag[d] = np.rint(b_raw[d]) if rounded else b_raw[d]
        x = Candidates(t, u[i] if use_u else 0.5, b_age[:k], b_lag[:k], b_count[:k],
                       b_local[:k], b_q[:k], b_deg[:k], b_key[:k], b_given[:k])
        wk = receiver_weights(x, params, c_self, ipw, adopts[i], b_w[:k])  # type: ignore[name-defined]  # noqa: F821
        if (defence & CAP) != 0 and adopts[i]:
            cap_weights(wk, kappa)
        # weights, the staleness update of an adopter (SPEC §2), facts (SPEC §9)
        mix = 0.0
        youngest = np.iinfo(np.int64).max
        inherited = 0
        kept = 0
        amin = np.iinfo(np.int64).max
        amax = -1
        lmin = np.inf
        lmax = -np.inf
        max_nb_age = -1
        att_w = 0.0
        for d in range(k):
            e = b_slot[d]
            w[e] = wk[d]
            if use_att and d > 0 and attackers[send[e]]:
                att_w += wk[d]
            mix += wk[d] * b_raw[d]
            if wk[d] > 0.0:
                youngest = min(youngest, b_age[d])
                inherited = max(inherited, b_count[d])
                if cand[e]:
                    kept += 1
            if cand[e]:
                amin = min(amin, b_age[d])
                amax = max(amax, b_age[d])
                lmin = min(lmin, b_raw[d])
                lmax = max(lmax, b_raw[d])
                if d > 0:
                    max_nb_age = max(max_nb_age, b_age[d])
        if adopts[i]:
            new_lag[i] = mix + not_trained
            new_age[i] = 0 if trained else youngest + 1
            new_count[i] = inherited + (1 if trained else 0)
        for e in range(a + 1, b):
            q[e] = max((1.0 - Q_HAT_BETA) * q[e] + Q_HAT_BETA * (1.0 if cand[e] else 0.0),
                       Q_HAT_FLOOR)
        facts[i, F_ADOPT] = 1.0 if adopts[i] else 0.0
        facts[i, F_NB] = n_nb
        facts[i, F_MAX_NB_AGE] = max_nb_age
        facts[i, F_SPREAD_AGE] = amax - amin
        facts[i, F_SPREAD_LAG] = lmax - lmin
        facts[i, F_KEPT] = kept
        facts[i, F_SELF_W] = w[a]
        facts[i, F_ATT_W] = att_w
        facts[i, F_CLAMPED] = n_clamped
    if guard:  # content versions: a model changes when trained or mixed with others
        for i in range(n):
            if (train[i] or (adopts[i] and w[indptr[i]] < 1.0)) and not (
                    frozen.shape[0] > 0 and frozen[i]):
                versions[i] += 1
    for i in range(n):
        ages[i] = new_age[i]
        lags[i] = new_lag[i]
        counts[i] = new_count[i]
        if train[i]:
            local_counts[i] += 1


def _rounds(t0, params, c_self, ipw, rounded, indptr, send, edge_id, train, sends, aggregates,
            adopts, live, u, key, defence, margin, kappa, versions, ev_ver, ev_first,
            ages, lags, counts, local_counts, q, w, facts):  # pragma: no cover
    """Rounds t0, t0 + 1, … of a replay, one :func:`_round` each (per-round inputs and outputs
    are rows r = t − t0: train/sends/aggregates/adopts [R, N], live [R, M] or [0, 0], u [R, N]
    and key [R, E] or [0, 0], w [R, E], facts [R, N, F]); saves a Python call per round.
    Defences as in :func:`_round` (no attack: claims are the senders' own state)."""
    no_b = np.zeros(0, np.bool_)
    no_f = np.zeros(0)
    no_i = np.zeros(0, np.int64)
    cand = np.empty(send.shape[0], np.bool_)
    for r in range(train.shape[0]):
        live_r = live[r] if live.shape[0] > 0 else no_b
        u_r = u[r] if u.shape[0] > 0 else no_f
        key_r = key[r] if key.shape[0] > 0 else no_f
        round_(t0 + r, params, c_self, ipw, rounded, indptr, send, edge_id, train[r],  # type: ignore[name-defined]  # noqa: F821 - bound by kernels()
               sends[r], aggregates[r], adopts[r], live_r, u_r, key_r, no_f,
               no_i, no_f, no_i, no_b, defence, margin, kappa, no_b, no_b, versions, ev_ver,
               ev_first, ages, lags, counts, local_counts, q, w[r], cand, facts[r])


def _given(x):  # pragma: no cover - compiled
    """Scores computed outside the round (model-reading rules, oracles)."""
    return x.given


given_scores = njit(cache=True)(_given)
_KERNELS: dict[object, tuple] = {}


def _specialise(fn: Callable[..., Any], tag: str, inline: Literal["never", "always"] = "never",
                **bind: Any) -> Callable[..., Any]:
    g = dict(fn.__globals__)
    g.update(bind)
    f = types.FunctionType(fn.__code__, g, f"{fn.__name__}__{tag}")
    f.__qualname__ = f.__name__
    f.__doc__ = fn.__doc__
    return njit(cache=True, nogil=True, inline=inline)(f)


def _rule_call(fn):
    """``call_rule(x, params)`` = ``fn(x, *params)`` with the parameters spelled out, the rule
    inlined into it (numba inlines no call with ``*args``); ``fn``: a rule's dispatcher."""
    import inspect

    py = getattr(fn, "py_func", None)
    if py is None:
        return fn
    arity = len(inspect.signature(py).parameters) - 1
    args = "".join(f", params[{k}]" for k in range(arity))
    ns = {"rule": njit(inline="always")(py)}
    exec(f"def call_rule(x, params):\n    return rule(x{args})\n", ns)  # noqa: S102
    return njit(inline="always")(ns["call_rule"])


def kernels(fn: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[..., Any],
                                           Callable[..., Any]]:
    """(weights, round, rounds) compiled for the rule function ``fn`` (loaded from numba's cache when
    there), made once per process."""
    got = _KERNELS.get(fn)
    if got is None:
        from sfg.round.jit import materialise

        py = getattr(fn, "py_func", fn)
        fn_key, fn = fn, materialise(fn)
        code = py.__code__
        digest = hashlib.sha1(code.co_code + repr(code.co_consts).encode()
                              + repr(code.co_names).encode()).hexdigest()[:10]
        name = re.sub(r"\W", "_", f"{py.__module__}_{py.__qualname__}")
        tag = f"{name}_{digest}"
        call = _rule_call(fn)
        wk = _specialise(_weights, tag, call_rule=call)
        # the round inlines the weights and the rule (no per-receiver call that passes the
        # candidates' arrays, each reference-counted: about 150 ns a receiver)
        rk = _specialise(_round, tag + "_i", receiver_weights=_specialise(
            _weights, tag + "_in", inline="always", call_rule=call))
        got = (wk, rk, _specialise(_rounds, tag, round_=rk))
        _KERNELS[fn_key] = got
    return got


# ----------------------------------------------------------------------------- Python side
def caps_at(caps: Capabilities, t: int) -> Capabilities:
    """Round ``t``'s capabilities ([N] each) out of whole-trace capabilities ([T, N] each)."""
    return Capabilities(caps.train[t], caps.send[t], caps.aggregate[t], caps.adopt[t])


def candidate_mask(rg: RoundGraph, caps: Capabilities, live: np.ndarray | None = None) -> np.ndarray:
    """S_i^t as a slot mask, for callers that score before the round (model-reading rules,
    oracles): {i} ∪ {j ∈ N(i): j sends and link (i, j) is live}, for receivers that aggregate.
    The same set as the round's own (tested)."""
    nb = caps.send[rg.send]
    if live is not None and live.size:
        nb = nb & live[np.maximum(rg.edge_id, 0)]
    return caps.aggregate[rg.recv] & (rg.is_self | nb)


def rule_draws(seed: int, t: int, n: int, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """A random rule's own draws of round ``t``: one uniform per client ([n]) and one key
    per slot ([n_slots]), from the stream keyed by the seed and the round."""
    g = stream(seed, "rule-draws", t)
    return g.random(n), g.random(n_slots)


@dataclass(frozen=True)
class RoundResult:
    """What one round did.

    weights:   [E] float64 slot weights (rows sum to 1; identity rows for non-adopters)
    candidate: [E] bool    slots in S_i^t (empty rows for clients that do not aggregate)
    state:     the staleness state after the round (SPEC §2)
    facts:     [N, len(FACTS)] float64 per-receiver facts on the state before the round
    """

    weights: np.ndarray
    candidate: np.ndarray
    state: StalenessState
    facts: np.ndarray


def play_round(rule: Rule, rg: RoundGraph, state: StalenessState, caps: Capabilities, *, seed: int,
               live: np.ndarray | None = None, scores: np.ndarray | None = None,
               slot_staleness: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
               extra: np.ndarray | None = None, weights_out: np.ndarray | None = None,
               facts_out: np.ndarray | None = None, attackers: np.ndarray | None = None,
               frozen: np.ndarray | None = None) -> RoundResult:
    """Round ``state.t`` of ``rule`` (a :class:`~sfg.round.rules.Rule`): weights and the next state.

    caps: this round's capabilities ([N] each); live: [M] bool link states or None.
    scores: [E] scores computed outside the round (model-reading rules); oracle rules get
    theirs from A here. slot_staleness: (ages, lags, counts) [E] delivered per slot and
    extra [E] bool additional candidate slots (remembered models). weights_out [E] and
    facts_out [N, F] receive the results in place when given.

    Attacks (:mod:`sfg.round.attacks`): forged claims come in as ``slot_staleness`` (what each slot
    delivers; the senders' true state stays in ``state``); ``attackers`` [N] bool marks them for
    the damage facts; ``frozen`` [N] bool marks senders whose model content never changes
    (evidence of ``+guard``). The rule's defences (:mod:`sfg.round.defences`) run inside the round."""
    if rule.oracle:
        cand = candidate_mask(rg, caps, live)
        scores = rule.scorer(rg.indptr, rg.send, cand, state.missed, **{
            k: v for k, v in rule.params.items() if k != "c"})
    fn: Callable[..., Any]
    params: tuple[float, ...]
    if scores is not None:
        fn, params = given_scores, ()
    else:
        fn, params = rule.scorer, rule.args
    kr = kernels(fn)[1]
    n, E = rg.n, rg.n_slots
    u = key = _EMPTY_F
    if rule.random:
        u, key = rule_draws(seed, state.t, n, E)
    ages, lags = state.ages.copy(), state.lags.copy()
    counts, local_counts, q = state.counts.copy(), state.local_counts.copy(), state.q_hat.copy()
    w = np.empty(E) if weights_out is None else weights_out
    cand = np.empty(E, bool)
    facts = np.empty((n, len(FACTS))) if facts_out is None else facts_out
    s_age, s_lag, s_count = (_EMPTY_I, _EMPTY_F, _EMPTY_I) if slot_staleness is None else (
        np.ascontiguousarray(slot_staleness[0], np.int64),
        np.ascontiguousarray(slot_staleness[1], np.float64),
        np.ascontiguousarray(slot_staleness[2], np.int64))
    defence = rule.defence_flags
    versions = evidence = None
    ev_ver = ev_first = vers = _EMPTY_I
    if defence & GUARD:
        versions = (np.zeros(n, np.int64) if state.versions is None else state.versions.copy())
        evidence = (np.full((2, E), -1, np.int64) if state.evidence is None
                    else state.evidence.copy())
        vers, ev_ver, ev_first = versions, evidence[0], evidence[1]
    kr(state.t, params, rule.self_weight, rule.ipw, rule.rounded, rg.indptr, rg.send,
       rg.edge_id, caps.train, caps.send, caps.aggregate, caps.adopt,
       _EMPTY_B if live is None else live, u, key,
       _EMPTY_F if scores is None else np.ascontiguousarray(scores, np.float64),
       s_age, s_lag, s_count, _EMPTY_B if extra is None else extra,
       defence, rule.margin, rule.kappa,
       _EMPTY_B if attackers is None else np.ascontiguousarray(attackers, bool),
       _EMPTY_B if frozen is None else np.ascontiguousarray(frozen, bool),
       vers, ev_ver, ev_first,
       ages, lags, counts, local_counts, q, w, cand, facts)
    missed = state.missed
    if missed is not None:
        from sfg.round.rules.oracles import advance_missed

        missed = advance_missed(missed, state.t, rg.indptr, rg.send, w, caps.adopt, caps.train)
    nxt = replace(state, t=state.t + 1, ages=ages, lags=lags, counts=counts,
                  local_counts=local_counts, q_hat=q, missed=missed,
                  versions=versions if versions is not None else state.versions,
                  evidence=evidence if evidence is not None else state.evidence)
    return RoundResult(weights=w, candidate=cand, state=nxt, facts=facts)


def one_receiver(rule: Rule, *, ages: ArrayLike, lags: ArrayLike | None = None,
                 counts: ArrayLike | None = None, local_counts: ArrayLike | None = None,
                 q_hat: ArrayLike | None = None, t: int | None = None, u: float = 0.5,
                 keys: ArrayLike | None = None, degrees: ArrayLike | None = None,
                 missed: ArrayLike | None = None) -> np.ndarray:
    """One receiver's weights over its candidates (index 0 = the receiver): the round's own
    compiled weights (:func:`_weights`) on the given candidates. See ``Rule.weights_one``."""
    from sfg.errors import SfgError

    age = np.ascontiguousarray(np.asarray(ages, dtype=np.int64).reshape(-1))
    k = age.shape[0]
    if k < 1:
        raise SfgError("a receiver needs at least itself as a candidate (index 0)")

    def arr(v, default, dtype):
        out = default if v is None else np.asarray(v, dtype).reshape(-1)
        return np.ascontiguousarray(out.astype(dtype))

    raw = arr(lags, age.astype(np.float64), np.float64)
    count = arr(counts, np.ones(k, np.int64), np.int64)
    local = arr(local_counts, count, np.int64)
    q = arr(q_hat, np.ones(k), np.float64).copy()
    key = arr(keys, np.linspace(0, 1, k), np.float64)
    deg = arr(degrees, np.concatenate([[k - 1], np.ones(k - 1, np.int64)]), np.int64)
    for name, a in (("lags", raw), ("counts", count), ("local_counts", local), ("q_hat", q),
                    ("keys", key), ("degrees", deg)):
        if a.shape[0] != k:
            raise SfgError(f"{name} has {a.shape[0]} entries but ages has {k}; give one per candidate")
    q[0] = 1.0
    if t is None:
        t = int(np.ceil(raw.max())) if k else 0
    lag = np.rint(raw) if rule.rounded else raw
    given = np.ones(k)
    fn, params = rule.scorer, rule.args if rule.compiled else ()
    if rule.oracle:
        if missed is None:
            raise SfgError(f"rule {rule.name!r} is an oracle: give missed=[k, T] rows of A")
        given = rule.scorer(np.array([0, k]), np.arange(k), np.ones(k, bool),
                        np.asarray(missed, np.float64),
                        **{kk: v for kk, v in rule.params.items() if kk != "c"})
        fn = given_scores
    wk = kernels(fn)[0]
    defence = rule.defence_flags
    if defence:  # claims clamped as in the round (no evidence history here)
        age, raw, count = age.copy(), raw.copy(), count.copy()
        clamp_claims(int(t), defence, rule.margin, k, age, raw, count, np.zeros(k, np.int64))
        lag = np.rint(raw) if rule.rounded else raw
    x = Candidates(int(t), float(u), age, lag, count, local, q, deg, key, given)
    w = wk(x, params, rule.self_weight, rule.ipw, True, np.empty(k))
    if defence & CAP:
        cap_weights(w, rule.kappa)
    return w
