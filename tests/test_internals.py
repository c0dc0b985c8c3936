"""Safe to upgrade: every private internal of another package that sfg uses
is feature-tested where it is used and has a fallback on public API (sfg.util.internals).
Each test forces the fallback — ``SFG_PUBLIC_API=1``, or an internal made to look missing —
checks that the fallback was taken, and that the numbers are the same as with the internal."""

from __future__ import annotations

import ast
import asyncio
import heapq
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from running import bounded

from sfg.util import internals

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str, *args: str, public: bool, timeout: float = 300) -> dict:
    """``code`` in a fresh interpreter (SFG_PUBLIC_API set or not); its last stdout line as
    JSON, with the uses that took their fallback under "fallbacks"."""
    env = {k: v for k, v in os.environ.items() if k != "SFG_PUBLIC_API"}
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if public:
        env["SFG_PUBLIC_API"] = "1"
    tail = ("\nfrom sfg.util import internals as _i\n"
            "print(json.dumps({'out': OUT, 'fallbacks': _i.fallbacks(), "
            "'internals': _i.internals()}, sort_keys=True))\n")
    r = subprocess.run([sys.executable, "-c", code + tail, *args], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _bounded(fn, timeout: float = 60.0):
    return bounded(fn, timeout, "the virtual clock spins")


def test_the_switch_and_the_record():
    assert internals.forced() is (os.environ.get("SFG_PUBLIC_API", "") not in ("", "0"))
    with pytest.raises(AssertionError):
        internals.taken("no-such-use", True)


# ------------------------------------------------------------------ numba: first-class address
REPLAY = """
import json
from sfg.modelfree.api import replay
OUT = replay(["bursty:u=0.5"], ["sfg-cut", "sfg-cut+guard", "dfedavg+refute+cap", "aoi+ipw"],
             [1], n=40, T=60, horizon=10, attacks=[None, "forge:frac=0.2,claim=fresh"])
"""


@pytest.mark.crosspath
def test_the_compiled_round_gives_the_same_numbers_through_the_fallbacks():
    """The rule and the defences reach the compiled round as first-class functions: through
    the C wrapper's address (numba internals) or as the dispatchers themselves (public API);
    the cache peek (numba internals) or none. Every metric of every lane is the same."""
    from sfg.round.compiled import usable_cores

    fast = _python(REPLAY, public=False)
    slow = _python(REPLAY, public=True)
    # (the cache is peeked at only where a helper could compile: two usable cores)
    uses = ["first-class-address", *(["cache-index"] if usable_cores() >= 2 else []),
            "blas-probe", "no-refcount"]
    assert fast["internals"] == uses and fast["fallbacks"] == []
    assert slow["fallbacks"] == uses and slow["internals"] == []
    assert len(fast["out"]) == 8 and fast["out"][0]["messages"] > 0
    assert slow["out"] == fast["out"]


RAISES = """
import json, sys, textwrap
from pathlib import Path
sys.path.insert(0, sys.argv[1])
Path(sys.argv[1], "raising_rule_fb.py").write_text(textwrap.dedent('''
    import numpy as np
    from numba import njit
    from sfg.round.rules import rule

    @rule("test-raises-fb", tags=("control",))
    @njit
    def raises(x):
        h = np.ones(x.age.shape[0])
        h[0] = 1.0 / (x.age[0] - x.age[0]) if x.age[0] > 2 else 1.0
        return h
'''))
import raising_rule_fb  # noqa: F401
from sfg.round.kernel import RuleError
from sfg.round.rules import parse_rule
sys.unraisablehook = lambda u: None
try:
    parse_rule("test-raises-fb").weights_one(ages=[3, 0, 1])
    OUT = "no error"
except RuleError as e:
    OUT = str(e)
"""


def test_a_raising_rule_is_still_an_error_through_the_fallback(tmp_path):
    """Through the dispatcher, the rule still runs behind numba's C wrapper: its exception
    is still reported as the round's RuleError, not a crash."""
    got = _python(RAISES, str(tmp_path), public=True)
    assert "first-class-address" in got["fallbacks"]
    assert "raised while scoring receiver 0 in round 3" in got["out"]


def test_a_numba_without_the_internals_takes_the_fallbacks(monkeypatch):
    """The feature tests, not only the switch: a compile result without a wrapper address,
    a cache without its index, an ensure_blas that is not a plain function."""
    import numba.core.caching as caching

    from sfg.round import compiled
    from sfg.util import numba_start

    monkeypatch.delenv("SFG_PUBLIC_API", raising=False)
    monkeypatch.setattr(internals, "_TAKEN", {})

    from numba import njit
    from numba import types as nt

    sig = nt.float64(nt.float64)
    d = njit(sig, cache=True)(_plus_one)
    fast = compiled.first_class(d, sig)
    assert internals.fallbacks() == [] and type(fast).__name__ == "FirstClass"
    # a later numba's compile result, as far as sfg can tell: no library, no wrapper name
    monkeypatch.setattr(d, "get_compile_result", lambda s: object())
    slow = compiled.first_class(d, sig)
    assert internals.fallbacks() == ["first-class-address"]
    assert type(slow).__name__ == "CFunc"
    assert _apply(fast, 2.5) == _apply(slow, 2.5) == 3.5

    class NoIndex:
        def __init__(self, py_func):
            pass

    monkeypatch.setattr(caching, "FunctionCache", NoIndex)
    from sfg.modelfree.horizon import KERNEL

    assert KERNEL.cached() is True  # cannot tell: no helper
    assert "cache-index" in internals.fallbacks()

    class Linalg:
        @staticmethod
        def ensure_blas(strict):  # another signature: not what sfg answers
            pass

    assert numba_start._probe_answerable(Linalg) is False
    assert numba_start._probe_answerable(object()) is False

    class Current:
        @staticmethod
        def ensure_blas():
            pass

    assert numba_start._probe_answerable(Current) is True


def _plus_one(x):
    return x + 1.0


def _apply(f, x: float) -> float:
    from numba import njit

    return njit(lambda f, x: f(x))(f, x)


BLAS = """
import json, sys
import numpy as np
from sfg.util.numba_start import njit
import numba.np.arraymath as am
loaded_at_start = "scipy.linalg" in sys.modules

@njit
def dot(a, b):
    return np.dot(a, b), np.linalg.det(a)

d, det = dot(np.array([[2.0, 1.0], [0.0, 3.0]]), np.array([[2.0, 1.0], [0.0, 3.0]]))
OUT = {"blas": am._HAVE_BLAS, "dot": d.tolist(), "det": det, "scipy_at_start": loaded_at_start}
"""


def test_numbas_own_blas_probe_gives_the_same_numbers():
    fast, slow = _python(BLAS, public=False), _python(BLAS, public=True)
    assert fast["fallbacks"] == [] and slow["fallbacks"] == ["blas-probe", "no-refcount"]
    assert fast["out"]["scipy_at_start"] is False  # answered: scipy.linalg not imported
    assert slow["out"]["scipy_at_start"] is True   # numba's own probe imported it
    for got in (fast, slow):
        assert got["out"]["blas"] is True
    assert slow["out"]["dot"] == fast["out"]["dot"] == [[4.0, 5.0], [0.0, 9.0]]
    assert slow["out"]["det"] == fast["out"]["det"]


# ------------------------------------------------------------------ asyncio: the virtual clock
class _HeapReadingLoop:
    """The virtual loop as it was: the next timer read from asyncio's private heap."""

    @staticmethod
    def next_timer(loop) -> float | None:
        heap = loop._scheduled
        while heap and heap[0]._cancelled:
            loop._timer_cancelled_count -= 1
            heapq.heappop(heap)._scheduled = False
        return heap[0]._when if heap else None


async def _workload(seed: int, trace: list, base: float) -> None:
    """Tasks that sleep, time out (cancelled timers), cancel each other and call back
    later: a trace of (time, event) in the order things happened."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    if base:
        await asyncio.sleep(base)
    gate = loop.create_future()

    async def worker(k: int) -> None:
        for step in range(12):
            r = rng.random()
            if r < 0.35:
                await asyncio.sleep(rng.choice([0.0, 1e-13, 0.5, rng.random() * 3]))
            elif r < 0.6:
                try:
                    await asyncio.wait_for(asyncio.shield(gate), rng.random() * 2)
                except TimeoutError:
                    trace.append((loop.time(), "timeout", k, step))
            elif r < 0.8:
                h = loop.call_later(rng.random() * 4, trace.append, (loop.time(), "late", k))
                if rng.random() < 0.5:
                    h.cancel()
            else:
                loop.call_at(loop.time() + rng.random(), trace.append, ("at", k, step))
            trace.append((loop.time(), "step", k, step))

    tasks = [asyncio.ensure_future(worker(k)) for k in range(8)]
    await asyncio.sleep(5.0)
    tasks[0].cancel()
    gate.set_result(None)
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(10.0)  # the late callbacks run
    trace.append((loop.time(), "end"))


@pytest.mark.parametrize("base", [0.0, 2.0 ** 20, 2.0 ** 30])
def test_the_clocks_own_timer_record_is_asyncios_heap(base, monkeypatch):
    """At every step the clock takes, the next timer from the loop's own record (public
    API) is the head of asyncio's private heap; the runs' traces are the same either way
    (also past 2^14 s and 2^22 s, where the clock's resolution matters)."""
    from sfg.net.simclock import VirtualLoop, run_virtual

    monkeypatch.delenv("SFG_PUBLIC_API", raising=False)
    steps = []

    class Checked(VirtualLoop):
        def _next_timer(self):
            theirs = _HeapReadingLoop.next_timer(self)
            ours = super()._next_timer()
            steps.append((ours, theirs))
            return ours

    class Old(VirtualLoop):
        def _next_timer(self):
            return _HeapReadingLoop.next_timer(self)

    for seed in range(3):
        new, old = [], []
        _bounded(lambda s=seed, t=new: run_virtual(_workload(s, t, base), loop=Checked()))
        _bounded(lambda s=seed, t=old: run_virtual(_workload(s, t, base), loop=Old()))
        assert new == old and len(new) > 50
        assert sum(1 for e in new if e[1] == "timeout") > 0
    assert len(steps) > 100 and all(a == b for a, b in steps)


def test_where_asyncio_would_not_read_the_resolution_the_clock_stops_with_an_error(
        monkeypatch):
    """SFG_PUBLIC_API=1: the clock does not rely on asyncio reading its resolution; below
    2^22 s it runs exactly as before, past that it stops with one error instead of spinning."""
    from sfg.errors import SfgError
    from sfg.net.simclock import UNREAD_LIMIT, VirtualLoop, run_virtual

    monkeypatch.setenv("SFG_PUBLIC_API", "1")
    loop = VirtualLoop()
    assert loop.resolution_read is False
    forced: list = []
    _bounded(lambda: run_virtual(_workload(1, forced, 2.0 ** 20), loop=loop))
    monkeypatch.delenv("SFG_PUBLIC_API")
    plain: list = []
    _bounded(lambda: run_virtual(_workload(1, plain, 2.0 ** 20)))
    assert forced == plain
    monkeypatch.setenv("SFG_PUBLIC_API", "1")
    with pytest.raises(SfgError, match="would pass 4194304 s"):
        _bounded(lambda: run_virtual(asyncio.sleep(UNREAD_LIMIT + 1)))
    monkeypatch.delenv("SFG_PUBLIC_API")
    _bounded(lambda: run_virtual(asyncio.sleep(2.0 ** 40)))  # read: no limit


SWARM = """
import json
import numpy as np
from sfg.net.swarm import SwarmOptions
from sfg.net.virtual import run_virtual_swarm
from sfg.net.world import build_world
world = build_world(dict(rounds=6, local_steps=2, process="bursty:u=0.5", graph="knn:k=4",
                         seed=1, eval_every=3, dataset="digits", model="mlp", backend="loop",
                         n_clients=8, rule="sfg-cut+certified"))
res = run_virtual_swarm(world, SwarmOptions(mode="lockstep", period=600.0, deadline=3600.0),
                        clock_settings={"compute": "const:value=30"})
p = np.ascontiguousarray(res["params"])
OUT = {"params": p.view(np.uint8).tobytes().hex(), "acc": [nd["acc"] for nd in res["nodes"]],
       "messages": res["metrics"]["messages"], "t": res["metrics"]["virtual_seconds"]}
"""


@pytest.mark.crosspath
def test_a_certified_lockstep_swarm_gives_the_same_models_through_every_fallback():
    """The networked node on the virtual clock (the loop's timers, the compiled round's
    first-class functions, the certified checks): the same models bit for bit."""
    fast, slow = _python(SWARM, public=False), _python(SWARM, public=True)
    assert "first-class-address" in fast["internals"]
    assert {"first-class-address", "clock-resolution"} <= set(slow["fallbacks"])
    assert fast["out"]["messages"] > 0
    assert slow["out"] == fast["out"]


# ------------------------------------------------------------------ the list is complete
def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _sfgs_own(trees) -> set[str]:
    """The underscore names sfg gives attributes itself: assigned as ``obj._x = …`` or defined
    in a class body (methods, class attributes); and namedtuple's documented ``_replace`` and
    kin."""
    own = {"_replace", "_fields", "_asdict", "_make"}
    for tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                own.add(n.attr)
            elif isinstance(n, ast.ClassDef):
                for b in n.body:
                    if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        own.add(b.name)
                    elif isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                        own.add(b.target.id)
                    elif isinstance(b, ast.Assign):
                        own.update(t.id for t in b.targets if isinstance(t, ast.Name))
    return own


def private_internals(src: Path, package: str = "sfg") -> list[tuple[str, str]]:
    """Every use under ``src/package`` of another package's private name, as (``path:line``,
    the name): ``obj._x`` and ``getattr(obj, "_x")`` where sfg gives no attribute ``_x``
    itself, ``import a._b`` and ``from a._b import …``, ``from a import _x``."""
    paths = sorted((src / package).rglob("*.py"))
    trees = [ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in paths]
    own = _sfgs_own(trees)
    found = []
    for path, tree in zip(paths, trees, strict=True):
        where = f"{path.relative_to(src)}:"
        for n in ast.walk(tree):
            names: list[str] = []
            if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in own:
                names = [n.attr]
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id in ("getattr", "hasattr", "setattr") and len(n.args) > 1
                  and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)
                  and _private(n.args[1].value) and n.args[1].value not in own):
                names = [n.args[1].value]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names if a.name.split(".")[0] != package
                         and any(_private(x) for x in a.name.split("."))]
            elif isinstance(n, ast.ImportFrom) and not n.level and n.module \
                    and n.module.split(".")[0] != package:
                names = ([n.module] if any(_private(x) for x in n.module.split(".")) else [])
                names += [a.name for a in n.names if _private(a.name)]
            found += [(f"{where}{n.lineno}", name) for name in names]
    return sorted(set(found))


