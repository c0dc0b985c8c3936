"""Devices and links in time: compute, uplink, latency and loss (docs/concepts/clock.md#the-world-in-time).

docs/concepts/clock.md#the-world-in-time: "Compute: device i needs c_i seconds per local SGD step (component strings:
constant, log-normal with a median and σ, or a trace of per-device capacities); drawn per seed
from its own stream. Network: a message from j to i arrives after latency λ_ji plus size ÷ j's
uplink rate ... optionally also [lost] with probability p_loss (drawn per message). Latency,
uplink and loss are component strings like compute."

Quantities (the unit, the allowed range, the default):

===========  ===================================  ======================  ===================
quantity     what                                 range                   default
===========  ===================================  ======================  ===================
``compute``  seconds per local SGD step, per node finite, >= 0            ``const:value=0``
``uplink``   bytes per second, per node           > 0; ``inf`` allowed    ``const:value=inf``
                                                  (transfers take no
                                                  time)
``latency``  seconds, per directed link           finite, >= 0            ``const:value=0``
``loss``     probability that a message over the  [0, 1]                  ``const:value=0``
             directed link is lost
===========  ===================================  ======================  ===================

Component strings (parsed by :func:`sfg.util.components.parse_component`):

* ``const:value=X``, or the bare number ``X`` (``"2"``, ``"0"``, ``"inf"``): X everywhere;
* ``lognormal:median=M,sigma=S``: ``M · exp(S · Z)``, Z standard normal, so the median is M
  and the log-sd S (S >= 0; M > 0 for ``uplink``, M >= 0 otherwise); not for ``loss``,
  whose values must stay in [0, 1] (a log-normal is unbounded);
* ``trace:path=FILE.csv,column=NAME`` (``compute`` and ``uplink`` only: a per-device
  capacity): a CSV with a header row, a ``device`` column of device ids and numeric columns;
  ``column`` picks one (default: the quantity's name, ``compute`` or ``uplink``). Node k
  takes the value of its device: for a real-trace outage process the id of the device drawn
  onto it (``TraceProcess.device_ids(N, seed=...)``), otherwise ``"k"`` (``"0"``..``"N-1"``).
  Values must be finite numbers in the quantity's range; every node's device must be in the
  file; the file's size is bounded by ``SFG_MAX_MEMORY`` (:mod:`sfg.util.safety`).

Random quantities are drawn from their own keyed stream ``sfg.util.rng.stream(seed, NAME)``
with NAME the quantity's name (``"compute"``, ``"uplink"``, ``"latency"``, ``"loss"``), so
changing one never changes another (docs/concepts/clock.md#pairing-and-the-schedule-digest); values are in node order (per-node
quantities) or in directed-edge order (per-link ones, see :func:`link_quantity`).
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.util.components import Component, did_you_mean, parse_component, unknown_parameter
from sfg.util.rng import stream
from sfg.util.safety import check_cells, read_text, regular_file

__all__ = ["DEFAULTS", "KINDS", "device_quantity", "link_quantity", "parse_world_component"]

DEFAULTS: dict[str, str] = {"compute": "const:value=0", "uplink": "const:value=inf",
                            "latency": "const:value=0", "loss": "const:value=0"}
PER_DEVICE = ("compute", "uplink")
PER_LINK = ("latency", "loss")
KINDS = PER_DEVICE + PER_LINK
_FORMS = {"const": ("value",), "lognormal": ("median", "sigma"), "trace": ("path", "column")}
_UNIT = {"compute": "seconds per local step", "uplink": "bytes per second",
         "latency": "seconds", "loss": "probability"}
_RANGE = {"compute": "a finite number >= 0", "uplink": "a number > 0 (inf: instant transfers)",
          "latency": "a finite number >= 0", "loss": "a probability in [0, 1]"}


def _kind(kind: str) -> str:
    k = str(kind).strip().lower()
    if k not in KINDS:
        raise SfgError(f"unknown world quantity {kind!r}{did_you_mean(k, KINDS)}")
    return k


def _in_range(kind: str, x: float) -> bool:
    if math.isnan(x):
        return False
    if kind == "uplink":
        return x > 0
    if kind == "loss":
        return 0.0 <= x <= 1.0
    return 0.0 <= x < math.inf


def _number(kind: str, spec: str, key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SfgError(f"{kind} {spec!r}: {key} must be a number, got {v!r}")
    return float(v)


def parse_world_component(kind: str, spec: str) -> Component:
    """Validate the component string ``spec`` of quantity ``kind`` (module docstring).

    Returns the parsed :class:`Component`, with a bare number read as ``const:value=X``.
    Unknown names and parameters get a did-you-mean; values outside the quantity's range are
    errors that say the range. A ``trace:`` file is only read when values are drawn.
    """
    kind = _kind(kind)
    text = str(spec).strip() if isinstance(spec, str) else spec
    if isinstance(text, str) and text:
        try:
            x = float(text)
        except ValueError:
            pass
        else:
            if not _in_range(kind, x):
                raise SfgError(f"{kind} {spec!r} is out of range: {kind} ({_UNIT[kind]}) must be "
                               f"{_RANGE[kind]}")
            return Component("const", {"value": x}, (), text)
    comp = parse_component(text, kind=f"{kind} component")
    if comp.modifiers:
        raise SfgError(f"{kind} {spec!r} takes no '+' modifiers; write e.g. "
                       f"{kind}={DEFAULTS[kind]!r}")
    forms = [f for f in _FORMS
             if (f != "trace" or kind in PER_DEVICE) and (f != "lognormal" or kind != "loss")]
    if comp.name == "trace" and kind in PER_LINK:
        raise SfgError(f"{kind} {spec!r}: trace: is for per-device quantities (compute, "
                       f"uplink); give {kind} as const:value=X"
                       + (" or lognormal:median=M,sigma=S" if kind == "latency" else ""))
    if comp.name == "lognormal" and kind == "loss":
        raise SfgError(f"loss {spec!r}: lognormal values are unbounded but a loss is a "
                       "probability in [0, 1]; give loss as const:value=P")
    if comp.name not in _FORMS:
        raise SfgError(f"unknown {kind} kind {comp.name!r}{did_you_mean(comp.name, forms)} "
                       f"(e.g. {kind}={DEFAULTS[kind]!r})")
    allowed = _FORMS[comp.name]
    for key in comp.params:
        if key not in allowed:
            raise SfgError(unknown_parameter(kind, comp.name, key, allowed))
    p = comp.params
    if comp.name == "const":
        if "value" not in p:
            raise SfgError(f"{kind} {spec!r} needs a value: write const:value=X with X "
                           f"{_RANGE[kind]}")
        v = _number(kind, spec, "value", p["value"])
        if not _in_range(kind, v):
            raise SfgError(f"{kind} {spec!r}: value must be {_RANGE[kind]} ({_UNIT[kind]}), "
                           f"got {p['value']!r}")
    elif comp.name == "lognormal":
        for key in ("median", "sigma"):
            if key not in p:
                raise SfgError(f"{kind} {spec!r} needs {key}=: write "
                               "lognormal:median=M,sigma=S")
        m = _number(kind, spec, "median", p["median"])
        s = _number(kind, spec, "sigma", p["sigma"])
        if kind == "uplink" and not 0 < m < math.inf:
            raise SfgError(f"uplink {spec!r}: median must be a finite number > 0 bytes per "
                           f"second, got {p['median']!r}")
        if not 0 <= m < math.inf:
            raise SfgError(f"{kind} {spec!r}: median must be a finite number >= 0 "
                           f"({_UNIT[kind]}), got {p['median']!r}")
        if not 0 <= s < math.inf:
            raise SfgError(f"{kind} {spec!r}: sigma (the log-sd) must be a finite number >= 0, "
                           f"got {p['sigma']!r}")
    else:
        if "path" not in p or not str(p["path"]).strip():
            raise SfgError(f"{kind} {spec!r} needs a file: write trace:path=FILE.csv"
                           f"[,column={kind}]")
        if "column" in p and not str(p["column"]).strip():
            raise SfgError(f"{kind} {spec!r}: column= is empty; name a column of the file")
    return comp


# --------------------------------------------------------------------------------- drawing
def _positive_count(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise SfgError(f"{what} must be a positive integer, got {n!r}")
    return int(n)


def _draw(kind: str, comp: Component, size: int, seed: int) -> np.ndarray:
    p = comp.params
    if comp.name == "const":
        return np.full(size, float(p["value"]))
    m, s = float(p["median"]), float(p["sigma"])
    z = stream(seed, kind).standard_normal(size)
    with np.errstate(over="ignore", under="ignore"):
        out = m * np.exp(s * z)
    bad = ~np.isfinite(out) | ((out <= 0) if kind == "uplink" else np.zeros(size, bool))
    if bad.any():
        raise SfgError(f"{kind} {comp.text!r}: sigma={s:g} is so large that draws overflow "
                       f"to {out[bad][0]:g}; use a smaller sigma")
    return out


def device_quantity(kind: str, spec: str, n: int, *, seed: int,
                    device_ids: list[str] | None = None) -> np.ndarray:
    """float64[n]: per-node ``compute`` (seconds per local step) or ``uplink`` (bytes/s).

    ``device_ids``: the device id of each node, for ``trace:`` files (default ``"0"``..
    ``"n-1"``); ignored by ``const`` and ``lognormal``, which draw in node order from the
    stream named ``kind`` (docs/concepts/clock.md#the-world-in-time).
    """
    kind = _kind(kind)
    if kind not in PER_DEVICE:
        raise SfgError(f"{kind} is a per-link quantity; use link_quantity for it")
    n = _positive_count(n, "n (number of devices)")
    comp = parse_world_component(kind, spec)
    if comp.name != "trace":
        return _draw(kind, comp, n, seed)
    ids = [str(i) for i in range(n)] if device_ids is None else [str(x) for x in device_ids]
    if len(ids) != n:
        raise SfgError(f"{kind}: {len(ids)} device ids given for {n} devices")
    column = str(comp.params.get("column", kind)).strip()
    return _from_file(kind, str(comp.params["path"]).strip(), column, ids)


def _from_file(kind: str, path: str, column: str, ids: list[str]) -> np.ndarray:
    what = f"{kind} trace"
    p = regular_file(path, what, f"; write {kind}=trace:path=FILE.csv with a device column")
    # csv rows as Python strings and lists: ~20 bytes of memory per byte of file
    text = read_text(p, what, bytes_per_byte=20)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise SfgError(f"{what} {p} is empty; expected a header row such as "
                       f"'device,{column}'") from None
    except csv.Error as e:
        raise SfgError(f"{what} {p}, line 1: malformed CSV ({e})") from None
    names = [h.strip().lower() for h in header]
    for need in ("device", column.lower()):
        if need not in names:
            shown = ", ".join(x[:40] for x in names[:8]) + (", ..." if len(names) > 8 else "")
            raise SfgError(f"{what} {p} has no {need!r} column (columns: {shown or 'none'}); "
                           f"expected a header 'device,{column}'"
                           + (" or pass column=NAME" if need != "device" else ""))
    di, vi = names.index("device"), names.index(column.lower())
    devs: list[str] = []
    raw: list[str] = []
    lines: list[int] = []
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(names):
                raise SfgError(f"{what} {p}, line {reader.line_num}: {len(row)} field(s), "
                               f"expected {len(names)} ({','.join(names)})")
            devs.append(row[di].strip())
            raw.append(row[vi].strip())
            lines.append(reader.line_num)
    except csv.Error as e:
        raise SfgError(f"{what} {p}, line {reader.line_num}: malformed CSV ({e})") from None
    if not devs:
        raise SfgError(f"{what} {p} has a header but no data rows")
    check_cells(len(devs), 1, 16, f"{what} {p}", rows_name="rows", cols_name="column")
    try:
        vals = np.asarray(raw, dtype=str).astype(np.float64)
    except ValueError:
        for i, v in enumerate(raw):
            try:
                float(v)
            except ValueError:
                raise SfgError(f"{what} {p}, line {lines[i]}: {column} must be a number "
                               f"({_UNIT[kind]}), got {v[:40]!r}") from None
        raise  # pragma: no cover - numpy rejected the column but no single value
    ok = np.isfinite(vals) & ((vals > 0) if kind == "uplink" else (vals >= 0))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        rng = "a finite number > 0" if kind == "uplink" else "a finite number >= 0"
        raise SfgError(f"{what} {p}, line {lines[i]}: {column} must be {rng} "
                       f"({_UNIT[kind]}), got {raw[i][:40]!r}")
    where: dict[str, int] = {}
    for i, d in enumerate(devs):
        if d in where:
            raise SfgError(f"{what} {p}, line {lines[i]}: device {d[:60]!r} appears twice "
                           f"(also line {lines[where[d]]}); give one row per device")
        where[d] = i
    missing = [d for d in ids if d not in where]
    if missing:
        shown = ", ".join(repr(d[:40]) for d in missing[:5]) + (", ..." if len(missing) > 5
                                                                 else "")
        raise SfgError(f"{what} {p} has no row for {len(missing)} of the {len(ids)} devices "
                       f"({shown}); add them to the file")
    return vals[np.fromiter((where[d] for d in ids), np.int64, len(ids))]


def link_quantity(kind: str, spec: str, edges: np.ndarray, *, seed: int) -> np.ndarray:
    """float64[2M]: ``latency`` (seconds) or ``loss`` (probability) per directed edge.

    The order is ``edges[:, 0] -> edges[:, 1]`` for all M edges, then ``edges[:, 1] ->
    edges[:, 0]``; ``lognormal`` draws in that order from the stream named ``kind``.
    """
    kind = _kind(kind)
    if kind not in PER_LINK:
        raise SfgError(f"{kind} is a per-device quantity; use device_quantity for it")
    e = np.asarray(edges)
    if e.size == 0:
        e = e.reshape(0, 2)
    if e.ndim != 2 or e.shape[1] != 2 or (e.size and e.dtype.kind not in "iu"):
        raise SfgError(f"{kind}: edges must be an int [M, 2] array of node pairs, got "
                       f"{e.dtype} of shape {e.shape}")
    comp = parse_world_component(kind, spec)
    return _draw(kind, comp, 2 * e.shape[0], seed)
