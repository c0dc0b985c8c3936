"""File plumbing shared by the loaders: finding a dataset under ``--data-root``, reading tar
archives quickly, and the decoded-array cache.

Cache location (first that applies): the loader option ``cache_dir``; the environment variable
``SFG_CACHE_DIR``; ``<data root>/.sfg-cache/`` when that directory is writable (the data root
itself if it is a directory, else its parent); ``$XDG_CACHE_HOME/sfg`` or ``~/.cache/sfg``.
Cache files are keyed by the source's resolved path, size and modification time (and the
options that change the decoded arrays), so an edited source is decoded afresh.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from sfg.errors import SfgError
from sfg.util.atomic import write_via
from sfg.util.safety import check_memory, human_bytes, max_member, max_memory, max_ratio

T = TypeVar("T")

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")
CACHE_VERSION = 1


def normalized_name(text: str) -> str:
    """Lower case, letters and digits only: ``"CIFAR-10_jpeg"`` -> ``"cifar10jpeg"``."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def is_tar(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(TAR_SUFFIXES)


def candidate_paths(root: Path, *, max_depth: int = 2, max_entries: int = 256
                    ) -> Iterator[tuple[int, Path]]:
    """``root`` and what lies below it, breadth first, sorted; hidden names skipped.

    Directories with more than ``max_entries`` entries are yielded but not listed (they hold
    data such as images, not datasets).
    """
    level = [root]
    for depth in range(max_depth + 1):
        nxt: list[Path] = []
        for path in level:
            yield depth, path
            if depth == max_depth or not path.is_dir():
                continue
            try:
                entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
            except OSError:
                continue
            if len(entries) <= max_entries:
                nxt.extend(entries)
        level = nxt


def locate(data_root: str | os.PathLike | None, accept: Callable[[Path], T | None], *,
           what: str, looked_for: str, hint: str | None = None, fix: str = "") -> T:
    """The first ``accept(path)`` that is not None over :func:`candidate_paths` of the root.

    Below the root only paths whose normalised absolute path matches the regex ``hint``
    are tried. Raises a one-line :class:`SfgError` listing what was looked for.
    """
    tail = f"; {fix}" if fix else ""
    if data_root is None or str(data_root).strip() == "":
        raise SfgError(f"{what} needs a data root (--data-root) pointing at {looked_for}{tail}")
    root = Path(data_root).expanduser()
    if not root.exists():
        raise SfgError(f"{what}: data root {root} does not exist; point --data-root at "
                       f"{looked_for}{tail}")
    pattern = re.compile(hint) if hint else None
    for depth, path in candidate_paths(root):
        if depth > 0 and pattern is not None and not pattern.search(
                normalized_name(str(path.resolve()))):
            continue
        found = accept(path)
        if found is not None:
            return found
    raise SfgError(f"no {what} found at {root} (looked for {looked_for}, in it and up to two "
                   f"levels below){tail}")


# --------------------------------------------------------------------------- tar archives
# Archives are hostile input: every member's declared size is checked against SFG_MAX_MEMBER
# before its bytes are read, the sum against SFG_MAX_MEMORY, and a gzip stream is decompressed
# with the same running limit (a small .tar.gz of zeros cannot expand past it).
_HEADS: dict[tuple, list[str]] = {}
_RATIO_FLOOR = 64 << 20  # archives expanding to less are never refused for their ratio


