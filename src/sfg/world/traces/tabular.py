"""Bring your own fleet's trace: a plain tabular format (docs/concepts/traces.md#real-availability-traces, "Any user trace").

A CSV file (or Parquet, when ``pyarrow`` is installed) with a header row, in one of two forms.
Column names are case-insensitive; extra columns are ignored.

**(a) Intervals** -- ``device,start,end[,available]``: each row is a period
``[start, end)`` of one device. ``start``/``end`` are either ISO timestamps
(``2024-03-01T08:00:00``, local time; a time-zone suffix is allowed when every row has one) or
plain numbers of minutes on the fleet's own clock (minute 0 is taken to be a local midnight).
Without ``available`` every row is an *online* period; with it, rows whose ``available`` is
false only declare the device (it is offline there anyway). Time not covered by an online
period is offline. Online periods of one device must not overlap.

* Rounds are ``round_minutes`` long (default 10) and start at ``origin``: by default minute 0
  for numeric times, or the local midnight at or before the earliest ``start`` for ISO times
  (pass ``origin=`` to override with a number or timestamp).
* The number of rounds is ``rounds`` if given, else enough to reach the latest ``end``.
* A round is available when the device is online for at least half of it (measured exactly,
  not per minute).

**(b) Device x round matrix, long form** -- ``device,round,available``: ``round`` is a
non-negative integer, ``available`` one of ``1/0``, ``true/false``, ``yes/no``. Rounds missing
for a device are offline; duplicated ``(device, round)`` rows are an error. The rounds are
already discrete, so ``round_minutes`` only labels their length (default 10) and round 0 is
taken to start at a local midnight.

Devices appear in order of first appearance; a device is kept when its availability is at
least ``min_availability`` (default 0: every device). Example (intervals)::

    device,start,end
    phone-1,2024-03-01T00:00,2024-03-01T07:30
    phone-1,2024-03-01T22:10,2024-03-02T06:00
    phone-2,2024-03-01T01:00,2024-03-01T05:00

:func:`save_tabular` writes any :class:`Trace` in either form, so FLASH/STUNner windows can
be exported, edited and loaded back.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.util.safety import check_cells, check_memory, read_text
from sfg.world.traces.base import Trace, eligible_mask, existing_file, fraction, positive_int

_TRUE = {"1", "true", "t", "yes", "y", "on", "1.0"}
_FALSE = {"0", "false", "f", "no", "n", "off", "0.0"}
_FORMS = ("rounds", "intervals")
_FIX_ROUNDS = "check the round/time columns, or pass rounds= or a longer round_minutes"
_KIND = {"number": "numbers of minutes", "naive": "ISO timestamps without a time-zone offset",
         "aware": "ISO timestamps with a time-zone offset"}


# ----------------------------------------------------------------------------- reading

def _read_columns(path: Path) -> tuple[dict[str, list[str]], list[int], str]:
    """Columns (lower-cased names) as lists of strings, plus the file line of each row."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path)
    # ~20 bytes of Python strings and lists per byte of CSV
    text = read_text(path, "trace file", bytes_per_byte=20)
    with io.StringIO(text, newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise SfgError(f"trace file {path} is empty; expected a CSV header row") from None
        except csv.Error as e:
            raise SfgError(f"trace file {path}, line 1: malformed CSV ({e})") from None
        names = [h.strip().lower() for h in header]
        cols: dict[str, list[str]] = {n: [] for n in names}
        lines: list[int] = []
        try:
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(names):
                    raise SfgError(
                        f"trace file {path}, line {reader.line_num}: {len(row)} field(s), "
                        f"expected {len(names)} ({','.join(names)})"
                    )
                for n, v in zip(names, row, strict=True):
                    cols[n].append(v.strip())
                lines.append(reader.line_num)
        except csv.Error as e:
            raise SfgError(f"trace file {path}, line {reader.line_num}: malformed CSV ({e})") from None
    return cols, lines, "line"


def _read_parquet(path: Path) -> tuple[dict[str, list[str]], list[int], str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SfgError(
            f"reading Parquet trace {path} needs the 'parquet' extra (pyarrow is not "
            "installed): pip install 'sfg[parquet]', or save the trace as CSV"
        ) from None
    try:
        meta = pq.ParquetFile(path).metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        # decoded columns become Python strings: ~60 bytes per cell
        check_memory(max(size, meta.num_rows * meta.num_columns * 60),
                     f"Parquet trace {path} holds {meta.num_rows:,} rows x "
                     f"{meta.num_columns} columns", fix="split the file")
        table = pq.read_table(path)
    except SfgError:
        raise
    except Exception as e:  # noqa: BLE001 - any pyarrow failure is a bad file
        raise SfgError(f"trace file {path}: cannot read Parquet "
                       f"({' '.join(str(e).split())[:200]})") from None
    data = table.to_pydict()
    cols = {str(k).strip().lower(): ["" if v is None else _cell(v) for v in vals]
            for k, vals in data.items()}
    n = table.num_rows
    return cols, list(range(1, n + 1)), "row"


def _cell(v: Any) -> str:
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _bools(path: Path, values: list[str], lines: list[int], where: str) -> np.ndarray:
    low = np.char.lower(np.asarray(values, dtype=str))
    t = np.isin(low, list(_TRUE))
    f = np.isin(low, list(_FALSE))
    bad = ~(t | f)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SfgError(f"trace file {path}, {where} {lines[i]}: 'available' must be 1/0, "
                       f"true/false or yes/no, got {values[i]!r}")
    return t


def _minutes(path: Path, values: list[str], lines: list[int], where: str,
             column: str) -> tuple[np.ndarray, str]:
    """float64 minutes from numbers (as is) or ISO timestamps (minutes since 1970).

    Returns the minutes and their kind: ``number``, ``naive`` (local ISO) or ``aware`` (ISO
    with an offset, converted to UTC).
    """
    if not values:
        return np.zeros(0), "number"
    try:
        return np.asarray(values, dtype=str).astype(np.float64), "number"
    except ValueError:
        pass
    out = np.empty(len(values))
    aware = None
    for i, v in enumerate(values):
        try:
            t = _dt.datetime.fromisoformat(v)
        except ValueError:
            raise SfgError(
                f"trace file {path}, {where} {lines[i]}: {column} must be a number of minutes or "
                f"an ISO timestamp like 2024-03-01T08:00, got {v!r}"
            ) from None
        if aware is None:
            aware = t.tzinfo is not None
        if aware != (t.tzinfo is not None):
            raise SfgError(f"trace file {path}, {where} {lines[i]}: mixes timestamps with and "
                           "without a time-zone offset; use one kind throughout")
        if aware:
            t = t.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        out[i] = (t - _dt.datetime(1970, 1, 1)).total_seconds() / 60.0
    return out, "aware" if aware else "naive"


def _need(path: Path, cols: dict[str, list[str]], names: tuple[str, ...]) -> None:
    for n in names:
        if n not in cols:
            shown = ", ".join(c[:40] for c in list(cols)[:8]) + (", ..." if len(cols) > 8 else "")
            raise SfgError(
                f"trace file {path} has no {n!r} column (columns: {shown or 'none'}); "
                "expected device,start,end[,available] or device,round,available"
            )


def _devices(values: list[str]) -> tuple[list[str], np.ndarray]:
    """Device ids in order of first appearance and the index of each row."""
    arr = np.asarray(values, dtype=str)
    uniq, first, inv = np.unique(arr, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return [str(u) for u in uniq[order]], rank[inv]


def _from_rounds(path: Path, cols: dict[str, list[str]], lines: list[int], where: str,
                 rounds: int | None,
                 round_minutes: float) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    devices, dev = _devices(cols["device"])
    try:
        r = np.asarray(cols["round"], dtype=str).astype(np.float64)
    except ValueError:
        for i, v in enumerate(cols["round"]):
            try:
                float(v)
            except ValueError:
                raise SfgError(f"trace file {path}, {where} {lines[i]}: round must be a "
                               f"non-negative integer, got {v!r}") from None
        raise  # pragma: no cover
    bad = (r < 0) | (r != np.floor(r)) | ~np.isfinite(r)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SfgError(f"trace file {path}, {where} {lines[i]}: round must be a non-negative "
                       f"integer, got {cols['round'][i]!r}")
    a = _bools(path, cols["available"], lines, where)
    T = int(r.max()) + 1 if rounds is None else rounds
    # the matrix, plus the sort below: computed from the figures before anything is allocated
    check_cells(T, len(devices), 1, f"trace file {path}", fix=_FIX_ROUNDS)
    r = np.minimum(r, T).astype(np.int64)  # rounds past T are dropped below
    order = np.lexsort((np.arange(len(r)), r, dev))
    same = (dev[order][1:] == dev[order][:-1]) & (r[order][1:] == r[order][:-1]) \
        & (r[order][1:] < T)
    if same.any():
        j = int(np.flatnonzero(same)[0])
        k0, k1 = int(order[j]), int(order[j + 1])
        raise SfgError(f"trace file {path}, {where} {lines[k1]}: device {devices[dev[k1]]!r} "
                       f"round {r[k1]} appears twice (also {where} {lines[k0]})")
    inside = r < T
    avail = np.zeros((T, len(devices)), dtype=bool)
    avail[r[inside], dev[inside]] = a[inside]
    start = [f"minute {0}"] * len(devices)
    return avail, devices, start, np.zeros(len(devices))


def _interval_rows(path: Path, cols: dict[str, list[str]], lines: list[int], where: str,
                   rounds: int | None, round_minutes: float, origin: Any
                   ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, int, float, float,
                              bool]:
    """(devices, dev, start, end, T, L, origin, iso): the online periods, validated, sorted by
    device and start, in minutes after the origin, clipped to the T rounds (empty ones left
    out)."""
    devices, dev = _devices(cols["device"])
    s, kind_s = _minutes(path, cols["start"], lines, where, "start")
    e, kind_e = _minutes(path, cols["end"], lines, where, "end")
    if kind_s != kind_e:
        raise SfgError(f"trace file {path}: start is {_KIND[kind_s]} but end is {_KIND[kind_e]}; "
                       "use one kind throughout")
    iso_s = kind_s != "number"
    bad = ~(e > s) | ~np.isfinite(s) | ~np.isfinite(e)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SfgError(f"trace file {path}, {where} {lines[i]}: end ({cols['end'][i]}) must be "
                       f"after start ({cols['start'][i]})")
    on = (_bools(path, cols["available"], lines, where) if "available" in cols
          else np.ones(len(s), dtype=bool))
    # origin of round 0
    if origin is None or origin == "":
        o = float(np.floor(s.min() / 1440.0) * 1440.0) if iso_s else 0.0
    elif isinstance(origin, (int, float)) and not isinstance(origin, bool):
        o = float(origin)
    else:
        o_arr, kind_o = _minutes(path, [str(origin)], [0], "origin", "origin")
        if kind_o != kind_s:
            raise SfgError(f"origin {origin!r} is {_KIND[kind_o]} but the times in {path} are "
                           f"{_KIND[kind_s]}; give the origin in the same kind")
        o = float(o_arr[0])
    L = float(round_minutes)
    # overlap check among online periods of each device
    idx = np.flatnonzero(on)
    order = idx[np.lexsort((s[idx], dev[idx]))]
    same = dev[order][1:] == dev[order][:-1]
    clash = same & (s[order][1:] < e[order][:-1])
    if clash.any():
        j = int(np.flatnonzero(clash)[0])
        a_, b_ = order[j], order[j + 1]
        raise SfgError(f"trace file {path}, {where} {lines[b_]}: online period of device "
                       f"{devices[dev[b_]]!r} overlaps the one on {where} {lines[a_]}")
    s0, e0 = s[order] - o, e[order] - o
    d0 = dev[order]
    span = float(np.ceil(max(float(e.max() - o), 0.0) / L - 1e-9))
    if rounds is None:
        # the coverage (float64) and availability (bool) matrices: 9 bytes per cell
        check_cells(span + 1, max(len(devices), 1), 9,
                    f"trace file {path}: the intervals ({L:g}-minute rounds)", fix=_FIX_ROUNDS)
        T = int(span)
    else:
        check_cells(rounds + 1, max(len(devices), 1), 9, f"trace file {path}", fix=_FIX_ROUNDS)
        T = rounds
    T = max(T, 0)
    s0c, e0c = np.clip(s0, 0, T * L), np.clip(e0, 0, T * L)
    keep = e0c > s0c
    return devices, d0[keep], s0c[keep], e0c[keep], T, L, o, iso_s


def _from_intervals(path: Path, cols: dict[str, list[str]], lines: list[int], where: str,
                    rounds: int | None, round_minutes: float, origin: Any
                    ) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    devices, d0, s0c, e0c, T, L, o, iso_s = _interval_rows(path, cols, lines, where, rounds,
                                                           round_minutes, origin)
    cover = np.zeros((len(devices), T + 1))
    r0 = np.floor(s0c / L).astype(np.int64)
    r1 = np.ceil(e0c / L).astype(np.int64)  # exclusive
    n = r1 - r0
    check_memory(float(n.sum()) * 40, f"trace file {path}: the intervals cover "
                 f"{float(n.sum()):.3g} device-rounds", fix=_FIX_ROUNDS)
    rep = np.repeat(np.arange(len(n)), n)
    rr = r0[rep] + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    overlap = np.minimum(e0c[rep], (rr + 1) * L) - np.maximum(s0c[rep], rr * L)
    np.add.at(cover, (d0[rep], rr), overlap)
    avail = (2 * cover[:, :T] >= L - 1e-9).T
    if iso_s:
        start = [str(np.datetime64(int(round(o)), "m"))] * len(devices)
    else:
        start = [f"minute {o:g}"] * len(devices)
    day_off = np.full(len(devices), o % 1440.0)
    return avail, devices, start, day_off


def _open(path: str | Path, round_minutes: float, rounds: int | None,
          min_availability: float = 0.0
          ) -> tuple[Path, float, int | None, float, dict[str, list[str]], list[int], str]:
    """The checked path, round length, rounds and min_availability, and the file's columns."""
    p = existing_file(path, "trace", " (a CSV/Parquet file: device,start,end or "
                                     "device,round,available)")
    try:
        L = float(round_minutes)
    except (TypeError, ValueError):
        raise SfgError(f"round_minutes must be a positive number, got {round_minutes!r}") from None
    if not 0 < L < float("inf"):
        raise SfgError(f"round_minutes must be a positive finite number, got {round_minutes!r}")
    if rounds is not None and rounds != 0:
        rounds = positive_int(rounds, "rounds")
    else:
        rounds = None
    min_av = fraction(min_availability, "min_availability")
    cols, lines, where = _read_columns(p)
    _need(p, cols, ("device",))
    if not cols["device"]:
        raise SfgError(f"trace file {p} has a header but no data rows")
    return p, L, rounds, min_av, cols, lines, where


def tabular_intervals(path: str | Path, *, round_minutes: float = 10, rounds: int | None = None,
                      origin: Any = None
                      ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, int] | None:
    """The online periods of an interval-form trace file at their own times (docs/concepts/traces.md#real-availability-traces, docs/concepts/clock.md#the-world-in-time).

    ``(devices, dev, start, end, T)``: every device of the file in order of first appearance
    (the order :func:`load_tabular` uses before dropping devices below ``min_availability``),
    and per online period its device index and ``[start, end)`` in minutes after round 0's
    start, clipped to the ``T`` rounds :func:`load_tabular` cuts with the same parameters
    (periods wholly outside are left out), sorted by device and start; periods that touch
    are not merged. ``None`` for a file in the per-round form (``device,round,available``),
    whose rounds are its native resolution.
    """
    p, L, rounds, _, cols, lines, where = _open(path, round_minutes, rounds)
    if "round" in cols:
        return None
    _need(p, cols, ("start", "end"))
    devices, dev, start, end, T, _, _, _ = _interval_rows(p, cols, lines, where, rounds, L,
                                                          origin)
    return devices, dev, start, end, T


def load_tabular(path: str | Path, *, round_minutes: float = 10, rounds: int | None = None,
                 origin: Any = None, min_availability: float = 0.0) -> Trace:
    """Load a user trace in the tabular format of this module's docstring (docs/concepts/traces.md#real-availability-traces)."""
    p, L, rounds, min_av, cols, lines, where = _open(path, round_minutes, rounds,
                                                     min_availability)
    if "round" in cols:
        _need(p, cols, ("available",))
        form = "rounds"
        avail, devices, start, day_off = _from_rounds(p, cols, lines, where, rounds, L)
    else:
        _need(p, cols, ("start", "end"))
        form = "intervals"
        avail, devices, start, day_off = _from_intervals(p, cols, lines, where, rounds, L,
                                                         origin)
    ok = eligible_mask(avail.T, min_av) if avail.shape[0] else np.ones(len(devices), bool)
    keep = np.flatnonzero(ok)
    never = ~avail.any(axis=0)
    meta = {
        "source": "tabular",
        "path": str(p),
        "form": form,
        "rounds": int(avail.shape[0]),
        "round_minutes": L,
        "min_availability": min_av,
        "rows": len(cols["device"]),
        "devices_total": len(devices),
        "devices_low_availability": int((~ok).sum()),
        "devices_eligible": int(len(keep)),
        "devices_never": int(never.sum()),
        "share_never": float(never.mean()) if len(devices) else 0.0,
    }
    return Trace(available=avail[:, keep], devices=[devices[i] for i in keep], round_minutes=L,
                 start=[start[i] for i in keep], day_offset_minutes=day_off[keep], meta=meta)


# ----------------------------------------------------------------------------- writing

def save_tabular(trace: Trace, path: str | Path, *, form: str = "rounds") -> Path:
    """Write ``trace`` as CSV (or Parquet for ``.parquet``) in ``form`` ``rounds``|``intervals``.

    ``rounds`` writes ``device,round,available`` for every device and round; ``intervals``
    writes each maximal run of available rounds as ``device,start,end,available=1`` in minutes
    since round 0 (a device never available gets one ``available=0`` row over the window), so
    that ``load_tabular(path, round_minutes=trace.round_minutes, rounds=trace.rounds)``
    gives back the same matrix.
    """
    if form not in _FORMS:
        raise SfgError(f"unknown tabular form {form!r}; choose one of: {', '.join(_FORMS)}")
    p = Path(path)
    a = trace.available
    T, D = a.shape
    if form == "rounds":
        dev = np.repeat(np.arange(D), T)
        rnd = np.tile(np.arange(T), D)
        val = a.T.reshape(-1).astype(np.int8)
        header = ["device", "round", "available"]
        rows_cols = [np.asarray(trace.devices, dtype=object)[dev], rnd, val]
    else:
        on = np.zeros((D, T + 2), np.int8)
        on[:, 1:-1] = a.T
        d = np.diff(on.reshape(-1))
        st = np.flatnonzero(d == 1) + 1
        en = np.flatnonzero(d == -1) + 1
        L = trace.round_minutes
        silent = np.flatnonzero(~a.any(axis=0))  # declared by one offline row over the window
        dev = np.concatenate([st // (T + 2), silent])
        start = np.concatenate([(st % (T + 2) - 1) * L, np.zeros(len(silent))])
        end = np.concatenate([(en % (T + 2) - 1) * L, np.full(len(silent), T * L)])
        val = np.concatenate([np.ones(len(st), np.int8), np.zeros(len(silent), np.int8)])
        order = np.argsort(dev, kind="stable")
        header = ["device", "start", "end", "available"]
        rows_cols = [np.asarray(trace.devices, dtype=object)[dev[order]], start[order],
                     end[order], val[order]]
    if p.suffix.lower() in (".parquet", ".pq"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise SfgError(f"writing Parquet trace {p} needs the 'parquet' extra (pyarrow is "
                           "not installed): pip install 'sfg[parquet]', or write CSV") from None
        pq.write_table(pa.table({h: list(c) for h, c in zip(header, rows_cols, strict=True)}), p)
        return p
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(zip(*(c.tolist() for c in rows_cols), strict=True))
    return p
