"""The installable parts of sfg, and the one error for a part that is not installed.

``pip install sfg`` gives the core: the rules and their one-receiver form, the compiled round,
the model-free replay, the trace tools, grids of replay runs and their statistics (numpy,
numba, scipy, typer, rich, pydantic, pyyaml). Extras add the rest (``pyproject.toml``):

* ``train``: the training simulator and pre-training (torch, Pillow, scikit-learn, safetensors);
* ``net``: networked nodes (``train`` and grpcio, msgpack, safetensors, cryptography);
* ``report``: paired reports and plots (matplotlib);
* ``ray``, ``parquet`` (Parquet traces), ``export`` (TensorBoard, MLflow); ``all``: every one.

:data:`EXTRA_OF` maps each optional module to the extra that installs it — the one table.
A command checks what it needs before it starts (:func:`require`); an import that fails anyway
is turned into the same error (:func:`missing_extra`, used by :func:`sfg.cli.console.run_app`).
Either way the user sees one line, ``error: sfg run needs the 'train' extra (torch is not
installed): pip install 'sfg[train]'``, and exit status 2.
"""

from __future__ import annotations

import importlib.util

from sfg.errors import SfgError

#: Top-level module -> the extra that installs it (``pip install 'sfg[EXTRA]'``).
EXTRA_OF: dict[str, str] = {
    "torch": "train",
    "PIL": "train",
    "sklearn": "train",
    "safetensors": "train",
    "grpc": "net",
    "msgpack": "net",
    "cryptography": "net",
    "matplotlib": "report",
    "ray": "ray",
    "pyarrow": "parquet",
    "tensorboard": "export",
    "mlflow": "export",
}

#: The distribution to name when a module's import name differs from it.
_PACKAGE = {"PIL": "Pillow", "sklearn": "scikit-learn", "grpc": "grpcio",
            "mlflow": "mlflow-skinny"}


class MissingExtra(SfgError):
    """``what`` needs optional ``modules`` that are not installed; names the extras to install
    (``extra``: the one extra that brings them all, e.g. ``net`` for torch and grpc)."""

    def __init__(self, what: str, *modules: str, extra: str | None = None):
        self.modules = tuple(dict.fromkeys(m.split(".")[0] for m in modules))
        self.extras = (extra,) if extra else tuple(dict.fromkeys(EXTRA_OF[m] for m in self.modules))
        packages = [_PACKAGE.get(m, m) for m in self.modules]
        names = " and ".join(f"'{e}'" for e in self.extras)
        super().__init__(
            f"{what} needs the {names} extra{'s' if len(self.extras) > 1 else ''} "
            f"({', '.join(packages)} {'is' if len(packages) == 1 else 'are'} not installed): "
            f"pip install 'sfg[{','.join(self.extras)}]'")


def installed(module: str) -> bool:
    """Whether ``module`` (a top-level name) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        return False


def require(what: str, *modules: str, extra: str | None = None) -> None:
    """Raise :class:`MissingExtra` naming every one of ``modules`` that is not installed.

    ``what`` names what needs them, as the user typed it (``"sfg run"``, ``"--plot"``); each
    module must be a key of :data:`EXTRA_OF`. ``extra``: the extra to name instead of each
    module's own (one that includes them all, e.g. ``net``, which includes ``train``).
    """
    unknown = [m for m in modules if m not in EXTRA_OF]
    if unknown:
        raise KeyError(f"{unknown[0]!r} is not an optional module (sfg.util.extras.EXTRA_OF)")
    missing = [m for m in modules if not installed(m)]
    if missing:
        raise MissingExtra(what, *missing, extra=extra)


def missing_extra(e: BaseException, what: str) -> MissingExtra | None:
    """The :class:`MissingExtra` for an import error of an optional module, else None
    (an import error of anything else is a bug, and should keep its traceback)."""
    name = getattr(e, "name", None)
    if not isinstance(e, ImportError) or not name or name.split(".")[0] not in EXTRA_OF:
        return None
    return MissingExtra(what, name)
