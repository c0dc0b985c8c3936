"""Fuzzing the parsers of hostile input (hypothesis, bounded examples).

The component-string parser and every trace reader get random bytes and structured mutations of
valid inputs; each must either return a result or raise :class:`SfgError` (one line), never any
other exception. The memory budget is lowered to 64 MiB so that a mutation asking for a huge
matrix is refused rather than allocated.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfg.errors import SfgError
from sfg.util.components import format_component, parse_component

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def small_budget(monkeypatch):
    monkeypatch.setenv("SFG_MAX_MEMORY", "64M")


def _one_line_or_value(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except SfgError as e:
        assert "\n" not in str(e) and str(e).strip()
        return None


# ------------------------------------------------------------------------------ components
_piece = st.sampled_from(["sfg", "sfg-l", "gamma", "=", ",", ":", "+", "ipw", "0.3", "L", "2",
                          " ", "", "nan", "-", "e9", "true", "[/x]", "é", "\t"])


@FUZZ
@given(st.one_of(st.text(max_size=40), st.lists(_piece, max_size=12).map("".join)))
def test_component_parser_never_crashes(text):
    comp = _one_line_or_value(parse_component, text, kind="rule")
    if comp is not None:
        # a parsed component has one value per key and formats back to itself
        again = parse_component(format_component(comp.name, comp.params, comp.modifiers))
        assert again.name == comp.name and again.modifiers == comp.modifiers
        assert set(again.params) == set(comp.params)


@FUZZ
@given(st.lists(_piece, max_size=12).map("".join))
def test_rule_and_process_registries_never_crash(text):
    from sfg.round.rules import parse_rule
    from sfg.world.outages import make_process

    _one_line_or_value(parse_rule, "sfg-l:" + text)
    _one_line_or_value(make_process, "bursty:" + text)


# ------------------------------------------------------------------------------ traces
GOOD_FLASH = json.dumps({
    f"d{k}": {"guid": "g", "model": "m", "messages": "\n".join(
        f"2021-03-0{d} {h:02d}:{k:02d}:00\t{ev}" for d in range(1, 5)
        for h, ev in ((1, "screen_off"), (2, "battery_charged_on"), (3, "wifi"),
                      (20, "screen_on")))} for k in range(3)})
GOOD_STUNNER = "\n".join(f"u{k} {k % 2} {1614556800000 + k * 1000} {k - 1} "
                         + " ".join(["3600000"] * 60) for k in range(3))
GOOD_CSV = "device,start,end\n" + "\n".join(f"p{k},{10 * k},{10 * k + 300}" for k in range(5))


def _mutate(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray(data)
    for pos, cut, insert in edits:
        pos %= len(out) + 1
        out[pos:pos + cut] = insert
    return bytes(out)


_edits = st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 8),
                            st.sampled_from([b"", b"9", b"99999999999999999999", b"-", b"\xff",
                                             b"[", b"{", b"\"", b",", b"\n", b"\t", b"e308",
                                             b"nan", b"0", b" ", b"2099-12-31 23:59:59"])),
                  min_size=1, max_size=4)


def _read(source: str, path, tmp_path):
    from sfg.world.traces.process import clear_cache, load_trace

    clear_cache()
    return _one_line_or_value(load_trace, source, path)


@FUZZ
@given(data=st.binary(max_size=300))
def test_trace_readers_on_random_bytes(tmp_path, data):
    for source, name in (("flash", "f.json"), ("stunner", "s.txt"), ("tabular", "t.csv")):
        p = tmp_path / name
        p.write_bytes(data)
        _read(source, p, tmp_path)


@FUZZ
@given(edits=_edits)
def test_flash_reader_on_mutations(tmp_path, edits):
    p = tmp_path / "f.json"
    p.write_bytes(_mutate(GOOD_FLASH.encode(), edits))
    _read("flash", p, tmp_path)


@FUZZ
@given(edits=_edits)
def test_stunner_reader_on_mutations(tmp_path, edits):
    p = tmp_path / "s.txt"
    p.write_bytes(_mutate(GOOD_STUNNER.encode(), edits))
    _read("stunner", p, tmp_path)


@FUZZ
@given(edits=_edits)
def test_tabular_reader_on_mutations(tmp_path, edits):
    p = tmp_path / "t.csv"
    p.write_bytes(_mutate(GOOD_CSV.encode(), edits))
    _read("tabular", p, tmp_path)


def test_the_seeds_read():
    """The unmutated inputs of the fuzzers are valid: the mutations start from real files."""
    import tempfile
    from pathlib import Path

    from sfg.world.traces.process import clear_cache, load_trace

    with tempfile.TemporaryDirectory() as d:
        for source, name, text, kw in (
                ("flash", "f.json", GOOD_FLASH, {"rounds": 30, "min_availability": 0}),
                ("stunner", "s.txt", GOOD_STUNNER, {"rounds": 30}),
                ("tabular", "t.csv", GOOD_CSV, {})):
            p = Path(d) / name
            p.write_text(text)
            clear_cache()
            trace = load_trace(source, p, **kw)
            assert trace.n_devices >= 1 and trace.rounds >= 1
