"""The console every sub-command shares: exit statuses 0/1/2 per sub-command (real, tiny runs),
one literal ``error:`` line, JSON, the layout without import loops, and what a command imports."""

from __future__ import annotations

import ast
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from test_traces_flash import small_flash

from sfg.cli import console
from sfg.cli.main import main

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

GRID = """\
name: tiny
base: {kind: selftest, n_clients: 10, rounds: 10, eval_every: 5}
processes: ["none", "bursty:u=0.8"]
rules: [dfedavg, sfg]
seeds: [1, 2]
"""
# half the runs are training runs whose data folder does not exist: they fail
FAILING = GRID + "overrides:\n  - {}\n  - {kind: train, dataset: cifar10, model: cnn, data_root: 'MISSING'}\n"


def run(*args: str, module: str = "sfg.cli.main",
        code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)


def error_line(stderr: str) -> str:
    """The one non-blank stderr line, which must be ``error: ...`` (no traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- the console
def test_error_is_one_literal_line(capsys):
    console.error("rule 'x[/x]' and [red]red[/red]\nsecond   line")
    err = capsys.readouterr().err
    assert err == "error: rule 'x[/x]' and [red]red[/red] second line\n"


def test_tables_print_markup_like_text_literally(capsys):
    t = console.table("title [bold]x[/bold]", ["name", ("value", "right")],
                      rows=[["x[/x]", 0.5], ["[red]r", float("nan")]], caption="path/[dim]/f")
    console.show(t)
    console.caption("legend [/x]")
    out = capsys.readouterr().out
    for text in ("[bold]x[/bold]", "x[/x]", "[red]r", "0.500", "–", "path/[dim]/f",
                 "legend [/x]"):
        assert text in out, text


def test_json_is_strict():
    text = console.dumps_json({"a": float("nan"), "b": [float("inf"), 1.5], 3: (1, "x")})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "3": [1, "x"]}


def test_error_on_a_terminal_is_still_literal():
    """On a terminal the error line goes through rich (colour); the text stays literal."""
    primary, replica = pty.openpty()
    try:
        res = subprocess.run([sys.executable, "-m", "sfg.cli.main", "replay", "-r", "x[/x]"],
                             stdout=subprocess.PIPE, stderr=replica, timeout=120, env=ENV)
        os.close(replica)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
    text = b"".join(chunks).decode()
    assert res.returncode == 2
    assert "x[/x]" in text and "error:" in text and "Traceback" not in text


# ----------------------------------------------------------------------------- exit statuses
def test_replay_rules_processes_exit_0_and_2(capsys):
    assert main(["replay", "-p", "iid:u=0.5", "-r", "sfg", "--seeds", "1", "-n", "12", "-T",
                 "20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["rule"] == "sfg"
    assert main(["rules", "--json"]) == 0
    assert any(r["rule"] == "sfg-cut" for r in json.loads(capsys.readouterr().out))
    assert main(["processes", "--json"]) == 0
    assert any(r["process"] == "bursty" for r in json.loads(capsys.readouterr().out))
    for argv, fragment in ((["replay", "-n", "20", "-T", "0"], "T"),
                           (["rules", "--bogus"], "No such option: --bogus"),
                           (["processes", "extra"], "unexpected extra argument")):
        assert main(argv) == 2, argv
        assert fragment in error_line(capsys.readouterr().err)


def test_replay_markup_in_a_rule_name_is_one_literal_error_line(capsys):
    res = run("replay", "-r", "x[/x]", "--seeds", "1")
    assert res.returncode == 2
    assert "unknown rule 'x[/x]'" in error_line(res.stderr)
    assert main(["replay", "-r", "[red]sfg", "--seeds", "1"]) == 2
    assert "'[red]sfg'" in error_line(capsys.readouterr().err)


def test_no_command_shows_help_and_exits_2():
    res = run()
    assert res.returncode == 2 and "replay" in res.stdout and "grid" in res.stdout
    assert "missing command" in error_line(res.stderr)
    res = run("grid")
    assert res.returncode == 2 and "status" in res.stdout
    assert "sfg grid --help" in error_line(res.stderr)


def test_grid_run_exit_status_0_1_2(tmp_path, capsys):
    ok = write(tmp_path, "ok.yaml", GRID)
    assert main(["grid", "run", ok, "--store", str(tmp_path / "ok.sqlite"), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["done"] == 8 and captured.err == ""

    assert main(["grid", "run", write(tmp_path, "typo.yaml", "rulez: [sfg]\n"), "--store",
                 "x"]) == 2
    assert "unknown grid key 'rulez'" in error_line(capsys.readouterr().err)
    assert main(["grid", "status", "--store", str(tmp_path / "ok.sqlite"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["done"] == 8
    assert main(["grid", "status", "--store", str(tmp_path / "none.sqlite")]) == 2
    assert "no results store" in error_line(capsys.readouterr().err)


def test_failed_runs_exit_1_from_the_real_command(tmp_path):
    """The status reaches the process: 1 when runs failed (it used to be 0); the grid's name
    and the paths in the failures print literally."""
    grid = write(tmp_path, "g.yaml", FAILING.replace("name: tiny", "name: '[/x] [red]g'")
                 .replace("MISSING", str(tmp_path / "[red]no-cifar[/red]")))
    res = run("grid", "run", grid, "--store", str(tmp_path / "f.sqlite"), "--no-progress")
    assert res.returncode == 1
    assert "grid '[/x] [red]g': 8/16 done" in res.stdout and "[red]no-cifar[/red]" in res.stdout
    line = error_line(res.stderr)
    assert "'[/x] [red]g': 8 failed of 16 runs" in line and "sfg grid status" in line


def test_python_m_sfg_experiments_works_as_documented(tmp_path):
    grid = write(tmp_path, "g.yaml", GRID)
    res = run("run", grid, "--store", str(tmp_path / "s.sqlite"), "--json",
              module="sfg.experiments")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["total"] == 8
    res = run("status", "--store", str(tmp_path / "nope.sqlite"), module="sfg.experiments")
    assert res.returncode == 2 and "no results store" in error_line(res.stderr)


def test_python_m_sfg_is_the_program():
    res = run("rules", "--json", module="sfg")
    assert res.returncode == 0, res.stderr
    assert any(r["rule"] == "sfg-cut" for r in json.loads(res.stdout))
    res = run("replay", "-p", "nope", module="sfg")
    assert res.returncode == 2 and "unknown outage process" in error_line(res.stderr)


def test_ray_install_hint_prints_the_extra_literally(tmp_path):
    """Without Ray the hint names the extra `sfg[ray]` (markup used to swallow `[ray]`)."""
    grid = write(tmp_path, "g.yaml", GRID)
    code = ("import sys; sys.modules['ray'] = None\n"  # Ray not installed
            "from sfg.cli.main import main\n"
            f"sys.exit(main(['grid', 'run', {grid!r}, '--store', {str(tmp_path / 's.sqlite')!r}, "
            "'--executor', 'ray']))")
    res = run(code=code)
    assert res.returncode == 2
    assert "pip install 'sfg[ray]'" in error_line(res.stderr)


def finished_store(path: Path) -> str:
    """A real results store holding finished training runs: 2 rules x 4 seeds."""
    from sfg.experiments.config import make_config
    from sfg.experiments.store import Store

    configs = [make_config(rule=rule, seed=seed) for rule in ("dfedavg", "sfg")
               for seed in (1, 2, 3, 4)]
    with Store(path) as s:
        ids = s.add_runs(configs)
        for cfg in configs:
            rid, _ = s.claim(ids, "host:1:w")
            acc = 0.5 + 0.01 * cfg.seed + (0.03 if cfg.rule == "sfg" else 0.0)
            metrics = {"acc_mean": acc, "acc_p10": acc - 0.2, "acc_time_avg": acc - 0.1,
                       **{f"acc_q{q}": acc for q in range(1, 5)}, "unavailability": 0.8,
                       "messages": 100.0, "scalars": 0.0, "local_steps_rel": 1.0}
            assert s.finish(rid, "host:1:w", {"metrics": metrics, "curves": {
                "round": [1.0, 2.0], "acc_mean": [acc / 2, acc]}}, seconds=0.1)
    return str(path)


def test_report_exit_0_and_2(tmp_path, capsys):
    store = finished_store(tmp_path / "s.sqlite")
    assert main(["report", "--store", store, "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "sfg" in out and (tmp_path / "rep" / "comparisons.csv").exists()
    assert main(["report", "--store", str(tmp_path / "none.sqlite")]) == 2
    assert "does not exist" in error_line(capsys.readouterr().err)
    assert main(["report", "--store", store, "--baseline", "[red]nope"]) == 2
    assert "[red]nope" in error_line(capsys.readouterr().err)


def test_traces_exit_0_and_2_and_literal_paths(tmp_path, capsys):
    link = tmp_path / "[red]trace[dim].json"
    link.symlink_to(small_flash(tmp_path))
    assert main(["traces", "stats", "--source", "flash", "--path", str(link)]) == 0
    out = "".join(capsys.readouterr().out.split())  # the caption may wrap
    assert "[red]trace[dim].json" in out and "flashtrace" in out
    assert main(["traces", "stats", "--source", "flash", "--path", str(link), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "flash"
    assert main(["traces", "stats", "--source", "flash", "--path", str(tmp_path / "[/x].json")]) == 2
    assert "[/x].json" in error_line(capsys.readouterr().err)
    assert main(["traces", "plot", "--source", "flash", "--path", str(link), "-o", str(tmp_path / "p")]) == 0
    pngs = capsys.readouterr().out.split()
    assert pngs and all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    assert main(["traces", "plot", "--source", "nope", "--path", str(link), "-o", str(tmp_path)]) == 2
    assert "nope" in error_line(capsys.readouterr().err)


def test_demo_bad_input_exits_2(capsys):
    assert main(["demo", "--quick", "extra"]) == 2
    assert "unexpected extra argument" in error_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------- sfg run and RunConfig
TINY_RUN = ("dataset: digits\nmodel: mlp\nn_clients: 12\nrounds: 4\nlocal_steps: 1\n"
            "batch_size: 8\neval_every: 2\ngraph: knn:k=3\nbackend: batched\n"
            "process: bursty:u=0.6\n")


def test_run_exit_0_and_the_config_is_the_grid_schema(tmp_path, capsys):
    """`sfg run` settings are a RunConfig: the run id is the one a grid gives the same run,
    and every flag reaches it."""
    from sfg.experiments.config import make_config, run_id

    cfg = write(tmp_path, "run.yaml", TINY_RUN + "kind: train\n")
    assert main(["run", "--config", cfg, "-r", "SFG-L:gamma=0.30", "--seed", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["rule"] == "sfg-l:gamma=0.3"  # canonical, as in a grid
    assert data["config"]["lr"] == 0.05 and data["config"]["kind"] == "train"  # defaults
    expected = make_config(n_clients=12, rounds=4, local_steps=1, batch_size=8, eval_every=2,
                           graph="knn:k=3", backend="batched", process="bursty:u=0.6",
                           rule="sfg-l:gamma=0.3", seed=3)
    assert data["run_id"] == run_id(expected)

    flags = {"--dataset": "digits", "--model": "mlp", "--process": "bursty:u=0.6",
             "--rule": "sfg", "--graph": "knn:k=3", "--seed": "2", "--clients": "12",
             "--rounds": "4", "--local-steps": "1", "--batch-size": "8", "--lr": "0.1",
             "--weight-decay": "0.001", "--momentum": "0.5", "--alpha": "0.5",
             "--backbone": "personal-head", "--ditto-lambda": "0.3",
             "--anatomy": "cannot-communicate", "--link-failure": "0.1", "--eval-every": "2",
             "--backend": "batched", "--device": "auto"}
    assert main(["run", *(x for kv in flags.items() for x in kv), "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    for flag, value in flags.items():
        key = {"--clients": "n_clients"}.get(flag, flag[2:].replace("-", "_"))
        assert str(cfg[key]) == value, flag


@pytest.mark.parametrize("extra, flags, fragments", [
    ("lr: abc\n", [], ["run.yaml", "lr", "'abc'"]),
    ("rounds: 1.5\n", [], ["run.yaml", "rounds", "valid integer"]),
    ("n_clients: [1, 2]\n", [], ["run.yaml", "n_clients"]),
    ("round: 3\n", [], ["run.yaml", "unknown run setting 'round'", "did you mean 'rounds'"]),
    ("anatomy: fulll\n", [], ["anatomy 'fulll'", "did you mean 'full'"]),
    ("kind: replay\n", [], ["kind 'replay'", "sfg replay"]),
    ("", ["--momentum", "1.5"], ["momentum must lie in [0, 1)"]),
    ("", ["--lr", "-1"], ["learning rate lr must be a finite number > 0"]),
    ("", ["--eval-every", "5"], ["eval_every (5) is larger than rounds (4)"]),
])
def test_run_bad_settings_are_one_line_naming_the_key(tmp_path, capsys, extra, flags, fragments):
    cfg = write(tmp_path, "run.yaml", TINY_RUN + extra)
    assert main(["run", "--config", cfg, *flags]) == 2
    line = error_line(capsys.readouterr().err)
    for fragment in fragments:
        assert fragment in line, line


def test_run_config_file_that_is_not_utf8_or_a_folder(tmp_path, capsys):
    bad = tmp_path / "run.yaml"
    bad.write_bytes(b"lr: \xff\xfe\n")
    assert main(["run", "--config", str(bad)]) == 2
    assert "not UTF-8" in error_line(capsys.readouterr().err)
    assert main(["run", "--config", str(tmp_path)]) == 2
    assert "is a directory, not a file" in error_line(capsys.readouterr().err)


def test_one_settings_schema_no_second_defaults():
    import sfg.sim.run as sim_run
    from sfg.experiments.config import RunConfig

    assert not hasattr(sim_run, "DEFAULTS")
    resolved = sim_run.resolve_config({"rule": "SFG-CUT", "kind": "replay"}, rounds=20)
    assert resolved == {**RunConfig().model_dump(), "rule": "sfg-cut", "rounds": 20}


# ----------------------------------------------------------------------------- layout and imports
def test_no_sub_command_imports_the_root_cli():
    """sfg.cli.main gathers the sub-commands; none of them, nor anything else in the library,
    imports it back (only the package face and the ``python -m`` entry points do)."""
    allowed = {SRC / "sfg" / "__main__.py", SRC / "sfg" / "cli" / "__init__.py",
               SRC / "sfg" / "cli" / "__main__.py", SRC / "sfg" / "cli" / "main.py"}
    for path in (SRC / "sfg").rglob("*.py"):
        if path in allowed:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {a.name for a in node.names}
                assert node.module != "sfg.cli.main", path
                assert not (node.module == "sfg.cli" and names & {"main", "entry", "app"}), path
                assert node.level == 0, path  # absolute imports only
            elif isinstance(node, ast.Import):
                assert all(a.name != "sfg.cli.main" for a in node.names), path


def test_a_broken_sub_command_fails_loudly():
    code = ("import sys; sys.modules['sfg.cli.traces'] = None\n"
            "from sfg.cli.main import main\nsys.exit(main(['--help']))")
    res = run(code=code)
    assert res.returncode != 0 and "sfg.cli.traces" in res.stderr


IMPORT_PROBE = """
import json, sys
from sfg.cli.main import main
rc = main({argv!r})
heavy = ["torch", "matplotlib", "scipy.sparse", "scipy.spatial", "scipy.stats",
         "scipy.special", "scipy.linalg", "numpy", "pydantic", "sklearn", "PIL", "numba"]