def _listed(name: str) -> bool:
    """Whether sfg.util.internals' docstring names ``name`` (a whole name, or its last part)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", internals.__doc__ or "") is not None


def test_every_private_internal_sfg_uses_is_listed():
    """Every private internal of another package that the source touches is named in
    sfg.util.internals' list (and the scan finds the ones the list names)."""
    found = private_internals(Path(SRC))
    names = {name for _, name in found}
    assert {"_log_softmax_backward_data", "_version", "numpy._core", "_cache_file",
            "_shutdown"} <= names, found
    missing = [f"{where} {name}" for where, name in found if not _listed(name)]
    assert not missing, "private internals not listed in sfg.util.internals:\n" + "\n".join(
        missing)


def test_the_scan_finds_planted_private_internals(tmp_path):
    pkg = tmp_path / "sfg"
    pkg.mkdir()
    (pkg / "a.py").write_text(textwrap.dedent("""\
        import numpy._core as nc
        from torch import _C
        from numpy._core import multiarray
        from sfg.b import _ours


        class K:
            _flag = 1

            def __init__(self):
                self._mine = 1

            def _helper(self, t, nt):
                return (self._mine, self._flag, self._helper, t._version, nt._replace(),
                        getattr(t, "_hidden"), getattr(t, "_mine"), torch.ops.aten._op)
        """))
    got = [f"{where} {name}" for where, name in private_internals(tmp_path)]
    assert got == ["sfg/a.py:1 numpy._core", "sfg/a.py:14 _version", "sfg/a.py:15 _hidden",
                   "sfg/a.py:15 _op", "sfg/a.py:2 _C", "sfg/a.py:3 numpy._core"], got
    assert _listed("_version") and _listed("numpy._core") and not _listed("_hidden")