def _fingerprint(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


class _Budget:
    """Running per-member and total decompressed-size limits of one pass over an archive."""

    def __init__(self, path: Path):
        self.path, self.member, self.total, self.used = path, max_member(), max_memory(), 0
        self.compressed = path.stat().st_size if path.name.lower().endswith((".gz", ".tgz")) \
            else None

    def add(self, name: str, size: int) -> None:
        if size > self.member:
            raise SfgError(f"archive {self.path}: member {name} declares {human_bytes(size)} "
                           f"decompressed, over the per-member limit of "
                           f"{human_bytes(self.member)} (raise it with SFG_MAX_MEMBER=4G if the "
                           "archive is genuine)")
        self.used += size
        if self.compressed is not None:
            check_ratio(self.path, self.used, self.compressed)
        check_memory(self.used, f"archive {self.path} decompresses to more than "
                                f"{human_bytes(self.used)} (by member {name})",
                     fix="or extract only what is needed")


def check_ratio(path: Path, decompressed: int, compressed: int) -> None:
    """Refuse an archive that expands more than SFG_MAX_RATIO times (past 64 MiB): a bomb."""
    ratio = max_ratio()
    if decompressed > _RATIO_FLOOR and decompressed > ratio * max(compressed, 1):
        raise SfgError(f"archive {path} expands to more than {human_bytes(decompressed)} from "
                       f"{human_bytes(compressed)} (over {ratio}x; real data sets compress "
                       "1-25x), which looks like a decompression bomb; raise SFG_MAX_RATIO if "
                       "it is genuine")


def tar_file_names(path: Path, limit: int = 64) -> list[str]:
    """Names of the first ``limit`` regular files of a tar archive (cheap: streams the head).

    The head is scanned once per archive (cached by path, size and modification time, up to
    4,096 names), however many dataset detectors ask, with the size limits above.
    """
    key = _fingerprint(path)
    if key not in _HEADS:
        names: list[str] = []
        budget = _Budget(path)
        try:
            with tarfile.open(path, "r|*") as tf:
                for member in tf:
                    if member.isfile():
                        budget.add(member.name, member.size)
                        names.append(member.name)
                        if len(names) >= 4096:
                            break
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise SfgError(f"cannot read archive {path}: {exc}") from None
        if len(_HEADS) > 64:
            _HEADS.clear()
        _HEADS[key] = names
    return _HEADS[key][:limit]


_PIECE = 1 << 20  # bytes of compressed input, or of decompressed output, handled at a time
_ZERO_BLOCK = bytes(512)


def _gunzip_pieces(path: Path) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file (all members) in pieces of at most 1 MiB.

    The running total is refused past SFG_MAX_MEMORY and SFG_MAX_RATIO exactly as if the whole
    stream were decompressed at once, but only one piece is held at a time.
    """
    limit = max_memory()
    compressed = path.stat().st_size
    d = zlib.decompressobj(wbits=31)
    fed, total = False, 0
    try:
        with open(path, "rb") as fh:
            while True:
                chunk = fh.read(_PIECE)
                if not chunk:
                    break
                waiting = False
                while chunk or waiting:
                    fed = True
                    out = d.decompress(chunk, _PIECE)
                    chunk = d.unconsumed_tail
                    waiting = len(out) == _PIECE and not d.eof  # more output may be pending
                    if out:
                        total += len(out)
                        check_ratio(path, total, compressed)
                        if total > limit:
                            check_memory(total, f"archive {path} decompresses to more than "
                                                f"{human_bytes(limit)}",
                                         fix="or extract only what is needed")
                        yield out
                    if d.eof:  # concatenated gzip members
                        rest = d.unused_data
                        d, fed, waiting = zlib.decompressobj(wbits=31), False, False
                        chunk = rest + chunk if rest.strip(b"\0") else b""
    except zlib.error as exc:
        raise SfgError(f"cannot decompress archive {path}: {exc}") from None
    if fed and not d.eof:
        raise SfgError(f"cannot decompress archive {path}: it ends before the end of its gzip "
                       "stream (truncated download?)")


def _file_pieces(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while piece := fh.read(_PIECE):
            yield piece


def _tar_pieces(path: Path) -> Iterator[bytes] | None:
    """The tar stream of ``path`` in bounded pieces, or None to let :mod:`tarfile` stream it."""
    name = path.name.lower()
    if name.endswith(".tar"):
        size = path.stat().st_size
        check_memory(size, f"archive {path} holds {human_bytes(size)}",
                     fix="or extract only what is needed")
        return _file_pieces(path)
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic != b"\x1f\x8b":
        return None  # bz2/xz or mislabelled: let tarfile stream it (member sizes checked)
    return _gunzip_pieces(path)


class _TarStream:
    """Forward reads over a tar stream that arrives in pieces: memory is one piece (plus the
    member being read), whatever the archive's size. Also the file object :mod:`tarfile`
    reads the rest of an archive from (``read``)."""

    def __init__(self, pieces: Iterator[bytes]):
        self._pieces = pieces
        self._buf, self._pos = b"", 0
        self.offset = 0  # bytes of the tar stream consumed

    def _next_piece(self) -> bool:
        piece = next(self._pieces, None)
        if piece is None:
            return False
        self._buf, self._pos = piece, 0
        return True

    def peek(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end), without consuming them."""
        if len(self._buf) - self._pos < n:
            parts = [self._buf[self._pos:]]
            have = len(parts[0])
            while have < n and self._next_piece():
                parts.append(self._buf)
                have += len(self._buf)
            self._buf, self._pos = b"".join(parts), 0
        return self._buf[self._pos:self._pos + n]

    def readinto(self, buf) -> int:
        """Fill the writable buffer ``buf`` from the stream: the bytes copied (fewer at the end)."""
        view = memoryview(buf).cast("B")
        done = 0
        while done < len(view) and (self._pos < len(self._buf) or self._next_piece()):
            take = min(len(view) - done, len(self._buf) - self._pos)
            view[done:done + take] = memoryview(self._buf)[self._pos:self._pos + take]
            self._pos += take
            self.offset += take
            done += take
        return done

    def read(self, n: int = -1) -> bytes:
        """The next ``n`` bytes (fewer at the end; all the rest for ``n < 0``)."""
        if 0 <= n <= _PIECE:
            out = self.peek(n)
            self._pos += len(out)
            self.offset += len(out)
            return out
        if n < 0:
            parts = [self.read(_PIECE)]
            while parts[-1]:
                parts.append(self.read(_PIECE))
            return b"".join(parts)
        out = bytearray(n)
        return bytes(memoryview(out)[:self.readinto(out)])

    def skip(self, n: int) -> None:
        while n > 0 and (self._pos < len(self._buf) or self._next_piece()):
            take = min(n, len(self._buf) - self._pos)
            self._pos += take
            self.offset += take
            n -= take

    def drain(self) -> None:
        """Read the stream to its end (a gzip is then checked whole, as before streaming)."""
        self._buf, self._pos = b"", 0
        for _ in self._pieces:
            pass


def _octal(field: bytes) -> int | None:
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return None


def _ustar_header(header: bytes) -> tuple[str, int, bytes] | None:
    """``(name, size, type)`` of one ustar/v7 header block of a file (``0``), directory
    (``5``), pax extended header (``x``) or GNU long name (``L``), or None when it is anything
    else (links, devices, global pax headers, sparse files, bad checksum, base-256 size)."""
    size = _octal(header[124:136])
    checksum = _octal(header[148:156])
    if size is None or checksum is None:
        return None
    if checksum != sum(header[:148]) + 256 + sum(header[156:]):
        return None
    kind = header[156:157]
    if kind not in (b"0", b"\0", b"5", b"x", b"L"):
        return None
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":  # POSIX ustar (GNU tars use 345.. for times)
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, kind


def _pax_fields(data: bytes) -> dict[str, str] | None:
    """The records ``"<length> <key>=<value>\\n"`` of a pax extended header, or None when they
    are malformed or ask for more than a path and a size (sparse files, other charsets)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            return None
        record = data[space + 1:pos + length]
        if (length <= 0 or pos + length > len(data) or not record.endswith(b"\n")
                or b"=" not in record):
            return None
        key, value = record[:-1].split(b"=", 1)
        if key.startswith(b"GNU.sparse") or key == b"hdrcharset":
            return None
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    if "size" in out and not (out["size"].isascii() and out["size"].isdigit()):
        return None
    return out


_EXTENDED_MAX = 1 << 16  # bytes of a pax header or GNU long name the fast reader takes


def _extended(stream: _TarStream, size: int, kind: bytes) -> tuple[str, int, bytes] | None:
    """The header that the pax ``x`` or GNU ``L`` block at the stream's position applies to,
    with its name (and size) replaced, all three consumed; None, with nothing consumed, when
    that header is not a plain file or directory or the extended data is odd (then
    :mod:`tarfile` reads on from here)."""
    padded = -(-size // 512) * 512
    if size > _EXTENDED_MAX:
        return None
    block = stream.peek(512 + padded + 512)
    if len(block) < 512 + padded + 512:
        return None
    data = block[512:512 + size]
    following = _ustar_header(block[512 + padded:])
    if following is None or following[2] not in (b"0", b"\0", b"5"):
        return None
    name, member_size, member_kind = following
    if kind == b"L":
        name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    else:
        fields = _pax_fields(data)
        if fields is None:
            return None
        name = fields.get("path", name)
        member_size = int(fields.get("size", member_size))
    stream.skip(512 + padded + 512)
    return name, member_size, member_kind


class _NotPlain(Exception):
    """A header the fast reader does not know: :mod:`tarfile` reads on from it."""


def _walk_ustar(stream: _TarStream) -> Iterator[tuple[str, int]]:
    """``(name, size)`` of each regular file of a plain ustar/v7 tar stream.

    At each yield the stream stands at the file's data; the consumer reads it or not, and the
    rest of the file and its padding are skipped on resuming. Pax extended headers (which
    Python's ``tarfile`` writes for every member) and GNU long names are applied to the header
    they precede. Ends at the end-of-archive block (or the end of the data); raises
    :class:`_NotPlain` with the stream left at the header it does not know. This is ~20x
    faster than :mod:`tarfile` on archives of many small images.
    """
    while True:
        header = stream.peek(512)
        if len(header) < 512 or header == _ZERO_BLOCK:
            return
        parsed = _ustar_header(header)
        if parsed is not None and parsed[2] in (b"x", b"L"):  # Python's and GNU tar's
            parsed = _extended(stream, parsed[1], parsed[2])
        elif parsed is not None:
            stream.skip(512)
        if parsed is None:
            raise _NotPlain
        name, size, kind = parsed
        end = stream.offset + -(-size // 512) * 512
        if kind != b"5":
            yield name, size
        stream.skip(end - stream.offset)


def _parse_ustar(raw: bytes) -> list[tuple[str, int, int]] | None:
    """``(name, offset, size)`` of the regular files of an in-memory plain tar, or None when
    it holds a header :func:`_walk_ustar` does not know."""
    stream = _TarStream(iter([raw]))
    try:
        return [(name, stream.offset, size) for name, size in _walk_ustar(stream)]
    except _NotPlain:
        return None


class _Member(io.RawIOBase):
    """A file object over one member's data in a :class:`_TarStream` (valid until the walk
    moves on): ``read``, ``readinto`` (straight into the caller's buffer) and ``readline``."""

    def __init__(self, stream: _TarStream, path: Path, name: str, size: int):
        super().__init__()
        self._stream, self._left = stream, size
        self._truncated = f"archive {path} is truncated (member {name})"

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")[:self._left]
        got = self._stream.readinto(view)
        if got < len(view):
            raise SfgError(self._truncated)
        self._left -= got
        return got


def iter_tar_members(path: Path, keep: Callable[[str], bool]) -> Iterator[tuple[str, int, BinaryIO]]:
    """``(name, size, file)`` for every regular file of a tar(.gz) whose name ``keep`` accepts.

    ``file`` reads that member's data (a truncated member raises :class:`SfgError`) until the
    next member is asked for. One pass over the archive, streamed: memory is a 1 MiB piece
    plus what the caller reads, whatever the archive's size. A member over SFG_MAX_MEMBER or
    members kept over SFG_MAX_MEMORY in total are refused before their bytes are read.
    """
    budget = _Budget(path)
    pieces = _tar_pieces(path)
    stream = _TarStream(pieces) if pieces is not None else None
    if stream is not None:
        try:
            for name, size in _walk_ustar(stream):
                if keep(name):
                    budget.add(name, size)
                    yield name, size, io.BufferedReader(_Member(stream, path, name, size),
                                                        buffer_size=1 << 16)
            stream.drain()
            return
        except _NotPlain:
            pass  # tarfile reads on from that header
    try:
        tf = (tarfile.open(fileobj=stream, mode="r|") if stream is not None
              else tarfile.open(path, "r|*"))
        with tf:
            for member in tf:
                if member.isfile() and keep(member.name):
                    budget.add(member.name, member.size)
                    yield member.name, member.size, tf.extractfile(member) or io.BytesIO()
        if stream is not None:
            stream.drain()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise SfgError(f"cannot read archive {path}: {exc}") from None


def iter_tar_files(path: Path, keep: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """``(name, content)`` for every regular file of a tar(.gz) whose name ``keep`` accepts
    (:func:`iter_tar_members`, each member read whole: memory is that member)."""
    for name, size, fh in iter_tar_members(path, keep):
        blob = fh.read(size) if size else b""
        if len(blob) < size:
            raise SfgError(f"archive {path} is truncated (member {name})")
        yield name, blob
        del blob


# --------------------------------------------------------------------------- the cache
def source_fingerprint(path: Path) -> dict[str, Any]:
    """Resolved path, size and mtime of a file; for a directory, of every non-hidden file below."""
    path = path.resolve()
    if path.is_file():
        st = path.stat()
        return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    count = total = newest = 0
    for dirpath, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # e.g. our own .sfg-cache
        for name in files:
            if name.startswith("."):
                continue
            st = os.stat(os.path.join(dirpath, name))
            count += 1
            total += st.st_size
            newest = max(newest, st.st_mtime_ns)
    return {"path": str(path), "files": count, "size": total, "mtime_ns": newest}


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def cache_directory(data_root: Path, explicit: str | os.PathLike | None = None) -> Path:
    """Where decoded arrays for ``data_root`` are cached (see the module docstring)."""
    if explicit not in (None, "", "none"):
        path = Path(explicit).expanduser()
        if not _writable_dir(path):
            raise SfgError(f"cache_dir {path} is not a writable directory; choose another one")
        return path
    env = os.environ.get("SFG_CACHE_DIR")
    if env:
        path = Path(env).expanduser()
        if not _writable_dir(path):
            raise SfgError(f"SFG_CACHE_DIR={path} is not a writable directory; unset or fix it")
        return path
    base = data_root if data_root.is_dir() else data_root.parent
    local = base / ".sfg-cache"
    if os.access(base, os.W_OK | os.X_OK) and _writable_dir(local):
        return local
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sfg"
    if not _writable_dir(home):
        raise SfgError(f"no writable cache directory ({local} and {home} are not writable); "
                       "pass cache_dir=PATH")
    return home


def cache_path(directory: Path, kind: str, source: Path, options: dict[str, Any]) -> Path:
    """Cache file for ``source`` decoded with ``options`` (keyed by its fingerprint)."""
    key = json.dumps({"v": CACHE_VERSION, "kind": kind, "source": source_fingerprint(source),
                      "options": options}, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    stem = normalized_name(source.name)[:40] or "data"
    return directory / f"{kind}-{stem}-{digest}.npz"


def load_cached(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file, or None when missing or unreadable (then re-decode)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, KeyError):
        return None


def save_cached(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write a cache file atomically (:func:`sfg.util.atomic.write_via`)."""
    try:
        write_via(path, lambda fh: np.savez(fh, **arrays))
    except OSError as exc:
        raise SfgError(f"cannot write cache file {path}: {exc}; pass cache_dir=PATH") from None
