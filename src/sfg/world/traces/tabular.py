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
from sfg.util.safety import check_cells, check_memory, decode_text, human_bytes, regular_file
from sfg.world.traces.base import Trace, eligible_mask, existing_file, fraction, positive_int

_TRUE = {"1", "true", "t", "yes", "y", "on", "1.0"}
_FALSE = {"0", "false", "f", "no", "n", "off", "0.0"}
_FORMS = ("rounds", "intervals")
_FIX_ROUNDS = "check the round/time columns, or pass rounds= or a longer round_minutes"
#: a file's columns by lower-cased name: lists of strings, or bytes arrays from the plain reader
Columns = dict[str, Any]
_KIND = {"number": "numbers of minutes", "naive": "ISO timestamps without a time-zone offset",
         "aware": "ISO timestamps with a time-zone offset"}


# ----------------------------------------------------------------------------- reading

def _read_columns(path: Path) -> tuple[Columns, Any, str]:
    """Columns (lower-cased names) and the file line of each row.

    A plain file (ASCII, no quoted fields) is split with numpy: each column a fixed-width bytes
    array, stripped like ``str.strip`` (columns the loaders do not read are ``None``); any other
    file goes through :mod:`csv`, each column a list of strings. Either way the same rows, the
    same values and the same one-line errors.
    """
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path)
    p = regular_file(path, "trace file")
    size = p.stat().st_size
    # the plain path: the bytes, their line and comma offsets and one padded copy of the cells
    check_memory(size * 6.0, f"reading trace file {p} ({human_bytes(size)})",
                 fix="split the file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise SfgError(f"cannot read trace file {p}: {e.strerror or e}") from None
    fast = _plain_columns(p, data)
    if fast is not None:
        return fast
    # ~20 bytes of Python strings and lists per byte of CSV
    check_memory(size * 20.0, f"reading trace file {p} ({human_bytes(size)})",
                 fix="split the file")
    text = decode_text(data, str(p), what="trace file")
    del data
    with io.StringIO(text, newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise SfgError(f"trace file {path} is empty; expected a CSV header row") from None
        except csv.Error as e:
            raise SfgError(f"trace file {path}, line 1: malformed CSV ({e})") from None
        names = [h.strip().lower() for h in header]
        cols: Columns = {n: [] for n in names}
        lines: list[int] = []
        try:
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(names):
                    raise _fields(path, reader.line_num, len(row), names)
                for n, v in zip(names, row, strict=True):
                    cols[n].append(v.strip())
                lines.append(reader.line_num)
        except csv.Error as e:
            raise SfgError(f"trace file {path}, line {reader.line_num}: malformed CSV ({e})") from None
    return cols, lines, "line"


def _fields(path: Path, line: int, got: int, names: list[str]) -> SfgError:
    return SfgError(f"trace file {path}, line {line}: {got} field(s), expected {len(names)} "
                    f"({','.join(names)})")


# the bytes str.strip() removes from an ASCII string
_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")] = True
_READ = ("device", "start", "end", "available", "round")
_BLOCK_CELLS = 1 << 24  # device-rounds cut at a time (16 MB of int8 steps)


def _plain_columns(path: Path, data: bytes) -> tuple[Columns, np.ndarray, str] | None:
    """The columns of a plain CSV file split with numpy, or None for any other file.

    Plain: ASCII, no quote character, no NUL, lines ending in ``\\n`` or ``\\r\\n``, a header on
    the first line with distinct names. For such a file :mod:`csv` splits every line at its
    commas and nothing else, which is what this does, in arrays: a line with only blanks and
    commas is skipped, one with another number of fields is the same error on the same line.
    """
    if not data or not data.isascii() or b'"' in data or b"\x00" in data:
        return None
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
        if b"\r" in data:
            return None
    nl = data.find(b"\n")
    head = data if nl < 0 else data[:nl]
    if not head:
        return None
    names = [h.strip().lower() for h in head.decode("ascii").split(",")]
    if len(set(names)) != len(names):
        return None
    ncol = len(names)
    body = np.frombuffer(data, dtype=np.uint8)[len(head) + 1:]
    size = len(body)
    ends = np.flatnonzero(body == 10)
    if size and body[-1] != 10:
        ends = np.append(ends, size)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    line_no = np.arange(2, len(ends) + 2, dtype=np.int64)
    comma = np.flatnonzero(body == 44)
    c0 = np.searchsorted(comma, starts)
    count = np.searchsorted(comma, ends) - c0
    odd = np.flatnonzero(count != ncol - 1)
    for i in odd.tolist():  # blank lines, or the first line with another number of fields
        row = body[starts[i]:ends[i]].tobytes().decode("ascii").split(",")
        if any(c.strip() for c in row):
            raise _fields(path, int(line_no[i]), len(row), names)
    if len(odd):
        good = np.flatnonzero(count == ncol - 1)
        starts, ends, c0, line_no = starts[good], ends[good], c0[good], line_no[good]
    del count
    blank = np.ones(len(starts), dtype=bool)
    cols: Columns = {}
    for j, name in enumerate(names):
        fs = starts.copy() if j == 0 else comma[c0 + (j - 1)] + 1
        fe = ends.copy() if j == ncol - 1 else comma[c0 + j]
        fs, fe = _strip(body, fs, fe)
        blank &= fe == fs
        if name not in _READ:
            cols[name] = None
            continue
        width = int((fe - fs).max()) if len(fs) else 1
        if width > 64 and len(fs) * width > 4 * size + 2 ** 20:
            return None  # a few very long cells: the csv module's lists are smaller
        cols[name] = _cells(body, fs, fe, max(width, 1))
    if blank.any():  # lines of blanks and commas only
        keep = np.flatnonzero(~blank)
        cols = {n: None if c is None else c[keep] for n, c in cols.items()}
        line_no = line_no[keep]
    return cols, line_no, "line"


def _strip(body: np.ndarray, fs: np.ndarray, fe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[fs, fe) of each cell without the leading and trailing blanks (``str.strip``)."""
    last = max(len(body) - 1, 0)
    while True:
        lead = np.flatnonzero(fs < fe)
        lead = lead[_SPACE[body[np.minimum(fs[lead], last)]]]
        if not len(lead):
            break
        fs[lead] += 1
    while True:
        trail = np.flatnonzero(fs < fe)
        trail = trail[_SPACE[body[np.maximum(fe[trail] - 1, 0)]]]
        if not len(trail):
            break
        fe[trail] -= 1
    return fs, fe


def _cells(body: np.ndarray, fs: np.ndarray, fe: np.ndarray, width: int) -> np.ndarray:
    """The cells [fs, fe) of ``body`` as one ``S{width}`` array (shorter ones NUL-padded)."""
    n = fe - fs
    out = np.zeros((len(fs), width), dtype=np.uint8)
    if len(fs) and bool((n == width).all()):
        for k in range(width):
            out[:, k] = body[fs + k]
    else:
        for k in range(width):
            sel = np.flatnonzero(n > k)
            out[sel, k] = body[fs[sel] + k]
    return out.view(f"S{width}").reshape(-1)


def _str(v: Any) -> str:
    """A cell as text (the plain reader's cells are bytes)."""
    return v.decode("ascii") if isinstance(v, (bytes, np.bytes_)) else str(v)


def _array(values: Any) -> np.ndarray:
    """A column as a numpy array of text (bytes cells stay bytes)."""
    return values if isinstance(values, np.ndarray) else np.asarray(values, dtype=str)


def _read_parquet(path: Path) -> tuple[Columns, list[int], str]:
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
    cols: Columns = {str(k).strip().lower(): ["" if v is None else _cell(v) for v in vals]
            for k, vals in data.items()}
    n = table.num_rows
    return cols, list(range(1, n + 1)), "row"


def _cell(v: Any) -> str:
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _bools(path: Path, values: Any, lines: Any, where: str) -> np.ndarray:
    low = np.char.lower(_array(values))
    enc = (lambda w: [x.encode("ascii") for x in w]) if low.dtype.kind == "S" else list
    t = np.isin(low, enc(_TRUE))
    f = np.isin(low, enc(_FALSE))
    bad = ~(t | f)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SfgError(f"trace file {path}, {where} {lines[i]}: 'available' must be 1/0, "
                       f"true/false or yes/no, got {_str(values[i])!r}")
    return t


def _minutes(path: Path, values: Any, lines: Any, where: str,
             column: str) -> tuple[np.ndarray, str]:
    """float64 minutes from numbers (as is) or ISO timestamps (minutes since 1970).

    Returns the minutes and their kind: ``number``, ``naive`` (local ISO) or ``aware`` (ISO
    with an offset, converted to UTC).
    """
    if len(values) == 0:
        return np.zeros(0), "number"
    arr = _array(values)
    try:
        return arr.astype(np.float64), "number"
    except ValueError:
        pass
    if arr.dtype.kind == "S":
        fast = _iso_minutes(arr)
        if fast is not None:
            return fast, "naive"
    out = np.empty(len(values))
    aware = None
    for i, v in enumerate(map(_str, values)):
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


def _iso_minutes(arr: np.ndarray) -> np.ndarray | None:
    """Minutes since 1970 of bytes cells that all read ``YYYY-MM-DD``, ``YYYY-MM-DDTHH:MM`` or
    ``YYYY-MM-DDTHH:MM:SS`` (``T`` or a space) with valid fields, exactly as
    :meth:`datetime.datetime.fromisoformat` reads them; None when any cell is another form."""
    if arr.dtype.itemsize > 19:  # the longest cell (cells hold no NUL)
        return None
    out = np.empty(len(arr))
    step = 1 << 18
    for lo in range(0, len(arr), step):
        part = _iso_block(arr[lo:lo + step])
        if part is None:
            return None
        out[lo:lo + step] = part
    return out


def _iso_block(arr: np.ndarray) -> np.ndarray | None:
    """:func:`_iso_minutes` of one block of cells."""
    width = arr.dtype.itemsize
    c = np.zeros((len(arr), 19), dtype=np.uint8)
    c[:, :width] = arr.view(np.uint8).reshape(len(arr), width)
    n = np.count_nonzero(c, axis=1)
    digit = (c >= 48) & (c <= 57)
    ok = np.isin(n, (10, 16, 19))
    for k in (0, 1, 2, 3, 5, 6, 8, 9):
        ok &= digit[:, k]
    ok &= (c[:, 4] == 45) & (c[:, 7] == 45)
    longer = n > 10
    ok &= ~longer | (((c[:, 10] == 84) | (c[:, 10] == 32)) & digit[:, 11] & digit[:, 12]
                     & (c[:, 13] == 58) & digit[:, 14] & digit[:, 15])
    longest = n > 16
    ok &= ~longest | ((c[:, 16] == 58) & digit[:, 17] & digit[:, 18])
    if not ok.all():
        return None

    def num(a: int, b: int) -> np.ndarray:
        out = np.zeros(len(arr), dtype=np.int64)
        for k in range(a, b):
            out = out * 10 + c[:, k].astype(np.int64) - 48
        return out

    year, month, day = num(0, 4), num(5, 7), num(8, 10)
    hour = np.where(longer, num(11, 13), 0)
    minute = np.where(longer, num(14, 16), 0)
    second = np.where(longest, num(17, 19), 0)
    if not (bool(((year >= 1) & (month >= 1) & (month <= 12) & (day >= 1)).all())
            and bool(((hour <= 23) & (minute <= 59) & (second <= 59)).all())):
        return None
    months = (year - 1970) * 12 + (month - 1)
    first = months.astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)
    after = (months + 1).astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)
    if not bool((day <= after - first).all()):
        return None
    seconds = (first + day - 1) * 86400 + hour * 3600 + minute * 60 + second
    return seconds.astype(np.float64) / 60.0


def _need(path: Path, cols: Columns, names: tuple[str, ...]) -> None:
    for n in names:
        if n not in cols:
            shown = ", ".join(c[:40] for c in list(cols)[:8]) + (", ..." if len(cols) > 8 else "")
            raise SfgError(
                f"trace file {path} has no {n!r} column (columns: {shown or 'none'}); "
                "expected device,start,end[,available] or device,round,available"
            )


def _devices(values: Any) -> tuple[list[str], np.ndarray]:
    """Device ids in order of first appearance and the index of each row."""
    arr = _array(values)
    uniq, first, inv = np.unique(arr, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return [_str(u) for u in uniq[order]], rank[inv]


def _from_rounds(path: Path, cols: Columns, lines: Any, where: str,
                 rounds: int | None,
                 round_minutes: float) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    devices, dev = _devices(cols["device"])
    try:
        r = _array(cols["round"]).astype(np.float64)
    except ValueError:
        for i, v in enumerate(map(_str, cols["round"])):
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
                       f"integer, got {_str(cols['round'][i])!r}")
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


def _interval_rows(path: Path, cols: Columns, lines: Any, where: str,
                   rounds: int | None, round_minutes: float, origin: Any
                   ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, int, float, float,
                              bool]:
    """(devices, dev, start, end, T, L, origin, iso): the online periods, validated, sorted by
    device and start, in minutes after the origin, clipped to the T rounds (empty ones left
    out). Empties ``cols``."""
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
        raise SfgError(f"trace file {path}, {where} {lines[i]}: end ({_str(cols['end'][i])}) "
                       f"must be after start ({_str(cols['start'][i])})")
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
        # the availability matrix (bool) and a block of it being cut: 2 bytes per cell
        check_cells(span + 1, max(len(devices), 1), 2,
                    f"trace file {path}: the intervals ({L:g}-minute rounds)", fix=_FIX_ROUNDS)
        T = int(span)
    else:
        check_cells(rounds + 1, max(len(devices), 1), 2, f"trace file {path}", fix=_FIX_ROUNDS)
        T = rounds
    T = max(T, 0)
    s0c, e0c = np.clip(s0, 0, T * L), np.clip(e0, 0, T * L)
    keep = e0c > s0c
    cols.clear()  # every cell is read: free them before the rounds are cut
    return devices, d0[keep], s0c[keep], e0c[keep], T, L, o, iso_s


def _from_intervals(path: Path, cols: Columns, lines: Any, where: str,
                    rounds: int | None, round_minutes: float, origin: Any
                    ) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    devices, d0, s0c, e0c, T, L, o, iso_s = _interval_rows(path, cols, lines, where, rounds,
                                                           round_minutes, origin)
    avail = _cut_rounds(len(devices), d0, s0c, e0c, T, L)
    if iso_s:
        start = [str(np.datetime64(int(round(o)), "m"))] * len(devices)
    else:
        start = [f"minute {o:g}"] * len(devices)
    day_off = np.full(len(devices), o % 1440.0)
    return avail, devices, start, day_off


def _cut_rounds(D: int, dev: np.ndarray, s: np.ndarray, e: np.ndarray, T: int,
                L: float) -> np.ndarray:
    """bool[T, D]: round r of device d is available when the online periods ``[s, e)`` of d
    (minutes, sorted by device and start, not overlapping) cover at least half of it.

    A round a period covers whole is available; the others are decided by the periods' exact
    overlaps with them (minus 1e-9 minutes), summed per device-round in the periods' order --
    the sums a dense device x round matrix of coverage would hold, without that matrix (8 bytes
    a device-round) or one entry per covered device-round.
    """
    # a round no period touches: coverage 0 (available only for rounds under 1e-9 minutes)
    avail = np.full((T, D), bool(0.0 >= L - 1e-9))
    block = max(1, _BLOCK_CELLS // (T + 1))
    for lo in range(0, D, block):
        hi = min(D, lo + block)
        a, b = np.searchsorted(dev, [lo, hi])
        avail[:, lo:hi] |= _cut_block(hi - lo, dev[a:b] - lo, s[a:b], e[a:b], T, L).T
    return avail


def _cut_block(D: int, dev: np.ndarray, s: np.ndarray, e: np.ndarray, T: int,
               L: float) -> np.ndarray:
    """bool[D, T] of :func:`_cut_rounds` for the periods of D devices."""
    r0 = np.floor(s / L).astype(np.int64)
    r1 = np.ceil(e / L).astype(np.int64)  # exclusive
    n = r1 - r0
    # rounds r0+1 .. r1-2 lie whole in their period
    inner = np.flatnonzero(n >= 3)
    step = np.zeros((D, T + 1), dtype=np.int8)
    np.add.at(step, (dev[inner], r0[inner] + 1), 1)
    np.add.at(step, (dev[inner], r1[inner] - 1), -1)
    out = np.cumsum(step, axis=1, dtype=np.int8)[:, :T] > 0
    del step
    # each period's first and last round: their exact overlaps, period by period
    first = np.flatnonzero(n >= 1)
    last = np.flatnonzero(n >= 2)
    idx = np.concatenate([first, last])
    rr = np.concatenate([r0[first], r1[last] - 1])
    order = np.argsort(idx, kind="stable")
    idx, rr = idx[order], rr[order]
    overlap = np.minimum(e[idx], (rr + 1) * L) - np.maximum(s[idx], rr * L)
    cells, inv = np.unique(dev[idx] * np.int64(T + 1) + rr, return_inverse=True)
    cover = np.zeros(len(cells))
    np.add.at(cover, inv, overlap)
    d, r = cells // (T + 1), cells % (T + 1)
    on = (2 * cover >= L - 1e-9) & (r < T)
    out[d[on], r[on]] = True
    return out


def _open(path: str | Path, round_minutes: float, rounds: int | None,
          min_availability: float = 0.0
          ) -> tuple[Path, float, int | None, float, Columns, Any, str]:
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
    if len(cols["device"]) == 0:
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
    n_rows = len(cols["device"])
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
        "rows": n_rows,
        "devices_total": len(devices),
        "devices_low_availability": int((~ok).sum()),
        "devices_eligible": int(len(keep)),
        "devices_never": int(never.sum()),
        "share_never": float(never.mean()) if len(devices) else 0.0,
    }
    kept = avail if len(keep) == avail.shape[1] else avail[:, keep]
    return Trace(available=kept, devices=[devices[i] for i in keep], round_minutes=L,
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
