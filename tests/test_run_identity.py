"""One identity per run: a run id covers its engine (clock, protocol, nodes), every existing
id of the simulators stays what it was, the same swarm from the command line and from Python
has one id, and a store written by 0.2 is re-keyed by ``sfg grid upgrade``."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from running import bounded

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "store-0.2-swarm.sqlite"

# The run ids of the grids in examples/ as sfg 0.2.0 computed them, before runs had ``nodes``:
# made with the code of commit 3ccf2cd (a scratch worktree, PYTHONPATH at its src/) by
#   for each examples/*.yaml: ids = [run_id(c) for c in load_grid(path).configs]
#   (len(ids), sha256("\n".join(ids)).hexdigest()[:16], ids[0], ids[-1])
# run from the repository root (the time grids read ../shared/data's FLASH subset).
OLD_IDS = {
    "attack-digits.yaml": (1225, "d0e02eca33ff56ed", "799c0b20e87d704b", "0263d03b860bd464"),
    "attack-replay.yaml": (1750, "0f89faad4a58dede", "cab5605f4ac8b60d", "d70a27f4c383058d"),
    "attack-robust-rank.yaml": (72, "5c06f699115b90b8", "799c0b20e87d704b", "4fdee18798b718c5"),
    "attack-robust.yaml": (288, "eb4eb2118be57334", "799c0b20e87d704b", "fb7a9db16d65c7a7"),
    "demo.yaml": (112, "69c4d892b6582e89", "11684ea0feaff876", "f56487bd2ee977a8"),
    "diagnostics-digits.yaml": (12, "69e0b44a0e52c7d8", "875687dd17d0890d", "eb969c38be0aab64"),
    "liars-digits.yaml": (270, "96ea7996aea83c2c", "d9fb692737144a7b", "ba78d2be94c70b9e"),
    "liars-replay.yaml": (420, "aea1ec690b04ccb8", "445a28f0965420de", "13ae587c6b02ff6d"),
    "paper-cifar10.yaml": (360, "e2b1767bc46030d4", "40971083b51935fe", "c3b16792694def85"),
    "paper-cifar100.yaml": (360, "5546c818e21a4b66", "97869670c2922fbc", "c9d583b535121176"),
    "paper-femnist.yaml": (360, "b37b202023c22966", "d588218d863d5306", "04b14d50495ca21c"),
    "paper-resnet.yaml": (120, "c75375980afc1e91", "47c7befcdc8837b3", "1f18337d4b87388d"),
    "time-digits.yaml": (360, "01f10dbe09c2c2e1", "67b18fa39b6ed785", "31041c90084f6632"),
    "time-pull-digits.yaml": (1560, "46a4f7b8518d8465", "67b18fa39b6ed785", "b29bf42648685515"),
}
FLASH = ROOT.parent / "shared" / "data" / "flash" / "flash_state_traces_subset.json"


@pytest.mark.parametrize("name", sorted(OLD_IDS))
def test_every_run_id_of_the_example_grids_is_what_it_was(name, monkeypatch):
    from sfg.experiments.config import run_id
    from sfg.experiments.grid import load_grid

    if name.startswith("time-") and not FLASH.is_file():
        pytest.skip(f"needs the FLASH trace subset at {FLASH} (the shared data)")
    monkeypatch.chdir(ROOT)
    ids = [run_id(c) for c in load_grid(ROOT / "examples" / name).configs]
    got = (len(ids), hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16], ids[0], ids[-1])
    assert got == OLD_IDS[name]


SWARM = dict(n_clients=4, rounds=2, local_steps=1, batch_size=8, graph="ring",
             process="iid:u=0.5", seed=1)
FLAGS = ["--nodes", "4", "--rounds", "2", "--local-steps", "1", "--batch-size", "8", "--graph",
         "ring", "-p", "iid:u=0.5", "--seed", "1"]


def test_the_same_swarm_from_the_command_line_and_python_has_one_id(tmp_path, capsys):
    """`sfg swarm --store` and sfg.swarm of the same settings: one run id, the one the
    store holds, its engine's; `sfg.run` of the same settings is another run."""
    import sfg
    from sfg.cli.main import main
    from sfg.experiments.config import make_config, run_id
    from sfg.experiments.store import Store

    store = tmp_path / "r.sqlite"
    code = main(["swarm", "--clock", "virtual", "--protocol", "async", *FLAGS, "--store",
                 str(store), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    cli = json.loads(out.out)
    res = bounded(lambda: sfg.swarm(**SWARM, protocol="async"), 120)
    assert cli["run_id"] == res.meta["run_id"]
    assert res.meta["engine"] == "node-async" and res.meta["config"]["nodes"] == "virtual"
    with Store(store, create=False, readonly=True) as st:
        (rec,) = st.records()
    assert rec["run_id"] == cli["run_id"] == run_id(make_config(rec["config"]))
    assert rec["config"]["backend"] == "loop" and rec["config"]["period"] == 600.0
    sim = make_config(**SWARM, clock="virtual", protocol="async")
    assert run_id(sim) != cli["run_id"]


def test_real_nodes_settings_select_their_engine_and_hold_their_timer():
    from sfg.engines import engine_of
    from sfg.errors import SfgError
    from sfg.experiments.config import make_config, run_id

    lock = make_config(**SWARM, nodes="real")
    fast = make_config(**SWARM, nodes="real", protocol="async")
    slow = make_config(**SWARM, nodes="real", protocol="async", period=0.5)
    assert engine_of(lock.model_dump()) == "real-lockstep"
    assert engine_of(fast.model_dump()) == "real-async"
    assert fast.period == 0.2 and lock.period is None  # resolved and stored
    assert make_config(**SWARM, nodes="real", protocol="async", period=0.2) == fast
    assert len({run_id(lock), run_id(fast), run_id(slow), run_id(make_config(**SWARM))}) == 4
    with pytest.raises(SfgError, match="nodes names which nodes") as e:
        make_config(**SWARM, nodes=8)
    assert "\n" not in str(e.value)
    with pytest.raises(SfgError, match="real-lockstep"):
        make_config(**SWARM, nodes="real", clock="virtual")


def test_upgrade_rekeys_the_swarm_runs_of_a_02_store(tmp_path):
    """The fixture: a store written by sfg 0.2.0 (`sfg grid run` of a one-run grid, then
    `sfg swarm --store` virtual and real, lockstep and async: rows with backend
    swarm-<mode>). `sfg grid upgrade` gives each swarm row the id its settings have now
    (the one `sfg swarm --store` of the same flags writes), keeps its metrics and curves, and
    leaves the grid's row as it was."""
    from sfg.cli.main import main
    from sfg.experiments.config import make_config, run_id
    from sfg.experiments.store import Store

    path = tmp_path / "old.sqlite"
    shutil.copy(FIXTURE, path)
    with Store(path, create=False, readonly=True) as st:
        before = {r["run_id"]: r for r in st.records()}
        curves_before = st.curves()
    assert sorted(r["config"]["backend"] for r in before.values()) == [
        "auto", "swarm-async", "swarm-lockstep", "swarm-virtual-async", "swarm-virtual-lockstep"]
    assert main(["grid", "upgrade", "--store", str(path), "--dry-run"]) == 0
    with Store(path, create=False, readonly=True) as st:
        assert {r["run_id"] for r in st.records()} == set(before)  # a dry run changes nothing
    assert main(["grid", "upgrade", "--store", str(path)]) == 0
    with Store(path, create=False, readonly=True) as st:
        after = {r["run_id"]: r for r in st.records()}
        curves_after = st.curves()
    assert len(after) == 5
    engines = {}
    for rid, rec in after.items():
        cfg = make_config(rec["config"])
        assert rid == run_id(cfg) and not cfg.backend.startswith("swarm-")
        engines[rec["config"].get("nodes", "none"), rec["config"].get("protocol")] = rid
    grid_row = next(r for r in before if before[r]["config"]["backend"] == "auto")
    assert after[grid_row]["metrics"] == before[grid_row]["metrics"]  # untouched
    old_of = {v["config"]["backend"]: k for k, v in before.items()}
    for backend, key in [("swarm-virtual-async", ("virtual", "async")),
                         ("swarm-virtual-lockstep", ("virtual", "lockstep")),
                         ("swarm-lockstep", ("real", "lockstep")),
                         ("swarm-async", ("real", "async"))]:
        old, new = old_of[backend], engines[key]
        assert after[new]["metrics"] == before[old]["metrics"]
        assert curves_after[new] == curves_before[old]
    # the id `sfg swarm --store` writes today for the same flags (tests/fixtures' runs)
    now = make_config(**SWARM, clock="virtual", protocol="async", nodes="virtual")
    assert run_id(now) == engines["virtual", "async"]
    assert main(["grid", "upgrade", "--store", str(path)]) == 0  # again: nothing left to do
    with Store(path, create=False, readonly=True) as st:
        assert {r["run_id"] for r in st.records()} == set(after)