print(json.dumps({{"rc": rc, "loaded": [m for m in heavy if m in sys.modules]}}))
"""


def imports_of(argv: list[str]) -> set[str]:
    res = run(code=IMPORT_PROBE.format(argv=argv))
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert data["rc"] == 0
    return set(data["loaded"])


def test_replay_imports_no_torch_matplotlib_or_scipy(tmp_path):
    tiny = ["replay", "-p", "bursty:u=0.8", "-r", "sfg-cut", "--seeds", "1", "-n", "12", "-T",
            "20", "--json"]
    loaded = imports_of(tiny)
    assert "numpy" in loaded  # the probe sees what was imported
    # numba's BLAS probe would load scipy.linalg (0.13 s): sfg answers it (sfg.util.numba_start)
    assert not loaded & {"torch", "matplotlib", "scipy.sparse", "scipy.spatial", "scipy.stats",
                         "scipy.special", "scipy.linalg", "sklearn", "PIL"}, loaded
    assert "matplotlib" in imports_of([*tiny, "--plot", str(tmp_path / "s.png")])


BLAS_AFTER_SFG = """
import json, sys
import numpy as np
from sfg.round.kernel import run_rounds  # noqa: F401 - numba as sfg starts it
from sfg.util.numba_start import njit
import numba.np.arraymath as am, numba.np.linalg as nl

