"""Devices and links in time (docs/concepts/clock.md#the-world-in-time): compute, uplink, latency, loss (sfg.world.devices)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from shared_data import FLASH, needs

from sfg.errors import SfgError
from sfg.util.rng import stream
from sfg.world.devices import (
    DEFAULTS,
    device_quantity,
    link_quantity,
    parse_world_component,
)
from sfg.world.outages import make_process

ROOT = Path(__file__).resolve().parents[1]
EDGES = np.array([[0, 1], [1, 2], [0, 3], [2, 3], [1, 3]])


# ------------------------------------------------------------------------ values
def test_defaults_are_the_round_based_world():
    assert DEFAULTS == {"compute": "const:value=0", "uplink": "const:value=inf",
                        "latency": "const:value=0", "loss": "const:value=0"}
    assert device_quantity("compute", DEFAULTS["compute"], 4, seed=0).tolist() == [0.0] * 4
    assert np.isinf(device_quantity("uplink", DEFAULTS["uplink"], 3, seed=0)).all()
    assert link_quantity("latency", DEFAULTS["latency"], EDGES, seed=0).tolist() == [0.0] * 10
    assert link_quantity("loss", DEFAULTS["loss"], EDGES, seed=0).tolist() == [0.0] * 10


def test_const_and_bare_numbers():
    assert device_quantity("compute", "const:value=2.5", 3, seed=1).tolist() == [2.5] * 3
    assert device_quantity("compute", "2", 2, seed=1).tolist() == [2.0, 2.0]
    assert device_quantity("compute", "0", 2, seed=1).tolist() == [0.0, 0.0]
    assert np.isinf(device_quantity("uplink", "inf", 2, seed=1)).all()
    assert device_quantity("uplink", "1e6", 1, seed=1).tolist() == [1e6]
    assert link_quantity("loss", "0.25", EDGES, seed=1).tolist() == [0.25] * 10
    assert link_quantity("loss", "const:value=1", EDGES, seed=1).tolist() == [1.0] * 10
    c = parse_world_component("latency", " 0.05 ")
    assert c.name == "const" and c.params == {"value": 0.05}


def test_lognormal_median_and_sigma_within_sampling_bounds():
    n, m, s = 20000, 0.3, 0.5
    x = device_quantity("compute", f"lognormal:median={m},sigma={s}", n, seed=11)
    assert x.shape == (n,) and (x > 0).all()
    # log x ~ Normal(log m, s): the sample median of n normals has sd sqrt(pi/2) s / sqrt(n)
    # (0.0044 here), the sample sd has sd s / sqrt(2n) (0.0025); five of each
    assert abs(np.log(np.median(x)) - np.log(m)) < 5 * np.sqrt(np.pi / 2) * s / np.sqrt(n)
    assert abs(np.log(x).std() - s) < 5 * s / np.sqrt(2 * n)
    # exactly median * exp(sigma * Z), Z from the stream named after the quantity
    z = stream(11, "compute").standard_normal(n)
    np.testing.assert_allclose(x, m * np.exp(s * z), rtol=1e-15)
    assert device_quantity("compute", "lognormal:median=0.3,sigma=0", 5, seed=3).tolist() \
        == [0.3] * 5


def test_determinism_and_independent_streams():
    spec = "lognormal:median=1,sigma=1"
    a = device_quantity("compute", spec, 50, seed=4)
    np.testing.assert_array_equal(a, device_quantity("compute", spec, 50, seed=4))
    assert not np.array_equal(a, device_quantity("compute", spec, 50, seed=5))
    # the uplink stream is not the compute stream, nor latency's loss's
    up = device_quantity("uplink", spec, 50, seed=4)
    assert not np.array_equal(a, up)
    np.testing.assert_allclose(up, np.exp(stream(4, "uplink").standard_normal(50)), rtol=1e-15)
    lat = link_quantity("latency", spec, EDGES, seed=4)
    assert lat.shape == (10,) and not np.array_equal(lat, a[:10])
    # drawing one quantity leaves the others unchanged (no shared state)
    device_quantity("uplink", "lognormal:median=5,sigma=2", 99, seed=4)
    np.testing.assert_array_equal(a, device_quantity("compute", spec, 50, seed=4))


def test_link_order_is_forward_then_reverse():
    lat = link_quantity("latency", "lognormal:median=0.1,sigma=0.3", EDGES, seed=2)
    z = stream(2, "latency").standard_normal(10)
    np.testing.assert_allclose(lat, 0.1 * np.exp(0.3 * z), rtol=1e-15)
    assert link_quantity("latency", "1", np.zeros((0, 2), np.int64), seed=0).shape == (0,)


# ------------------------------------------------------------------------ trace files
def _csv(tmp_path: Path, text: str, name: str = "caps.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_trace_by_node_index_and_column(tmp_path):
    p = _csv(tmp_path, "device,compute,Uplink\n2,0.5,1e6\n0,0.25,2e6\n1,1.0,3e6\n9,7,7\n")
    assert device_quantity("compute", f"trace:path={p}", 3, seed=0).tolist() == [0.25, 1.0, 0.5]
    assert device_quantity("uplink", f"trace:path={p}", 3, seed=0).tolist() == [2e6, 3e6, 1e6]
    assert device_quantity("compute", f"trace:path={p},column=uplink", 2,
                           seed=0).tolist() == [2e6, 3e6]


@needs(FLASH)
def test_trace_by_the_devices_drawn_onto_nodes(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    proc = make_process(f"flash:rule=relaxed,path={FLASH}")
    every = proc.trace.devices
    caps = {d: float(i + 1) for i, d in enumerate(every)}
    p = _csv(tmp_path, "device,compute\n" + "".join(f"{d},{v}\n" for d, v in caps.items()))
    ids = proc.device_ids(10, seed=3)
    got = device_quantity("compute", f"trace:path={p}", 10, seed=3, device_ids=ids)
    assert got.tolist() == [caps[d] for d in ids]
    # a device missing from the file: named, with the file
    short = _csv(tmp_path, "device,compute\n" + "".join(f"{d},1\n" for d in every[1:]),
                 "short.csv")
    ids_all = proc.device_ids(len(every), seed=3)
    with pytest.raises(SfgError) as e:
        device_quantity("compute", f"trace:path={short}", len(every), seed=3,
                        device_ids=ids_all)
    assert repr(every[0]) in str(e.value) and "short.csv" in str(e.value)
    assert "no row for 1 of the" in str(e.value)


@pytest.mark.parametrize("text, match", [
    ("device,compute\n0,1\n1,fast\n", "line 3: compute must be a number"),
    ("device,compute\n0,1\n1,-0.5\n", "line 3: compute must be a finite number >= 0"),
    ("device,compute\n0,inf\n1,1\n", "line 2: compute must be a finite"),
    ("device,compute\n0,nan\n1,1\n", "line 2: compute must be a finite"),
    ("device,compute\n0,\n1,1\n", "line 2: compute must be a number"),
    ("device,compute\n0,1\n0,2\n1,1\n", "line 3: device '0' appears twice \\(also line 2\\)"),
    ("device,speed\n0,1\n1,1\n", "no 'compute' column \\(columns: device, speed\\)"),
    ("name,compute\n0,1\n", "no 'device' column"),
    ("device,compute\n0,1,2\n", "line 2: 3 field\\(s\\), expected 2"),
    ("device,compute\n", "header but no data rows"),
    ("device,compute\n5,1\n7,1\n", "no row for 2 of the 2 devices \\('0', '1'\\)"),
])
def test_bad_compute_trace(tmp_path, text, match):
    p = _csv(tmp_path, text)
    with pytest.raises(SfgError, match=match) as e:
        device_quantity("compute", f"trace:path={p}", 2, seed=0)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_bad_trace_files(tmp_path, monkeypatch):
    p = _csv(tmp_path, "device,uplink\n0,0\n")
    with pytest.raises(SfgError, match="line 2: uplink must be a finite number > 0"):
        device_quantity("uplink", f"trace:path={p}", 1, seed=0)
    with pytest.raises(SfgError, match="does not exist"):
        device_quantity("compute", f"trace:path={tmp_path / 'nope.csv'}", 1, seed=0)
    with pytest.raises(SfgError, match="is a directory"):
        device_quantity("compute", f"trace:path={tmp_path}", 1, seed=0)
    empty = _csv(tmp_path, "", "empty.csv")
    with pytest.raises(SfgError, match="is empty"):
        device_quantity("compute", f"trace:path={empty}", 1, seed=0)
    ok = _csv(tmp_path, "device,compute\n0,1\n", "ok.csv")
    with pytest.raises(SfgError, match="2 device ids given for 1 devices"):
        device_quantity("compute", f"trace:path={ok}", 1, seed=0, device_ids=["0", "1"])
    # the file's size is bounded before it is read (8 KiB of CSV, 20 bytes per byte > 64 KiB)
    big = _csv(tmp_path, "device,compute\n" + "0,1\n" * 2000, "big.csv")
    monkeypatch.setenv("SFG_MAX_MEMORY", "64K")
    with pytest.raises(SfgError, match="over the limit of 64 KiB.*SFG_MAX_MEMORY"):
        device_quantity("compute", f"trace:path={big}", 1, seed=0)


# ------------------------------------------------------------------------ validation
@pytest.mark.parametrize("kind, spec, match", [
    ("compute", "lognormall:median=1,sigma=1", "unknown compute kind 'lognormall'; did you mean "
                                                "'lognormal'"),
    ("computee", "0", "unknown world quantity 'computee'; did you mean 'compute'"),
    ("compute", "lognormal:median=-1,sigma=1", "median must be a finite number >= 0"),
    ("latency", "lognormal:median=1,sigma=-0.1", "sigma \\(the log-sd\\) must be a finite "
                                                  "number >= 0"),
    ("loss", "const:value=1.5", "value must be a probability in \\[0, 1\\]"),
    ("loss", "-0.1", "out of range: loss \\(probability\\) must be a probability in \\[0, 1\\]"),
    ("loss", "lognormal:median=0.1,sigma=1", "probability in \\[0, 1\\]; give loss as const"),
    ("uplink", "0", "must be a number > 0"),
    ("uplink", "const:value=-5", "must be a number > 0"),
    ("uplink", "lognormal:median=0,sigma=1", "median must be a finite number > 0"),
    ("compute", "-1", "compute \\(seconds per local step\\) must be a finite number >= 0"),
    ("compute", "const:value=inf", "must be a finite number >= 0"),
    ("latency", "inf", "must be a finite number >= 0"),
    ("compute", "nan", "out of range"),
    ("latency", "trace:path=x.csv", "trace: is for per-device quantities \\(compute, uplink\\)"),
    ("loss", "trace:path=x.csv", "trace: is for per-device quantities"),
    ("compute", "const", "needs a value: write const:value=X"),
    ("compute", "const:value=fast", "value must be a number"),
    ("compute", "const:value=true", "value must be a number"),
    ("compute", "lognormal:median=1", "needs sigma="),
    ("compute", "lognormal:median=1,sigm=2", "unknown parameter 'sigm'.*did you mean 'sigma'"),
    ("compute", "const:value=1+fast", "takes no '\\+' modifiers"),
    ("compute", "trace:column=compute", "needs a file: write trace:path=FILE.csv"),
    ("compute", "", "empty compute component name"),
    ("latency", "gauss:mu=1", "unknown latency kind 'gauss'; choose one of: const, lognormal \\(e.g."),
])
def test_bad_components(kind, spec, match):
    with pytest.raises(SfgError, match=match) as e:
        parse_world_component(kind, spec)
    assert "\n" not in str(e.value)


def test_bad_calls():
    with pytest.raises(SfgError, match="sigma=800 is so large that draws overflow"):
        device_quantity("compute", "lognormal:median=1,sigma=800", 100, seed=0)
    with pytest.raises(SfgError, match="per-link quantity; use link_quantity"):
        device_quantity("latency", "0", 3, seed=0)
    with pytest.raises(SfgError, match="per-device quantity; use device_quantity"):
        link_quantity("compute", "0", EDGES, seed=0)
    with pytest.raises(SfgError, match="positive integer"):
        device_quantity("compute", "0", 0, seed=0)
    with pytest.raises(SfgError, match="int \\[M, 2\\] array"):
        link_quantity("latency", "0", np.array([0, 1, 2]), seed=0)
    with pytest.raises(SfgError, match="int \\[M, 2\\] array"):
        link_quantity("latency", "0", np.array([[0.5, 1.0]]), seed=0)
