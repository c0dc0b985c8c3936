"""Input safety shared by every reader: size budgets, bounded parsing, clear decoding errors.

sfg reads other people's traces, archives, grids and stores, so every input is treated as
hostile. Each reader computes the size an input *implies* (rounds x devices, N x T, decoded
pixels, decompressed bytes, grid cells) **before** allocating or decompressing it, and compares
it with a budget; an input over budget is refused with the figure and the way to raise the
limit. Every failure here is an :class:`sfg.errors.SfgError` (one line, exit status 2).

Budgets (docs/reference/limits.md; each is an environment variable, read at every check):

=====================  =========  ===========================================================
variable               default    what it bounds
=====================  =========  ===========================================================
``SFG_MAX_MEMORY``     ``4G``     memory one input may imply (a trace matrix, decoded images,
                                  a decompressed archive, an availability sample, a graph)
``SFG_MAX_MEMBER``     ``1G``     the decompressed size of one archive member
``SFG_MAX_PIXELS``     ``32M``    the pixels of one image, read from its header before it is
                                  decoded (decode time: about 1 s per 32M pixels)
``SFG_MAX_RUNS``       ``20000``  runs one grid file may expand to (counted before expanding)
``SFG_MAX_YAML_NODES`` ``100000`` YAML/JSON nodes of a grid or config (aliases expanded)
``SFG_MAX_RATIO``      ``200``    decompressed / compressed size of an archive, once past
                                  64 MiB (real data sets compress 1-25x; zeros 1000x)
=====================  =========  ===========================================================

Sizes accept ``K``/``M``/``G``/``T`` suffixes (powers of 1024, ``GiB`` also works) or plain
bytes. The defaults let several sfg processes run side by side on a 24 GiB machine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sfg.errors import SfgError

GiB = 1 << 30
DEFAULTS = {"SFG_MAX_MEMORY": 4 * GiB, "SFG_MAX_MEMBER": 1 * GiB, "SFG_MAX_RUNS": 20_000,
            "SFG_MAX_YAML_NODES": 100_000, "SFG_MAX_RATIO": 200,
            "SFG_MAX_PIXELS": 32 << 20}
MAX_DEPTH = 100  # nesting of a YAML/JSON settings document
INT64_MAX = (1 << 63) - 1

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, what: str = "size") -> int:
    """``"4G"`` -> 4294967296; ``"512M"``, ``"8GiB"``, ``"1000"`` (bytes) also work."""
    m = _SIZE.match(str(text))
    if not m:
        raise SfgError(f"{what} {text!r} is not a size; write e.g. 4G, 512M or 8GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _limit(var: str) -> int:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return int(DEFAULTS[var])
    if var in ("SFG_MAX_RUNS", "SFG_MAX_YAML_NODES", "SFG_MAX_RATIO"):
        try:
            value = int(raw)
        except ValueError:
            raise SfgError(f"{var}={raw!r} must be a whole number, e.g. {var}="
                           f"{DEFAULTS[var]}") from None
    else:
        value = parse_size(raw, var)
    if value < 1:
        raise SfgError(f"{var}={raw!r} must be positive")
    return value


def max_memory() -> int:
    """Bytes one input may imply (``SFG_MAX_MEMORY``, default 4 GiB)."""
    return _limit("SFG_MAX_MEMORY")


def max_member() -> int:
    """Decompressed bytes of one archive member (``SFG_MAX_MEMBER``, default 1 GiB)."""
    return _limit("SFG_MAX_MEMBER")


def max_pixels() -> int:
    """Pixels of one image, checked at its header before decoding (``SFG_MAX_PIXELS``,
    default 32M = 33,554,432: about a second of decoding on one core)."""
    return _limit("SFG_MAX_PIXELS")


def max_runs() -> int:
    """Runs one grid may expand to (``SFG_MAX_RUNS``, default 20,000)."""
    return _limit("SFG_MAX_RUNS")


def max_nodes() -> int:
    """Nodes of a YAML/JSON settings file, aliases expanded (``SFG_MAX_YAML_NODES``)."""
    return _limit("SFG_MAX_YAML_NODES")


def max_ratio() -> int:
    """Largest decompressed/compressed size ratio of an archive (``SFG_MAX_RATIO``, 200)."""
    return _limit("SFG_MAX_RATIO")


def human_bytes(n: float) -> str:
    """``4294967296`` -> ``"4 GiB"``, ``1.5e9`` -> ``"1.4 GiB"``."""
    n = float(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v >= 100 or v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    return f"{n:,.0f}" if n < 1e7 else f"{n:.2g}"


def check_memory(nbytes: float, what: str, *, fix: str = "") -> None:
    """Refuse an input that implies more than ``SFG_MAX_MEMORY`` bytes.

    ``what`` describes the size ("this trace spans 4.2e8 rounds x 30 devices"); the message
    gives the bytes, the limit and how to raise it, plus ``fix`` (how to ask for less).
    """
    limit = max_memory()
    if not nbytes <= limit:  # also refuses NaN
        tail = f"; {fix}" if fix else ""
        raise SfgError(f"{what} = {human_bytes(nbytes)}, over the limit of {human_bytes(limit)} "
                       f"(raise it with SFG_MAX_MEMORY=16G if this machine has the memory)"
                       f"{tail}")


def check_cells(rows: float, cols: float, bytes_per_cell: float, what: str, *,
                rows_name: str = "rounds", cols_name: str = "devices", fix: str = "") -> None:
    """:func:`check_memory` for a ``rows x cols`` array (figures named in the message)."""
    check_memory(float(rows) * float(cols) * bytes_per_cell,
                 f"{what} spans {_count(rows)} {rows_name} x {_count(cols)} {cols_name}", fix=fix)


def check_int64(value: int, what: str, *, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> int:
    """``value`` as an int when ``lo <= value <= hi`` (default: the int64 range), else SfgError."""
    if not lo <= value <= hi:
        raise SfgError(f"{what} {value} is out of range (must lie in {lo}..{hi})")
    return int(value)


# ------------------------------------------------------------------------------ files
def regular_file(path: str | os.PathLike, what: str, hint: str = "") -> Path:
    """``path`` as a Path when it is an existing regular file; a one-line error otherwise."""
    p = Path(path).expanduser()
    if not p.exists():
        raise SfgError(f"{what} {p} does not exist{hint}")
    if p.is_dir():
        raise SfgError(f"{what} {p} is a directory, not a file{hint}")
    if not p.is_file():
        raise SfgError(f"{what} {p} is not a regular file{hint}")
    return p


def decode_text(data: bytes, where: str, *, what: str = "file") -> str:
    """UTF-8 text of ``data`` (a leading BOM is dropped), or an error naming the bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SfgError(f"{what} {where} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                       f"{e.start}, line {line}); save it as UTF-8") from None


