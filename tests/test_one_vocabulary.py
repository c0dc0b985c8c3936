"""One vocabulary on the command line: a concept two commands share is one option definition
(:mod:`sfg.cli.options`), cuts and crashes have one grammar with units, old spellings keep
their old meaning with a one-line deprecation notice, and docs/reference/options.md tabulates
every option against every command."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_traces_flash import small_flash

from sfg.cli.main import main
from sfg.cli.options import faults_with
from sfg.errors import SfgError
from sfg.net.cuts import Crash, Cut

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHARED_COMMANDS = ("run", "replay", "swarm", "node")


def _cli(args, capsys):
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, [ln for ln in cap.err.strip().splitlines() if ln.strip()]


def _gen(name: str):
    spec = importlib.util.spec_from_file_location(f"sfg_docs_{name}", DOCS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- one grammar with units


def test_cut_and_crash_parse_their_unit():
    assert Cut.parse("0,1|2,3@5r-9r") == Cut.parse_rounds("0,1|2,3@5-9")
    assert Cut.parse("0-3|4-7@1200s-3600s") == Cut.parse_seconds("0-3|4-7@1200-3600")
    assert Cut.parse("0-1|2@1r-1r").nodes == {0, 1, 2}
    assert Cut.parse("*|4.5@10s-20s") == Cut.parse_seconds("*|4.5@10-20")
    assert Crash.parse("3@10r") == Crash.parse_round("3@10")
    assert Crash.parse("3@1500s") == Crash.parse_seconds("3@1500")
    assert Crash.parse("3@1500s").unit == "seconds" and Crash.parse("3@10r").unit == "rounds"


@pytest.mark.parametrize("text,needle", [
    ("0,1|2,3@5-9", "write the unit"),
    ("0|1@5r-9s", "cannot read --cut"),
    ("0|1|2@5r-6r", "two, A|B"),
    ("*|1@5r-6r", "'*'"),
    ("0|0@1r-2r", "disjoint"),
    ("0|1@3s-3s", "start < end"),
    ("0|1", "cannot read --cut"),
])
def test_bad_cuts_are_one_sentence(text, needle):
    with pytest.raises(SfgError, match=None) as e:
        Cut.parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["3@10", "3", "3@1.5r", "-1@2s", "x@3r"])
def test_bad_crashes_are_refused(text):
    with pytest.raises(SfgError, match="--crash"):
        Crash.parse(text)


def test_cuts_and_crashes_in_seconds_become_faults_of_the_clock():
    from sfg.clock.faults import Faults

    text = faults_with(None, [Cut.parse("0-1|2-3@100s-200s")], [Crash.parse("1@150s")])
    plan = Faults.parse(text)
    assert plan.partitions == (Cut.parse_seconds("0-1|2-3@100-200"),)
    assert plan.crash_at == (Crash.parse_seconds("1@150"),)
    both = Faults.parse(faults_with("faults:loss=0.1", [Cut.parse("0|1@1s-2s")], []))
    assert both.loss == 0.1 and len(both.partitions) == 1
    assert faults_with("faults:loss=0.1", [], []) == "faults:loss=0.1"
    with pytest.raises(SfgError, match="not both"):
        faults_with("faults:partition=0|1@1-2", [Cut.parse("0|1@1s-2s")], [])
    with pytest.raises(SfgError, match="in rounds is for real nodes"):
        faults_with(None, [Cut.parse("0|1@1r-2r")], [])


# ---------------------------------------------------------------- one definition per concept


def test_shared_options_have_one_help_in_every_command():
    from sfg.cli.options import SPECS, with_default

    gen = _gen("gen_cli")
    root = gen.command_tree()
    seen = 0
    for name in SHARED_COMMANDS:
        cmd = root.commands[name]
        for p in cmd.params:
            if p.param_type_name != "option" or p.hidden:
                continue
            for key, (decls, help_text, _) in SPECS.items():
                # --json: each says what it prints; replay's --seeds also reads one --seed
                own = set(p.opts) - set(decls) - {"--nodes"}
                if decls[0] in p.opts and key != "json" and not own:
                    # the same text, with the run settings' default where the command
                    # has no default of its own
                    assert p.help in (help_text, with_default(key, help_text)), (name, decls[0])
                    assert set(decls) <= set(p.opts), (name, decls)
                    seen += 1
    assert seen > 80
    # every run flag swarm and node take has its help (none empty)
    for name in ("swarm", "node"):
        empty = [p.opts[0] for p in root.commands[name].params
                 if p.param_type_name == "option" and not p.hidden and not p.help]
        assert not empty, (name, empty)


def test_the_vocabulary_is_the_same_in_run_replay_swarm_and_node():
    gen = _gen("gen_cli")
    root = gen.command_tree()
    opts = {c: {o for p in root.commands[c].params if not p.hidden for o in p.opts}
            for c in SHARED_COMMANDS}
    for c in SHARED_COMMANDS:
        assert {"--protocol", "--period", "--jitter", "--window", "--rounds", "-T",
                "--process", "-p", "--rule", "-r", "--config"} <= opts[c], c
    for c in ("run", "swarm", "node"):  # the data split (a replay has no data)
        assert {"--partition", "--alpha", "--dataset", "--model"} <= opts[c], c
    for c in ("run", "replay", "swarm"):
        assert {"--clock", "--cut", "--crash", "--loss", "--round-seconds", "--faults"} <= opts[c]
    assert "--mode" not in opts["swarm"] | opts["node"]  # hidden: the deprecated alias
    assert "--kill" not in opts["swarm"]
    assert "--deadline" in opts["swarm"] and "--deadline" in opts["node"]


def test_one_deadline_default_for_real_nodes():
    from sfg.cli.options import DEADLINE

    gen = _gen("gen_cli")
    root = gen.command_tree()
    for c in ("swarm", "node"):
        (p,) = [p for p in root.commands[c].params if "--deadline" in p.opts]
        assert p.default is None and f"default {DEADLINE:g}" in p.help


# ---------------------------------------------------------------- old spellings, new errors


def _notice(lines: list[str], old: str, new: str) -> None:
    warn = [ln for ln in lines if ln.startswith("warning: ")]
    assert len(warn) == 1 and old in warn[0] and "is deprecated" in warn[0] and new in warn[0], \
        lines


@pytest.mark.parametrize("args,old,new,needle", [
    (["swarm", "--mode", "async", "--crash", "9@2r", "-n", "8", "-T", "20"], "--mode async",
     "--protocol async", "does not exist"),
    (["swarm", "--kill", "9@2", "-n", "8", "-T", "20"], "--kill 9@2", "--crash 9@2r",
     "does not exist"),
    (["swarm", "--partition", "0,1|2,9@3-4", "-n", "8", "-T", "20"], "--partition",
     "--cut 0,1|2,9@3r-4r", "names node"),
    (["swarm", "--clock", "wall", "--protocol", "event", "-n", "8", "-T", "2"], "--clock wall",
     "--clock rounds", "virtual clock only"),
])
def test_old_spellings_keep_their_meaning_with_one_notice(args, old, new, needle, capsys):
    pytest.importorskip("grpc")
    code, _, lines = _cli(args, capsys)
    assert code == 2, lines
    _notice(lines, old, new)
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(lines) == 2 and len(errors) == 1 and needle in errors[0], lines


def test_old_and_new_cuts_reach_the_swarm_as_the_same_cut(monkeypatch, capsys):
    """--partition A|B@R1-R2 (old) and --cut A|B@R1r-R2r give the swarm the same options."""
    pytest.importorskip("grpc")
    import sfg.net.swarm as swarm

    got = []

    def fake_run(world, opts, progress=None):
        got.append((opts.kills, opts.partitions, opts.mode, opts.deadline, world.cfg["partition"]))
        raise RuntimeError("stop here")

    monkeypatch.setattr(swarm, "run_swarm", fake_run)
    base = ["swarm", "-n", "4", "-T", "6", "-p", "none", "--graph", "ring:k=1",
            "--partition", "classes:k=2"]
    assert main([*base, "--mode", "async", "--partition", "0,1|2,3@2-4", "--kill", "1@3"]) == 1
    assert main([*base, "--protocol", "async", "--cut", "0,1|2,3@2r-4r", "--crash", "1@3r"]) == 1
    capsys.readouterr()
    assert got[0] == got[1] == ([(1, 3)], ["0,1|2,3@2-4"], "async", 300.0, "classes:k=2")


def test_node_refuses_the_event_protocol_in_one_line(tmp_path, capsys):
    peers = tmp_path / "peers.yaml"
    peers.write_text("nodes: {0: '127.0.0.1:7000', 1: '127.0.0.1:7001'}\n")
    code, _, lines = _cli(["node", "--id", "0", "--listen", "127.0.0.1:7000", "--peer-file",
                           str(peers), "--protocol", "event"], capsys)
    assert code == 2 and len(lines) == 1 and "virtual clock only" in lines[0], lines


@pytest.mark.parametrize("short,long", [("-p", "--path"), ("-s", "--source")])
def test_traces_short_options_are_gone_with_a_pointer(short, long, capsys, tmp_path):
    flash = small_flash(tmp_path)
    args = ["traces", "stats", "--source", "flash", "--path", str(flash)]
    args[args.index(long)] = short
    code, _, lines = _cli(args, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {short} is ") and f"write {long}" in lines[0]


def test_traces_rule_is_the_availability_criterion(capsys, tmp_path):
    flash = small_flash(tmp_path)  # its own file
    base = ["traces", "stats", "--source", "flash", "--path", str(flash), "--json"]
    code, out, lines = _cli([*base, "--availability", "relaxed"], capsys)
    assert code == 0 and not lines and json.loads(out)["rule"] == "relaxed"
    code, old, lines = _cli([*base, "--rule", "relaxed"], capsys)
    assert code == 0 and old == out
    _notice(lines, "--rule relaxed", "--availability relaxed")


def test_report_alpha_is_fwer(tmp_path, capsys):
    code, _, lines = _cli(["report", "--store", str(tmp_path / "none.sqlite"), "--alpha",
                           "0.1"], capsys)
    assert code == 2
    _notice(lines, "--alpha 0.1", "--fwer 0.1")


# ---------------------------------------------------------------- sfg replay --config


def test_replay_takes_a_replay_config_and_run_points_to_it(tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("kind: replay\nprocess: iid:u=0.5\nrule: [sfg, dfedavg]\nseed: 2\n"
                   "n_clients: 12\nrounds: 20\ngraph: knn:k=3\n")
    code, out, _ = _cli(["replay", "--config", str(cfg), "-r", "sfg-cut", "--json"], capsys)
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [(r["process"], r["rule"], r["seed"]) for r in rows] == [("iid:u=0.5", "sfg-cut", 2)]
    code, _, lines = _cli(["run", "--config", str(cfg)], capsys)
    assert code == 2 and len(lines) == 1 and f"sfg replay --config {cfg}" in lines[0]
    (tmp_path / "t.yaml").write_text("kind: replay\ndataset: digits\n")
    code, _, lines = _cli(["replay", "--config", str(tmp_path / "t.yaml")], capsys)
    assert code == 2 and len(lines) == 1 and "'dataset' is a training setting" in lines[0]


# ---------------------------------------------------------------- the table


def test_options_table_is_current_and_complete():
    gen = _gen("gen_options")
    text = (DOCS / "reference" / "options.md").read_text(encoding="utf-8")
    root = _gen("gen_cli").command_tree()
    assert text == gen.render(root), "run: python docs/gen_options.py"
    commands, rows = gen.table(root)
    assert {"run", "replay", "swarm", "node", "traces stats", "grid run"} <= set(commands)
    header = text.split("\n| option | ")[1].split("\n")[0]
    assert all(f"`{c}`" in header for c in commands)
    for key in ("--protocol", "--clock", "--cut", "--crash", "--partition", "--deadline"):
        assert f"| `{key}` |" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| `--protocol` |"))
    cells = line.split(" | ")[1:-1]
    marked = {c for c, cell in zip(commands, cells, strict=True) if "✓" in cell}
    assert marked == set(SHARED_COMMANDS), marked
    assert "reference/options.md" in (ROOT / "mkdocs.yml").read_text()


def test_virtual_swarm_cuts_and_crashes_in_seconds_are_its_faults(capsys):
    """`sfg swarm --clock virtual --cut ...s --crash ...s` runs the same swarm as the same cut
    and crash written inside --faults."""
    pytest.importorskip("torch")
    swarm = ["swarm", "--clock", "virtual", "-n", "8", "-T", "8", "--eval-every", "4", "-K", "1",
             "-p", "bursty:u=0.5", "--protocol", "async", "--compute", "const:value=30",
             "--json"]
    code, new, lines = _cli([*swarm, "--cut", "0-3|4-7@600s-3000s", "--crash", "2@1200s"],
                            capsys)
    assert code == 0, lines
    code, old, lines = _cli([*swarm, "--faults", "faults:partition=0-3|4-7@600-3000,"
                                                 "crash=2@1200"], capsys)
    assert code == 0, lines
    new, old = json.loads(new), json.loads(old)
    assert new["metrics"] == old["metrics"]
    assert new["faults"]["partitioned"] == old["faults"]["partitioned"] > 0
    assert new["faults"]["crash_log"] == old["faults"]["crash_log"]
    assert [c["node"] for c in new["faults"]["crash_log"]] == [2]


def test_no_short_option_has_two_meanings():
    gen = _gen("gen_cli")
    meaning: dict[str, set[str]] = {}
    for _path, cmd in gen.walk(gen.command_tree()):
        for p in getattr(cmd, "params", []):
            if p.param_type_name != "option" or p.hidden:
                continue
            longs = [o for o in p.opts if o.startswith("--")]
            for short in (o for o in p.opts if not o.startswith("--")):
                meaning.setdefault(short, set()).add(longs[-1])
    assert meaning["-p"] == {"--process"} and meaning["-s"] == {"--store"}
    assert {s: m for s, m in meaning.items() if len(m) > 1} == {}


def test_replay_takes_one_seed_as_run_does(capsys):
    code, out, _ = _cli(["replay", "--seed", "4", "-n", "12", "-T", "10", "-r", "sfg", "-p",
                         "none", "--json"], capsys)
    assert code == 0 and [r["seed"] for r in json.loads(out)["rows"]] == [4]