PEERS = """
import json
from sfg.clock.replay import replay_clock
from sfg.clock.settings import make_settings
s = make_settings({"clock": "virtual", "protocol": "async", "on_return": "pull:timeout=120",
                   "latency": "const:value=3"})
r = replay_clock("bursty:u=0.6", "sfg-cut", settings=s, seed=2, n=40, rounds=40,
                 local_steps=2, peers="online:s=3,view=6,gossip=2")
OUT = {"digest": r["meta"]["schedule_digest"], "metrics": r["metrics"]}
"""


def test_peers_compiled_without_reference_counts_give_the_same_numbers():
    """The compiled parts of peers chosen per exchange without numba's reference counting
    (``_nrt=False``, numba internals) or with it (public API): the same schedule digest and
    every metric the same."""
    fast, slow = _python(PEERS, public=False), _python(PEERS, public=True)
    assert "no-refcount" in fast["internals"] and "no-refcount" in slow["fallbacks"]
    assert fast["out"]["digest"] == slow["out"]["digest"]
    assert json.dumps(fast["out"]["metrics"], sort_keys=True) == \
        json.dumps(slow["out"]["metrics"], sort_keys=True)  # (NaN spelled alike)
    assert fast["out"]["metrics"]["membership_bytes_per_device_hour"] > 0
