"""Atomic file writes, written once: every file that sfg replaces in place goes through here.

:func:`write_via` writes through a callback to a temporary file in the target's folder
(``.NAME.tmpPID``; ``.NAME.tmpPID.THREAD`` from a thread other than the main one, so that two
threads never share one), flushes and ``fsync``\\ s it, renames it over the target
(``os.replace``: atomic within one file system) and ``fsync``\\ s the folder where the
platform allows, so that the rename itself survives a crash. :func:`write_bytes` writes bytes
that way.

Until the rename the target keeps its previous content whole (or stays absent): a write or
``fsync`` that fails part-way raises with the temporary file removed, and a process killed
part-way leaves only its temporary file beside the target, never a torn target.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def temp_path(path: str | os.PathLike) -> Path:
    """The temporary file a write to ``path`` from this process (and thread) goes through."""
    path = Path(path)
    tag = str(os.getpid())
    if threading.current_thread() is not threading.main_thread():
        tag += f".{threading.get_native_id()}"
    return path.with_name(f".{path.name}.tmp{tag}")


def write_via(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` atomically with what ``write(f)`` writes to the binary file ``f``
    (see the module docstring)."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` atomically with ``data`` (:func:`write_via`)."""
    write_via(path, lambda f: f.write(data))


_NO_FOLDER_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def _sync_folder(folder: Path) -> None:
    """``fsync`` the folder (the rename's entry), where the platform and file system allow."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:  # e.g. a platform whose folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError as e:  # a file system that does not sync folders says so; others raise
        if e.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)