def read_text(path: str | os.PathLike, what: str, *, hint: str = "",
              bytes_per_byte: float = 1.0) -> str:
    """Read a UTF-8 text file after checking that it is a file and fits the memory budget.

    ``bytes_per_byte``: memory the reader needs per byte of file (e.g. ~8 for JSON parsed into
    Python objects), so that the budget check covers what reading it implies.
    """
    p = regular_file(path, what, hint)
    size = p.stat().st_size
    check_memory(size * max(bytes_per_byte, 1.0), f"reading {what} {p} ({human_bytes(size)})",
                 fix="split the file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise SfgError(f"cannot read {what} {p}: {e.strerror or e}") from None
    return decode_text(data, str(p), what=what)


# ------------------------------------------------------------------------------ JSON
def loads_json(text: str | bytes, where: str, *, what: str = "JSON file",
               parse_float: Callable[[str], Any] | None = None) -> Any:
    """``json.loads`` with one-line errors for bad syntax, bad encoding and deep nesting.

    ``parse_float``: as for :func:`json.loads` (e.g. a cache that shares repeated values).
    """
    import json

    if isinstance(text, (bytes, bytearray)):
        text = decode_text(bytes(text), where, what=what)
    try:
        return json.loads(text, parse_float=parse_float)
    except json.JSONDecodeError as e:
        raise SfgError(f"{what} {where}: invalid JSON at line {e.lineno}, column {e.colno} "
                       f"({e.msg}); is the file truncated?") from None
    except RecursionError:
        raise SfgError(f"{what} {where}: JSON nested too deeply to read (more than about "
                       "1,000 levels); this is not a file sfg writes or reads") from None
    except ValueError as e:  # e.g. an integer literal with more than 4,300 digits
        raise SfgError(f"{what} {where}: cannot read JSON ({' '.join(str(e).split())[:200]})"
                       ) from None


# ------------------------------------------------------------------------------ YAML
def _yaml_mark(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f":{mark.line + 1}" if mark is not None else ""


def compose_yaml(text: str, source: str, *, what: str = "YAML file"):
    """``(root node, data)`` of one YAML document, bounded in depth and expanded size.

    Anchors and aliases are allowed, but the document is walked with every alias expanded
    before anything is built from it: more than ``SFG_MAX_YAML_NODES`` nodes (an alias bomb)
    or deeper than 100 levels is refused at once.
    """
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or " ".join(str(e).split())
            raise SfgError(f"{source}{_yaml_mark(e)}: invalid YAML ({problem}); check the "
                           "indentation and quoting there") from None
        except RecursionError:
            raise SfgError(f"{source}: YAML nested too deeply to read; a {what} is a few "
                           "levels deep") from None
        if root is None:
            return None, None
        _walk_bounded(root, source, what)
        try:
            data = loader.construct_document(root)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or " ".join(str(e).split())
            raise SfgError(f"{source}{_yaml_mark(e)}: invalid YAML ({problem})") from None
        except RecursionError:  # pragma: no cover - depth is bounded above
            raise SfgError(f"{source}: YAML nested too deeply to read") from None
        return root, data
    finally:
        loader.dispose()


def _walk_bounded(root, source: str, what: str) -> None:
    import yaml

    limit = max_nodes()
    count = 0
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > limit:
            raise SfgError(
                f"{source}: this {what} expands to more than {limit:,} YAML nodes (anchors and "
                "aliases counted each time they are used); it looks like an alias bomb. Raise "
                "SFG_MAX_YAML_NODES if it is meant")
        if depth > MAX_DEPTH:
            raise SfgError(f"{source}:{node.start_mark.line + 1}: YAML nested more than "
                           f"{MAX_DEPTH} levels deep; a {what} is a few levels deep")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((v, depth + 1) for v in node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))


def load_settings_file(path: str | os.PathLike, *, what: str = "config file") -> dict:
    """A mapping of settings from a YAML (``.yaml``/``.yml``) or JSON file, read safely."""
    p = regular_file(path, what, "; give the path of a YAML or JSON file of settings")
    text = read_text(p, what, bytes_per_byte=8)
    if p.suffix.lower() in (".yaml", ".yml"):
        _, data = compose_yaml(text, str(p), what=what)
    else:
        data = loads_json(text, str(p), what=what)
        _check_json_size(data, str(p), what)
    if not isinstance(data, dict):
        raise SfgError(f"{what} {p} must hold a mapping of settings (key: value), got "
                       f"{type(data).__name__}")
    return data


def _check_json_size(data: Any, source: str, what: str) -> None:
    limit, count = max_nodes(), 0
    stack = [data]
    while stack:
        v = stack.pop()
        count += 1
        if count > limit:
            raise SfgError(f"{source}: this {what} has more than {limit:,} values; raise "
                           "SFG_MAX_YAML_NODES if it is meant")
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


# ------------------------------------------------------------------------------ stores
def sqlite_message(path: str | os.PathLike, e: Exception, action: str = "read") -> str:
    text = " ".join(str(e).split())
    low = text.lower()
    if "malformed" in low or "corrupt" in low or "not a database" in low:
        return (f"results store {path} is damaged ({text}); restore it from a copy, or save "
                f"what is readable with `sqlite3 {path} .recover | sqlite3 new.sqlite`")
    if "readonly" in low or "read-only" in low:
        return (f"results store {path} is read-only ({text}); `sfg report` and `sfg grid "
                "status` can read it, but running a grid needs a writable copy")
    if "locked" in low or "busy" in low:
        return f"results store {path} stayed locked ({text}); another process holds it, retry later"
    return f"cannot {action} results store {path}: {text}"


# ------------------------------------------------------------------------------ options
def check_repeated_options(command: Any, args: list[str]) -> None:
    """Refuse a single-valued option given twice (``--engine compiled --engine numpy``).

    ``command`` is the click command of the whole CLI; the sub-command named in ``args`` is
    looked up, and every option of it that takes one value (not ``multiple``) may appear
    once. A boolean flag given in both forms (``--progress --no-progress``) is refused too.
    """
    def is_option(p: Any) -> bool:  # typer vendors click: test by shape, not by class
        return getattr(p, "param_type_name", "") == "option"

    cmd, rest, path = command, list(args), []
    while isinstance(getattr(cmd, "commands", None), dict):
        # the sub-command: the first word that is not an option of the group nor its value
        # (``sfg --plugin mod replay``: ``mod`` is --plugin's)
        group_values = {o for p in getattr(cmd, "params", ()) if is_option(p) and not p.is_flag
                        for o in p.opts}
        i, skip = None, False
        for k, tok in enumerate(rest):
            if skip:
                skip = False
            elif tok in group_values:
                skip = True
            elif not tok.startswith("-"):
                i = k
                break
        if i is None or rest[i] not in cmd.commands:
            return
        path.append(rest[i])
        cmd, rest = cmd.commands[rest[i]], rest[i + 1:]
    single: dict[str, Any] = {}
    for p in cmd.params:
        if is_option(p) and not p.multiple and not getattr(p, "count", False):
            for o in (*p.opts, *p.secondary_opts):
                single[o] = p
    takes_value = {o for p in cmd.params if is_option(p) and not p.is_flag for o in p.opts}
    seen: dict[str, str] = {}
    skip = False
    for tok in rest:
        if skip:
            skip = False
            continue
        if tok == "--":
            break
        name = tok.split("=", 1)[0] if tok.startswith("--") else tok
        if name in takes_value and "=" not in tok:
            skip = True
        p = single.get(name)
        if p is None:
            continue
        if p.name in seen and not (p.is_flag and seen[p.name] == name):
            label = " ".join(["sfg", *path])
            raise SfgError(f"{label}: option {seen[p.name]} is given twice ({seen[p.name]} ... "
                           f"{name}); it takes one value, keep one")
        seen[p.name] = name
