"""The bad-input suite: generated hostile inputs across flags, component strings, every trace
format, every dataset format and archive form, configs, grids and stores.

Each case must end with exit status 2 (1 where work failed), exactly one ``error: ...`` line on
stderr naming the problem, no traceback, nothing written outside the output folder, and bounded
time and memory: the cases built to ask for gigabytes run in a child process under an
address-space limit (``RLIMIT_AS``) well below what the input asks for.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import sqlite3
import tarfile
from pathlib import Path

import numpy as np
import pytest
from badinput import Case, check_case

# ------------------------------------------------------------------------------ helpers
REPLAY = ["replay", "--rounds", "20", "--clients", "8", "--seeds", "1", "--graph", "ring:k=1",
          "--json"]


def replay(**over: str) -> list[str]:
    """``sfg replay`` on a small problem, with ``--rounds`` etc. replaced by ``over``."""
    opts = dict(zip(REPLAY[1::2], REPLAY[2::2], strict=False))
    opts.update({"--" + k.replace("_", "-"): v for k, v in over.items()})
    return ["replay", *(x for kv in opts.items() for x in kv), "--json"]


def write(folder: Path, name: str, data: bytes | str) -> Path:
    p = folder / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def flash_json(messages: dict[str, str]) -> str:
    return json.dumps({k: {"guid": k, "model": "m", "messages": v} for k, v in messages.items()})


GOOD_FLASH_MSG = "\n".join(f"2021-03-0{d} {h:02d}:00:00\t{ev}" for d in range(1, 5)
                           for h, ev in ((1, "screen_off"), (2, "battery_charged_on"),
                                         (3, "wifi"), (20, "screen_on")))
GOOD_STUNNER = "u1 1 1614556800000 0 " + " ".join(["3600000"] * 200)


def traces(source: str, path: Path, *extra: str) -> list[str]:
    return ["traces", "stats", "--source", source, "--path", str(path), "--json", *extra]


def cases_for(prefix: str, items: list[tuple]) -> list[Case]:
    out = []
    for i, item in enumerate(items):
        build, match, *rest = item
        kw = rest[0] if rest else {}
        out.append(Case(f"{prefix}-{i:02d}", build, match, **kw))
    return out


# ------------------------------------------------------------------------------ component strings
BAD_RULES = [
    ("sfg-l:gamma=0.3,gamma=0.5", "'gamma' twice"),
    ("nope", "unknown .*rule"),
    ("sfg-l:gama=0.3", "unknown parameter 'gama'.*did you mean 'gamma'"),
    ("sfg-l:gamma", "cannot parse .*parameter"),
    ("sfg-l:=0.3", "cannot parse .*parameter"),
    ("sfg+", "empty '\\+' modifier"),
    ("sfg+nope", "modifier|unknown"),
    (":gamma=0.3", "no name"),
    ("sfg-cut:L=-1", "L"),
    ("sfg-cut:L=abc", "L"),
    ("sfg-l:gamma=nan", "gamma"),
    ("sfg-l:gamma=-1", "gamma"),
    ("dfedavg:c=-2", "c"),
    ("aoi+ipw+ipw", "modifier '\\+ipw' twice"),
    ("oracle-gls:kappa=99999999999999999999999", "kappa=.* must lie in \\[0, 1e\\+06\\]"),
    ("oracle-qp:kappa=1e400", "kappa=inf must lie in"),
]
BAD_PROCESSES = [
    ("bursty:u=2", "u"),
    ("bursty:u=0.8,u=0.5", "'u' twice"),
    ("iid:u=-0.1", "u"),
    ("iid:u=nan", "u"),
    ("bursty:u=0.8,mean_off=0", "mean_off"),
    ("heterogeneous:u=0.5,mean_off=99999999999999999999999", "mean_off=1e\\+23 must be at most"),
    ("nope:u=1", "unknown outage process"),
    ("bursty:u=0.8+x", "modifiers"),
    ("flash", "needs a file"),
    ("flash:path=/nonexistent/x.json", "not found"),
    ("stunner:path=/nonexistent/s.txt", "not found"),
    ("trace:path=/nonexistent/t.csv", "not found"),
    ("flash:path=/tmp,rule=strict", "not a file"),
]
BAD_GRAPHS = [
    ("knn:k=0", "k"),
    ("knn:k=2.5", "k"),  # (knn:k=100 at N=8 runs on knn:k=7: test_short_runs)
    ("ring:k=99", "ring k=99"),
    ("regular:d=0", "d"),
    ("erdos-renyi:p=2", "p"),
    ("nope", "unknown graph"),
    ("knn:k=2,k=3", "'k' twice"),
]

def fixed(*argv: str):
    """A case builder that writes no file: the command line ``argv``."""
    return lambda folder: list(argv)


COMPONENT_CASES = (
    [Case(f"rule-{i:02d}", fixed(*REPLAY, "--rule", r), m) for i, (r, m) in enumerate(BAD_RULES)]
    + [Case(f"process-{i:02d}", fixed(*REPLAY, "--rule", "sfg", "--process", p), m)
       for i, (p, m) in enumerate(BAD_PROCESSES)]
    + [Case(f"graph-{i:02d}", fixed(*replay(graph=g), "--rule", "sfg"), m)
       for i, (g, m) in enumerate(BAD_GRAPHS)]
)

# ------------------------------------------------------------------------------ CLI flags
BAD_FLAGS = [  # (options replacing the small problem's, extra arguments, message)
    ({"clients": "0"}, [], "N=0|clients"),
    ({"clients": "-3"}, [], "N=-3|clients"),
    ({"rounds": "0"}, [], "T=0|rounds"),
    ({"rounds": "-5"}, [], "T=-5|rounds"),
    ({"seeds": "x"}, [], "cannot read seeds 'x'"),
    ({"seeds": "-1"}, [], "seeds '-1' must be non-negative"),
    ({"seeds": ","}, [], "seeds ',' must be"),
    ({"seeds": "0-999999999999"}, [], "name 1,000,000,000,000 seeds, over the limit"),
    ({"seeds": "5-1"}, [], "seeds '5-1' must be"),
    ({}, ["--horizon", "-5"], "--horizon -5 must be >= 0"),
    ({"engine": "bogus"}, [], "engine"),
    ({"engine": "numpy"}, ["--engine", "compiled"], "--engine is given twice"),
    ({}, ["--seeds", "2"], "--seeds is given twice"),
    ({}, ["--graph", "knn:k=2"], "--graph is given twice"),
    ({}, ["--anatomy", "bogus"], "anatomy"),
    ({}, ["--link-failure", "2"], "link"),
    ({}, ["--link-failure", "nan"], "link"),
]
FLAG_CASES = [Case(f"flag-{i:02d}", fixed(*replay(**o), "--rule", "sfg", *a), m)
              for i, (o, a, m) in enumerate(BAD_FLAGS)]
FLAG_CASES += [
    # sizes far past the budget: refused before anything is allocated (2 GiB address space)
    Case("flag-clients-huge", lambda f: [*replay(clients="3000000000"), "--rule", "sfg"],
         "over the limit.*SFG_MAX_MEMORY", limit_gib=2),
    Case("flag-rounds-huge", lambda f: [*replay(rounds="90000000000"), "--rule", "sfg"],
         "over the limit.*SFG_MAX_MEMORY", limit_gib=2),
    Case("flag-rounds-clients", lambda f: [*replay(rounds="2000000", clients="5000"), "--rule",
                                           "sfg"],
         "rounds x 5,000 clients.*over the limit", limit_gib=2),
    Case("flag-repeated-run", lambda f: ["run", "--rule", "sfg", "--rule", "dfedavg"],
         "--rule is given twice"),
    Case("flag-repeated-grid", lambda f: ["grid", "status", "--store", "a", "--store", "b"],
         "--store is given twice"),
]

SIM = ["run", "--clients", "8", "--graph", "ring:k=1", "--rounds", "2", "--eval-every", "1",
       "--process", "none", "--json"]
FLAG_CASES += [
    Case("flag-batch-huge", fixed(*SIM, "--batch-size", "1000000000"),
         "minibatch draws .* over the limit.*lower --batch-size", limit_gib=3),
    Case("flag-steps-huge", fixed(*SIM, "--local-steps", "100000000"),
         "minibatch draws .* over the limit.*--local-steps", limit_gib=3),
    Case("flag-lr-float32", fixed(*SIM, "--lr", "1e308"), "lr=1e\\+308 does not fit the float32"),
    Case("flag-wd-float32", fixed(*SIM, "--weight-decay", "1e300"), "weight_decay .* float32"),
    Case("flag-run-clients-1", fixed(*SIM[:1], "--clients", "1", *SIM[3:]), "n_clients"),
]

# ------------------------------------------------------------------------------ FLASH traces
def _flash(text: str | bytes, *extra: str, name: str = "flash.json"):
    return lambda f: traces("flash", write(f, name, text), *extra)


FLASH_CASES = cases_for("flash", [
    (_flash("not json"), "invalid JSON at line 1"),
    (_flash('{"a": {"messages": "2021-01-01 00:00:00\\twifi"'), "invalid JSON"),
    (_flash("[" * 100_000 + "]" * 100_000), "nested too deeply"),
    (_flash('{"a": ' * 50_000 + "1" + "}" * 50_000), "nested too deeply"),
    (_flash("[1, 2]"), "expected a non-empty JSON object"),
    (_flash("{}"), "expected a non-empty JSON object"),
    (_flash('{"a": 1}'), "no 'messages' string"),
    (_flash('{"a": {"messages": 5}}'), "no 'messages' string"),
    (_flash(flash_json({"a": "no tab here"})), "expected 'YYYY-MM-DD HH:MM:SS"),
    (_flash(flash_json({"a": "2021-13-45 99:00:00\twifi"})), "bad timestamp"),
    (_flash(flash_json({"a": "yesterday\twifi"})), "timestamp is not"),
    (_flash(flash_json({"a": "2021-01-01 00:00:00\tteleport"})), "unknown event"),
    (_flash(flash_json({"a": ""})), "no device has any event"),
    (_flash(b"\xff\xfe{\x00}"), "not UTF-8 text"),
    (_flash(b'{"a": {"messages": "2021-01-01 00:00:00\\t\xc3\x28"}}'), "not UTF-8 text"),
    (_flash(""), "empty"),
    (lambda f: traces("flash", f), "is a directory|not a file"),
    (_flash(flash_json({"a": "2021-01-01 00:00:00\twifi\n2024-01-01 00:00:00\twifi"})),
     "spans 1095 days"),
    (_flash(flash_json({"a": GOOD_FLASH_MSG}), "--rounds", "0"), "rounds"),
    (_flash(flash_json({"a": GOOD_FLASH_MSG}), "--round-minutes", "2.5"), "round_minutes"),
    (_flash(flash_json({"a": GOOD_FLASH_MSG}), "--min-availability", "1.5"), "min_availability"),
    (_flash(flash_json({"a": GOOD_FLASH_MSG}), "--availability", "lenient"), "unknown FLASH rule"),
    # a few hundred KB asking for tens of GiB: 2,000 devices x 399 days of minutes
    (_flash(flash_json({f"d{i}": "2021-01-01 00:00:00\twifi\n2022-02-03 00:00:00\twifi"
                        for i in range(2000)})), "over the limit.*SFG_MAX_MEMORY",
     {"limit_gib": 1.5}),
    (_flash(flash_json({"a": GOOD_FLASH_MSG}), "--rounds", "1000000000"),
     "FLASH window.*over the limit", {"limit_gib": 1.5}),
])

# ------------------------------------------------------------------------------ STUNner traces
def _stun(text: str | bytes, *extra: str):
    return lambda f: traces("stunner", write(f, "sessions.txt", text), *extra)


STUNNER_LINES = [
    ("u1 1 0 0", "at least one duration"),
    ("u1 2 0 0 1000", "firstOnline must be 0 or 1"),
    ("u1 1 -5 0 1000", "window start"),
    ("u1 1 99999999999999999999999999 0 1000", "window start"),
    ("u1 1 abc 0 1000", "window start must be epoch"),
    ("u1 1 0 99 1000", "timezone offset"),
    ("u1 1 0 nan 1000", "timezone offset"),
    ("u1 1 0 x 1000", "timezone offset"),
    ("u1 1 0 0 1000 -5", "negative"),
    ("u1 1 0 0 1000 x", "not an integer"),
    ("u1 1 0 0 0 0", "sum to 0 ms"),
    ("u1 1 0 0 99999999999999999999999", "longer than ten years"),
    ("u1 1 0 0 " + " ".join(["4611686018427387904"] * 4), "longer than ten years"),
    ("u1 1 0 0 9000000000000000", "longer than ten years"),
    ("u1 1 0 0 " + " ".join(["300000000000"] * 2), "more than ten years"),
    ("u1 1 0 0 1000\nu1 1 500 0 1000", "running .* past the start"),
    ("u1 1 0 0 1e5", "not an integer"),
]
STUNNER_CASES = cases_for("stunner", [(_stun(line), m) for line, m in STUNNER_LINES] + [
    (_stun(b"u1 1 0 0 \xff\xfe"), "not UTF-8 text"),
    (_stun(""), "empty"),
    (_stun("\n\n  \n"), "no session lines"),
    (_stun(GOOD_STUNNER, "--variant", "weekly"), "unknown STUNner variant"),
    (_stun(GOOD_STUNNER, "--rounds", "-1"), "rounds"),
    (_stun(GOOD_STUNNER, "--round-minutes", "1e400"), "round_minutes must be a positive whole"),
    (_stun(GOOD_STUNNER, "--round-minutes", "nan"), "round_minutes must be a positive whole"),
    (_stun(GOOD_STUNNER, "--min-availability", "2"), "min_availability"),
    (lambda f: traces("stunner", f), "is a directory|not a file"),
    (_stun(GOOD_STUNNER, "--rounds", "100000000000"), "STUNner window.*over the limit",
     {"limit_gib": 1.5}),
])

# ------------------------------------------------------------------------------ tabular traces
def _csv(text: str | bytes, *extra: str, name: str = "fleet.csv"):
    return lambda f: traces("tabular", write(f, name, text), *extra)


CSV_TEXTS = [
    ("", "empty"),
    ("device,start,end\n", "no data rows"),
    ("who,when\nx,1\n", "no 'device' column"),
    ("device,when\nx,1\n", "no 'start' column"),
    ("device,round\nx,1\n", "no 'available' column"),
    ("device,round,available\nx,abc,1\n", "round must be a non-negative integer"),
    ("device,round,available\nx,-1,1\n", "round must be a non-negative integer"),
    ("device,round,available\nx,1.5,1\n", "round must be a non-negative integer"),
    ("device,round,available\nx,inf,1\n", "round must be a non-negative integer"),
    ("device,round,available\nx,1,maybe\n", "'available' must be"),
    ("device,round,available\nx,1,1\nx,1,0\n", "appears twice"),
    ("device,round,available\nx,1,1,9\n", "field"),
    ("device,start,end\nx,10,5\n", "must be after start"),
    ("device,start,end\nx,10,10\n", "must be after start"),
    ("device,start,end\nx,0,100\nx,50,150\n", "overlaps"),
    ("device,start,end\nx,2024-03-01T00:00,2024-03-01T01:00+02:00\n", "start is .* but end is .*offset"),
    ("device,start,end\nx,2024-03-01T00:00,500\n", "start is .* but end is"),
    ("device,start,end\nx,monday,tuesday\n", "ISO timestamp"),
    ("device,start,end\nx,0,nan\n", "must be after start"),
    ("device,start,end\nx,\"0,1\n", "malformed CSV|field"),
    (b"device,start,end\nx\xff,0,10\n", "not UTF-8 text"),
    ("device,start,end\nx,0,10\n" + "y," + "9" * 5000 + ",1\n", "after start|limit"),
    # 54-byte files asking for gigabytes
    ("device,round,available\nx,999999999999,1\n", "over the limit.*SFG_MAX_MEMORY"),
    ("device,start,end\nx,0,1e15\n", "over the limit.*SFG_MAX_MEMORY"),
    ("device,start,end\nx,0,9e307\n", "over the limit.*SFG_MAX_MEMORY"),
    ("device,start,end\nx,1900-01-01T00:00,9999-01-01T00:00\n", "over the limit"),
]
TABULAR_CASES = cases_for("tabular", [
    (_csv(t), m, {"limit_gib": 1.5} if "limit" in m else {}) for t, m in CSV_TEXTS] + [
    (_csv("device,round,available\nx,1,1\n", "--rounds", "1000000000000"), "over the limit",
     {"limit_gib": 1.5}),
    (_csv("device,start,end\nx,0,10\n", "--round-minutes", "0"), "round_minutes"),
    (_csv("device,start,end\nx,0,10\n", "--round-minutes", "inf"), "positive finite number"),
    (_csv("device,start,end\nx,0,10\n", "--round-minutes", "0.000000001"), "over the limit",
     {"limit_gib": 1.5}),
    (_csv("device,start,end\nx,0,10\n", "--min-availability", "-1"), "min_availability"),
    (_csv(b"PAR1garbage-not-parquetPAR1", name="t.parquet"), "cannot read Parquet"),
    (lambda f: traces("tabular", f), "is a directory|not a file"),
    (_csv("device,start,end\nx,0,10\n", name="t.csv/"), "x"),  # replaced below
    (lambda f: traces("fancy", write(f, "t.csv", "device,start,end\nx,0,1\n")),
     "unknown trace source"),
])
TABULAR_CASES.pop(-2)


def _parquet_bomb(f: Path) -> list[str]:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = f / "t.parquet"
    pq.write_table(pa.table({"device": ["x"], "round": [10 ** 14], "available": [1]}), p)
    return traces("tabular", p)


def _parquet_missing(f: Path) -> list[str]:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = f / "t.parquet"
    pq.write_table(pa.table({"who": ["x"], "when": [1]}), p)
    return traces("tabular", p)


TABULAR_CASES += [Case("parquet-bomb", _parquet_bomb, "over the limit", limit_gib=1.5),
                  Case("parquet-columns", _parquet_missing, "no 'device' column")]

# ------------------------------------------------------------------------------ trace processes
PROCESS_FILE_CASES = cases_for("trace-process", [
    (lambda f: [*REPLAY, "--rule", "sfg", "--process",
                f"trace:path={write(f, 't.csv', 'device,round,available' + chr(10) + 'x,25,1' + chr(10))}"],
     "only 1 eligible devices"),
    (lambda f: [*REPLAY, "--rule", "sfg", "--process",
                f"stunner:path={write(f, 's.txt', 'u1 2 0 0 10')}"], "firstOnline"),
    (lambda f: [*REPLAY, "--rule", "sfg", "--process",
                f"flash:path={write(f, 'f.json', '[' * 50000)}"], "nested too deeply|invalid JSON"),
    (lambda f: [*REPLAY, "--rule", "sfg", "--process",
                f"flash:path={write(f, 'f.json', flash_json({'a': GOOD_FLASH_MSG}))},rounds=10,"
                "rounds=20"], "'rounds' twice"),
    (lambda f: [*REPLAY, "--rule", "sfg", "--process",
                f"flash:path={write(f, 'f.json', flash_json({'a': GOOD_FLASH_MSG}))},"
                "rounds=99999999999999999999999"], "FLASH window .* over the limit"),
    (lambda f: [*REPLAY, "--rule", "sfg", "--process",
                f"trace:path={write(f, 's.txt', GOOD_STUNNER)}"],
     r"no 'device' column \(columns: u1 1 1614556800000 0 3600000 3600000 3600, \.\.\.\)|"
     r"no 'device' column \(columns: .{1,40}\)"),
])


# ------------------------------------------------------------------------------ datasets
def run_data(dataset: str, root: Path, *extra: str) -> list[str]:
    return ["run", "--dataset", dataset, "--data-root", str(root), "--clients", "4",
            "--graph", "ring:k=1", "--rounds", "1", "--eval-every", "1", "--json", *extra]


def cifar_batch(n: int = 10, over: dict | None = None) -> bytes:
    d = {b"data": np.zeros((n, 3072), np.uint8), b"labels": [i % 10 for i in range(n)]}
    d.update(over or {})
    return pickle.dumps(d, protocol=2)


def cifar_dir(f: Path, **files: bytes) -> Path:
    root = f / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for n in names:
        write(root, n, files.get(n, cifar_batch()))
    return f


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED",))


def tar_gz(f: Path, name: str, members: dict[str, bytes]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for m, data in members.items():
            info = tarfile.TarInfo(m)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return write(f, name, buf.getvalue())


def tar_gz_zeros_member(f: Path, name: str, member: str, size: int) -> Path:
    """A .tar.gz with one member of ``size`` zero bytes, streamed (it stays tiny on disk)."""
    p = f / name
    with gzip.open(p, "wb", compresslevel=9) as gz:
        info = tarfile.TarInfo(member)
        info.size = size
        gz.write(info.tobuf(format=tarfile.GNU_FORMAT))
        chunk = bytes(1 << 20)
        left = size
        while left > 0:
            gz.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
        gz.write(bytes(-size % 512) + bytes(1024))
    return p


def png(w: int, h: int, value: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (w, h), value).save(buf, format="PNG")
    return buf.getvalue()


def image_folder(f: Path, files: dict[str, bytes] | None = None) -> Path:
    root = f / "imgs"
    base = {"train/a/0.png": png(8, 8), "train/b/0.png": png(8, 8),
            "test/a/0.png": png(8, 8), "test/b/0.png": png(8, 8)}
    base.update(files or {})
    for n, data in base.items():
        write(root, n, data)
    return root


def leaf(f: Path, train: bytes | str, test: bytes | str | None = None) -> Path:
    root = f / "femnist"
    good = json.dumps({"users": ["w"], "num_samples": [1],
                       "user_data": {"w": {"x": [[0.0] * 784], "y": [1]}}})
    write(root, "train/a.json", train)
    write(root, "test/a.json", good if test is None else test)
    return root


def leaf_doc(x, y) -> str:
    return json.dumps({"users": ["w"], "num_samples": [1], "user_data": {"w": {"x": x, "y": y}}})


def _symlinked(f: Path) -> list[str]:
    secret = write(f, "outside/secret.png", png(8, 8))
    root = image_folder(f)
    (root / "train" / "a" / "1.png").symlink_to(secret)
    return run_data("imagefolder", root)


def _symlinked_dir(f: Path) -> list[str]:
    write(f, "outside/c/0.png", png(8, 8))
    root = image_folder(f)
    (root / "train" / "c").symlink_to(f / "outside" / "c", target_is_directory=True)
    return run_data("imagefolder", root)


DATASET_CASES = cases_for("data", [
    (lambda f: run_data("cifar10", f / "nothing-here"), "does not exist"),
    (lambda f: run_data("cifar10", write(f, "empty/readme.txt", "hi").parent), "no CIFAR-10 data"),
    (lambda f: run_data("cifar10", cifar_dir(f, data_batch_3=b"not a pickle")),
     "data_batch_3"),
    (lambda f: run_data("cifar10", cifar_dir(f, data_batch_1=pickle.dumps(_Evil()))),
     "refusing to unpickle posix.system from .*data_batch_1"),
    (lambda f: run_data("cifar10", cifar_dir(f, test_batch=pickle.dumps([1, 2, 3]))),
     "not a CIFAR batch"),
    (lambda f: run_data("cifar10", cifar_dir(f, test_batch=pickle.dumps({b"x": 1}))),
     "lack 'data'"),
    (lambda f: run_data("cifar10", cifar_dir(f, data_batch_2=cifar_batch(
        over={b"labels": [99] * 10}))), "labels must lie in 0..9"),
    (lambda f: run_data("cifar10", cifar_dir(f, data_batch_2=cifar_batch(
        over={b"labels": [1] * 3}))), "10 images but 3 labels"),
    (lambda f: run_data("cifar10", cifar_dir(f, data_batch_2=cifar_batch(
        over={b"labels": [2 ** 70] * 10}))), "labels|integers"),
    (lambda f: run_data("cifar10", cifar_dir(f, data_batch_2=cifar_batch(
        over={b"data": np.zeros((10, 5), np.uint8)}))), "uint8 array \\[n, 3072\\]"),
    (lambda f: run_data("cifar10", write(cifar_dir(f) / "cifar-10-batches-py", "data_batch_5",
                                         b"").parent.parent), "data_batch_5"),
    (lambda f: (lambda r: (r.joinpath("cifar-10-batches-py/test_batch").unlink(),
                           run_data("cifar10", r))[1])(cifar_dir(f)), "lacks test_batch"),
    (lambda f: run_data("cifar10", write(f, "c/cifar-10-python.tar.gz", b"\x1f\x8b junk").parent),
     "cannot (read|decompress) archive"),
    (lambda f: run_data("cifar10", tar_gz(f, "cifar-10-python.tar.gz", {
        "cifar-10-batches-py/data_batch_1": b"x"}).parent), "lacks|cannot"),
    (lambda f: run_data("cifar10", write(f, "cifar-10-python.tar.gz", gzip.compress(
        tar_gz(f, "x.tar", {"cifar-10-batches-py/test_batch": b"zz"}).read_bytes())[:60]).parent),
     "cannot (read|decompress)|truncated"),
    # a tiny .tar.gz whose one member decompresses to 64 MiB of zeros: refused at its header
    (lambda f: run_data("cifar10", tar_gz_zeros_member(
        f, "cifar-10-python.tar.gz", "cifar-10-batches-py/data_batch_1", 64 << 20).parent),
     "declares 64 MiB.*SFG_MAX_MEMBER", {"env": {"SFG_MAX_MEMBER": "16M"}, "limit_gib": 3}),
    # 100 MiB of zeros in a ~100 KiB archive: refused for its ratio before decompressing
    (lambda f: run_data("cifar10", tar_gz_zeros_member(
        f, "cifar-10-python.tar.gz", "cifar-10-batches-py/data_batch_1", 100 << 20).parent),
     "expands to more than 100 MiB from .* looks like a decompression bomb.*SFG_MAX_RATIO",
     {"limit_gib": 3}),
    # members under the per-member limit but over the total
    (lambda f: run_data("cifar10", tar_gz(f, "cifar-10-python.tar.gz", {
        f"cifar-10-batches-py/{n}": bytes(6 << 20) for n in
        [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]}).parent),
     "decompresses to more than.*SFG_MAX_MEMORY", {"env": {"SFG_MAX_MEMORY": "20M"},
                                                    "limit_gib": 3}),
    (lambda f: run_data("imagefolder", image_folder(f, {"train/a/1.png": b"not an image"})),
     "cannot decode image"),
    (lambda f: run_data("imagefolder", image_folder(f, {"train/a/1.png": png(9, 8)})),
     "is 9x8 but the first image is 8x8"),
    (lambda f: run_data("imagefolder", image_folder(f, {"test/zzz/0.png": png(8, 8)})),
     "test classes \\['zzz'\\]"),
    # a pixel bomb: a few KB of PNG that decodes to 4000 x 4000 pixels
    (lambda f: run_data("imagefolder", image_folder(f, {"train/a/0.png": png(4000, 4000)})),
     "4000x4000 pixels.*SFG_MAX_MEMBER", {"env": {"SFG_MAX_MEMBER": "8M"}, "limit_gib": 3}),
    # a decode-time bomb: 81 megapixels in a few hundred KB, refused at its header
    (lambda f: run_data("imagefolder", image_folder(f, {"train/a/0.png": png(9000, 9000)})),
     r"9000x9000 = 81\.0 megapixels, over the per-image budget.*SFG_MAX_PIXELS"),
    (lambda f: run_data("imagefolder", image_folder(f, {
        f"train/a/{i}.png": png(64, 64) for i in range(40)})),
     "images of 64x64 pixels.*over the limit", {"env": {"SFG_MAX_MEMORY": "200K"}}),
    (_symlinked, "symbolic link .* outside the data root"),
    (_symlinked_dir, "symbolic link .* outside the data root"),
    (lambda f: run_data("imagefolder", tar_gz(f, "imgs.tar.gz", {
        "train/a/0.png": png(8, 8), "test/a/0.png": b"\x89PNG broken"}).parent),
     "cannot decode image"),
    (lambda f: run_data("femnist", leaf(f, "{not json")), "LEAF shard .*invalid JSON"),
    (lambda f: run_data("femnist", leaf(f, "[" * 100_000)), "nested too deeply"),
    (lambda f: run_data("femnist", leaf(f, b"\xff\xfe")), "not UTF-8 text"),
    (lambda f: run_data("femnist", leaf(f, json.dumps({"users": []}))), "no 'user_data'"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([[0.0] * 784], [2 ** 70]))),
     "out-of-range"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([[0.0] * 784], [99]))),
     "labels outside 0..61"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([[0.0] * 783], [1]))), "784 values"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([[0.0] * 784, [0.0]], [1, 1]))),
     "ragged"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([[1e400] * 784], [1]))), "non-finite"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([[0.0] * 784], [1, 2]))),
     "1 images but 2 labels"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([["a"] * 784], [1]))), "non-numeric"),
    (lambda f: run_data("femnist", leaf(f, leaf_doc([[0.0] * 784], [1]))),
     "only 0 writers have at least 250"),
    # the sizes of the clients' data, as dataset parameters
    (lambda f: run_data("cifar10:min_train=0", cifar_dir(f)), "min_train .* whole number >= 1"),
    (lambda f: run_data("cifar10:min_train=-2", cifar_dir(f)), "cifar10:min_train=4"),
    (lambda f: run_data("cifar10:min_train=1.5", cifar_dir(f)), "min_train .* got 1.5"),
    (lambda f: run_data("cifar10:test_per_client=x", cifar_dir(f)), "test_per_client .* 'x'"),
    (lambda f: run_data("imagefolder:test_per_client=0", image_folder(f)), "test_per_client"),
    (lambda f: run_data("cifar10:min_train=99", cifar_dir(f)),
     "lower the minimum \\(the dataset parameter min_train, e.g. cifar10:min_train="),
])

# ------------------------------------------------------------------------------ --config
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def _config(text: str | bytes, name: str = "c.yaml"):
    return lambda f: ["run", "--config", str(write(f, name, text))]


CONFIG_CASES = cases_for("config", [
    (_config(b"rounds: 5\n\xff\xfe"), "not UTF-8 text"),
    (_config(b"\xff{}", name="c.json"), "not UTF-8 text"),
    (_config("rounds: abc\n"), "rounds.*(must be int|valid integer).*'abc'"),
    (_config("lr: [1, 2]\n"), "lr.*(must be float|valid number).*\\[1, 2\\]"),
    (_config("n_clients: 1.5\n"), "n_clients.*(must be int|valid integer).*1\\.5"),
    (_config("seed: true\n"), "seed.*(must be int|valid integer).*True"),
    (_config("roundz: 5\n"), "unknown (run )?setting 'roundz'.*did you mean 'rounds'"),
    (_config("- 1\n- 2\n"), "must hold a mapping"),
    (_config(""), "must hold a mapping"),
    (_config("a: [1, 2\n"), "invalid YAML"),
    (_config("a: b: c\n"), "invalid YAML"),
    (_config(ALIAS_BOMB), "alias bomb"),
    (_config("a: " + "[" * 5000 + "]" * 5000 + "\n"), "nested"),
    (_config("[" * 100_000 + "]" * 100_000, name="c.json"), "nested too deeply"),
    (_config('{"rounds": 5,', name="c.json"), "invalid JSON"),
    (_config('{"rounds": ' + "9" * 5000 + "}", name="c.json"), "cannot read JSON|rounds"),
    (lambda f: ["run", "--config", str(f)], "is a directory"),
    (lambda f: ["run", "--config", str(f / "missing.yaml")], "does not exist"),
    (_config("rule: sfg-l:gamma=0.3,gamma=0.5\n"), "'gamma' twice"),
])

# ------------------------------------------------------------------------------ grids
def _grid(text: str | bytes, *extra: str):
    return lambda f: ["grid", "run", str(write(f, "g.yaml", text)), "--store", "{out}/s.sqlite",
                      "--dry-run", *extra]


GRID_BASE = "base: {kind: replay, rounds: 20, horizon: 10, n_clients: 8, graph: 'ring:k=1'}\n"
GRID_CASES = cases_for("grid", [
    (_grid(ALIAS_BOMB), "alias bomb", {"limit_gib": 1.5}),
    (_grid("a: " + "[" * 5000 + "]" * 5000 + "\n"), "nested"),
    (_grid("rules: " + "[" * 200 + "]" * 200 + "\n"), "nested more than 100 levels"),
    (_grid(GRID_BASE + "rules: [" + ",".join(f"'sfg-l:gamma={i / 1e4}'" for i in range(100))
           + "]\nseeds: [" + ",".join(map(str, range(100))) + "]\nprocesses: ["
           + ",".join(f"'iid:u={i / 1e3}'" for i in range(100)) + "]\n"),
     "expands to 1,000,000 runs.*SFG_MAX_RUNS", {"limit_gib": 1.5}),
    (_grid(b"rules: [sfg]\n\xff"), "not UTF-8 text"),
    (_grid(""), "empty"),
    (_grid("- 1\n"), "must be a mapping"),
    (_grid("rulez: [sfg]\n"), "unknown grid key 'rulez'"),
    (_grid("rules: [sfg]\nrules: [dfedavg]\n"), "appears twice"),
    (_grid("rules: sfg\n"), "must be a non-empty list"),
    (_grid("rules: []\n"), "must be a non-empty list"),
    (_grid(GRID_BASE + "rules: [sfg, sfg]\n"), "twice"),
    (_grid(GRID_BASE + "rules: ['sfg-l:gamma=0.3,gamma=0.5']\n"), "'gamma' twice"),
    (_grid(GRID_BASE + "rules: [nope]\n"), "unknown .*rule"),
    (_grid(GRID_BASE + "seeds: [1, x]\n"), "seeds must be integers"),
    (_grid(GRID_BASE + "seeds: [-1]\n"), "negative"),
    (_grid("base: {rounds: abc}\n"), "rounds"),
    (_grid("base: {roundz: 5}\n"), "unknown run setting 'roundz'"),
    (_grid("base: [1]\n"), "must be a mapping"),
    (_grid("overrides: [5]\n"), "must be a mapping"),
    (_grid(GRID_BASE + "overrides: [{}, {}]\n"), "same run twice"),
    (_grid("base: {rounds: 99999999999999999999999}\n"), "rounds x 100 clients.*over the limit"),
    (_grid(GRID_BASE + "seeds: [99999999999999999999999]\n"), "seed .* out of range"),
    (_grid("base: {n_clients: 9000000000000}\n"), "9e\\+12 clients.*over the limit"),
    (lambda f: ["grid", "run", str(f), "--store", "{out}/s.sqlite", "--dry-run"],
     "is a directory"),
    (lambda f: ["grid", "run", str(f / "nope.yaml"), "--store", "{out}/s.sqlite"],
     "does not exist"),
    (_grid(GRID_BASE + "rules: [sfg]\n", "--executor", "slurm"), "unknown executor", {}),
])
GRID_CASES[-1].build = (lambda b: lambda f: [a for a in b(f) if a != "--dry-run"])(
    GRID_CASES[-1].build)


# ------------------------------------------------------------------------------ stores
def _store_from(f: Path, name: str = "s.sqlite") -> Path:
    from sfg.experiments.config import make_config
    from sfg.experiments.store import Store

    p = f / name
    with Store(p) as s:
        s.add_runs([make_config(kind="selftest", seed=i, rounds=5, eval_every=5)
                    for i in range(300)])
    return p


def _damaged(f: Path) -> Path:
    p = _store_from(f)
    raw = bytearray(p.read_bytes())
    for off in range(2 * 4096, len(raw), 4096):
        raw[off + 8:off + 200] = bytes(range(192))
    p.write_bytes(bytes(raw))
    return p


def _other_app(f: Path) -> Path:
    p = f / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    return p


def _other_version(f: Path) -> Path:
    p = _store_from(f)
    con = sqlite3.connect(p)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    return p


STORE_MAKERS = [
    (lambda f: write(f, "s.sqlite", "this is not a database, just text" * 40), "not an SQLite"),
    (_damaged, "is damaged .*malformed"),
    (_other_app, "not an sfg results store"),
    (_other_version, "schema version 99"),
    (lambda f: f, "is a directory"),
    (lambda f: f / "missing.sqlite", "no results store|does not exist"),
]
STORE_CASES = []
for _i, (_make, _m) in enumerate(STORE_MAKERS):
    STORE_CASES.append(Case(f"store-status-{_i}", (lambda mk: lambda f: [
        "grid", "status", "--store", str(mk(f))])(_make), _m))
    STORE_CASES.append(Case(f"store-report-{_i}", (lambda mk: lambda f: [
        "report", "--store", str(mk(f)), "--out", "{out}/report"])(_make), _m))
    if _i < 4:  # running a grid into a store that is not one of ours
        STORE_CASES.append(Case(f"store-run-{_i}", (lambda mk: lambda f: [
            "grid", "run", str(write(f, "g.yaml", GRID_BASE + "rules: [sfg]\n")), "--store",
            str(mk(f))])(_make), _m))

STORE_CASES += [
    Case("store-parent-is-a-file", lambda f: [
        "grid", "run", str(write(f, "g.yaml", GRID_BASE + "rules: [sfg]\n")), "--store",
        str(write(f, "afile", "x") / "s.sqlite")], "cannot create the folder of results store"),
    Case("store-in-proc", lambda f: [
        "grid", "run", str(write(f, "g.yaml", GRID_BASE + "rules: [sfg]\n")), "--store",
        "/proc/sfg-store.sqlite"], "cannot open results store|cannot create"),
]

ALL = (COMPONENT_CASES + FLAG_CASES + FLASH_CASES + STUNNER_CASES + TABULAR_CASES
       + PROCESS_FILE_CASES + DATASET_CASES + CONFIG_CASES + GRID_CASES + STORE_CASES)


def test_the_suite_is_large_enough():
    assert len(ALL) >= 150, len(ALL)
    assert len({c.id for c in ALL}) == len(ALL)


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_bad_input(case: Case, tmp_path: Path):
    check_case(case, tmp_path)
    if case.id.startswith("data-"):
        assert not (tmp_path / "work" / "PWNED").exists()