@njit
def dot(a, b):
    return np.dot(a, b), np.linalg.det(a)

a = np.array([[2.0, 1.0], [0.0, 3.0]])
d, det = dot(a, a)
print(json.dumps({"blas": am._HAVE_BLAS, "dot": d.tolist(), "det": det,
                  "restored": nl.ensure_blas.__name__, "scipy.linalg": "scipy.linalg" in sys.modules}))
"""


def test_compiled_blas_still_works_after_sfg_answered_the_probe():
    """sfg answers numba's import-time BLAS probe without loading scipy.linalg; a compiled
    np.dot and np.linalg in the same process still work (numba's real check runs then)."""
    res = run(code=BLAS_AFTER_SFG)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["blas"] is True and got["restored"] == "ensure_blas"
    assert got["dot"] == [[4.0, 5.0], [0.0, 9.0]] and abs(got["det"] - 6.0) < 1e-12
    assert got["scipy.linalg"] is True  # loaded when a compiled call needed it


def test_help_and_listings_import_no_library():
    assert not imports_of(["--help"]) & {"numpy", "torch", "matplotlib", "pydantic", "numba"}
    assert not imports_of(["grid", "--help"]) & {"numpy", "numba", "torch"}
    # (rules are numba functions, so listing them imports numba; it compiles nothing)
    assert not imports_of(["rules"]) & {"torch", "matplotlib", "scipy.sparse", "scipy.spatial"}


def test_traces_and_report_import_no_torch(tmp_path):
    flash = small_flash(tmp_path)
    loaded = imports_of(["traces", "stats", "--source", "flash", "--path", str(flash), "--json"])
    assert not loaded & {"torch", "matplotlib", "scipy.sparse", "scipy.stats", "numba"}, loaded
    store = finished_store(tmp_path / "s.sqlite")
    loaded = imports_of(["report", "--store", store, "--out", str(tmp_path / "r")])
    assert "torch" not in loaded and "matplotlib" in loaded  # the report writes its plots


# ----------------------------------------------------------------------------- process exit
EXIT_SCRIPT = """\
import atexit, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from sfg.cli import console
out = Path(sys.argv[1])
pool = ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.3), (out / "pool").write_text("done")))  # still queued work
atexit.register(lambda: (out / "atexit").write_text("done"))
if sys.argv[2] == "sqlite":
    import sqlite3
    db = sqlite3.connect(out / "s.sqlite")  # left open: closing it removes the -wal file
    db.execute("PRAGMA journal_mode=WAL"); db.execute("CREATE TABLE t (x)")
    db.execute("INSERT INTO t VALUES (1)"); db.commit()
sys.stdout.write("x" * 100000)  # buffered output still to flush
from sfg.util import internals
atexit.register(lambda: (out / "fallbacks").write_text(",".join(internals.fallbacks())))
console.exit_process(int(sys.argv[3]))
raise SystemExit(99)  # never reached
"""


@pytest.mark.parametrize("kind, code, public", [("plain", 0, False), ("plain", 2, False),
                                                ("sqlite", 1, False), ("plain", 2, True)])
def test_exit_process_finishes_what_a_normal_exit_finishes(tmp_path, kind, code, public):
    """The installed program's exit: queued thread-pool work and atexit handlers run, output
    is flushed, the status is kept; with SQLite loaded the usual teardown closes the open
    connection (no -wal/-shm file left). The same through the fallback on public API
    (``SFG_PUBLIC_API=1``: ``sys.exit``, no interpreter internals; sfg.util.internals)."""
    env = {**ENV, "SFG_PUBLIC_API": "1"} if public else ENV
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path), kind, str(code)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == code, r.stderr
    if kind == "plain":  # (with SQLite loaded the usual exit is taken anyway)
        assert (tmp_path / "fallbacks").read_text() == ("fast-exit" if public else "")
    assert r.stdout == "x" * 100000 and "Traceback" not in r.stderr
    assert (tmp_path / "pool").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "done"
    if kind == "sqlite":
        assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit", "fallbacks", "pool",
                                                              "s.sqlite"]


def test_installed_program_exits_fast_with_complete_output():
    """``sfg`` as installed (``sfg.cli.main:entry``): JSON on a pipe is complete and the status
    kept, for success and for bad input."""
    r = run("replay", "-p", "bursty:u=0.8", "-r", "sfg", "--seeds", "1", "--clients", "20",
            "--rounds", "30", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"][0]["rule"] == "sfg"
    bad = run("replay", "-p", "nope")
    assert bad.returncode == 2 and error_line(bad.stderr).startswith("error: unknown outage")
