"""A restricted unpickler for the CIFAR python archives.

The official CIFAR-10/100 "python version" archives are pickles of dicts holding a uint8
numpy array, lists of ints and byte strings. Unpickling is code execution in general, so
:class:`CifarUnpickler` resolves only the globals that format needs (numpy array and dtype
reconstruction, and ``_codecs.encode`` which protocol-2 pickles use for ``bytes``); any other
global raises :class:`SfgError` before anything is called.
"""

from __future__ import annotations

import codecs
import io
import pickle
from typing import Any, BinaryIO

import numpy as np

from sfg.errors import SfgError

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as _numeric  # type: ignore[no-redef]

_ARRAY_GLOBALS: dict[str, Any] = {
    "multiarray._reconstruct": _multiarray._reconstruct,
    "multiarray.scalar": _multiarray.scalar,
    "numeric._frombuffer": _numeric._frombuffer,
}

#: (module, name) -> object: everything a CIFAR archive may reference.
ALLOWED: dict[tuple[str, str], Any] = {("_codecs", "encode"): codecs.encode}
for _prefix in ("numpy.core", "numpy._core"):
    for _key, _obj in _ARRAY_GLOBALS.items():
        _mod, _name = _key.split(".")
        ALLOWED[(f"{_prefix}.{_mod}", _name)] = _obj
ALLOWED[("numpy", "ndarray")] = np.ndarray
ALLOWED[("numpy", "dtype")] = np.dtype


class CifarUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`ALLOWED` globals (see module doc)."""

    def __init__(self, file, *, source: str, **kwargs):
        super().__init__(file, **kwargs)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise SfgError(
                f"refusing to unpickle {module}.{name} from {self.source}: CIFAR archives "
                "contain only arrays, lists, dicts and strings") from None

    def persistent_load(self, pid: Any) -> Any:
        raise SfgError(f"refusing persistent id {pid!r} in {self.source}: CIFAR archives "
                       "contain only arrays, lists, dicts and strings")


def load_cifar_pickle(data: bytes | BinaryIO, *, source: str) -> Any:
    """Unpickle one CIFAR batch file (``encoding="bytes"`` like the official loader).

    ``data``: the file's bytes, or a binary file object read from where it stands (then the
    file's bytes are never held as a whole beside the arrays they become).
    """
    fh = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        return CifarUnpickler(fh, source=source, encoding="bytes").load()
    except SfgError:
        raise
    except Exception as exc:  # truncated or not a pickle at all
        raise SfgError(f"cannot read {source} as a CIFAR python pickle: "
                       f"{type(exc).__name__}: {exc}") from None
