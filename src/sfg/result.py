"""The one result type of a run, whatever the engine (:class:`RunResult`). Imports neither
torch nor numba, so a model-free job can return it on an install without them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the settings in :meth:`RunResult.row` (and :meth:`sfg.GridResult.rows`), in this order
ROW_SETTINGS = ("kind", "rule", "process", "seed", "n_clients", "rounds")


def _engine(cfg: dict[str, Any]) -> str | None:
    from sfg.engines import engine_of
    from sfg.errors import SfgError

    if cfg.get("kind", "train") != "train":
        return str(cfg.get("kind"))
    try:
        return engine_of(cfg)
    except SfgError:
        return None


def _float32(x: Any) -> Any:
    if x is None or (isinstance(x, np.ndarray) and x.dtype == np.float32):
        return x
    if hasattr(x, "detach"):  # a torch tensor (torch is not imported here)
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


@dataclass(repr=False)
class RunResult:
    """What a training run produced, whatever the engine.

    ``metrics`` (named floats), ``curves`` (``acc_mean``/``acc_p10`` against ``round`` and/or
    ``hours``), ``accuracy`` ([N] final personalised test accuracy), ``params`` ([N, D] final
    models), ``personal`` (ditto's personal models or None), ``meta`` (timings, digests, the
    numerics), ``diagnostics`` (or None), for the rounds ``state`` (the final staleness state)
    and ``weights_log``, and ``extra``: an engine's own JSON-able parts (a swarm's ``nodes``,
    ``faults``, ``replay``…). Readable as a mapping too: ``res["metrics"]``, ``res["nodes"]``
    (an ``extra`` key), ``res.get("faults")``. :meth:`summary` is the JSON a command prints."""

    metrics: dict[str, float]
    curves: dict[str, list[float]]
    accuracy: Any
    params: Any = None
    personal: Any = None
    state: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    weights_log: list[np.ndarray] | None = None
    diagnostics: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """One short line: the engine, the run id, the headline metric and the sizes."""
        cfg = self.meta.get("config") or {}
        parts = [f"engine={_engine(cfg)}"] if cfg else []
        if self.meta.get("run_id"):
            parts.append(f"run_id={self.meta['run_id']}")
        for k in ("acc_mean", "premise"):
            if isinstance(self.metrics.get(k), float):
                parts.append(f"{k}={self.metrics[k]:.4f}")
                break
        parts.append(f"{len(self.metrics)} metrics")
        shape = getattr(self.params, "shape", None)
        if shape is not None:
            parts.append(f"params {list(shape)}")
        return f"RunResult({', '.join(parts)})"

    def row(self) -> dict[str, Any]:
        """One flat dict of plain values: ``run_id``, ``engine``, the settings that tell runs
        apart in a table (:data:`ROW_SETTINGS`), then every metric — as
        :meth:`sfg.GridResult.rows` gives per run; ``pandas.DataFrame([r.row() for r in
        results])`` is a table. Needs neither pandas nor torch."""
        cfg = self.meta.get("config") or {}
        out: dict[str, Any] = {"run_id": self.meta.get("run_id"),
                               "engine": _engine(cfg) if cfg else None}
        out.update({k: cfg.get(k) for k in ROW_SETTINGS})
        out.update(self.metrics)
        return out

    def rows(self) -> list[dict[str, Any]]:
        """``[self.row()]``: one run as a table of one row (as :meth:`Results.rows`)."""
        return [self.row()]

    def as_arrays(self) -> RunResult:
        """``params`` and ``personal`` as numpy float32 [N, D] (an engine's torch tensor
        converted once, here); returns this result. What :func:`sfg.run` and :func:`sfg.swarm`
        return."""
        self.params = _float32(self.params)
        self.personal = _float32(self.personal)
        return self

    def __getitem__(self, key: str) -> Any:
        if key in self.extra:
            return self.extra[key]
        if key in self.__dataclass_fields__ and key != "extra":
            return getattr(self, key)
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self.__dataclass_fields__ and key != "extra":
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.extra or (key in self.__dataclass_fields__ and key != "extra"
                                     and getattr(self, key) is not None)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def keys(self) -> list[str]:
        """The parts that are there (fields not None, then ``extra``'s): ``{**res}`` is a
        plain dict of them."""
        return [k for k in self.__dataclass_fields__ if k != "extra" and k in self] + \
            list(self.extra)

    @classmethod
    def from_summary(cls, out: Any) -> RunResult:
        """A result from its JSON (:meth:`summary`'s keys: ``metrics``, ``curves``, and
        ``meta``/``diagnostics`` when there): a stored run, a replay's or the self-test's."""
        return cls(metrics=dict(out["metrics"]), curves=dict(out["curves"]), accuracy=None,
                   meta=dict(out.get("meta") or {}), diagnostics=out.get("diagnostics"))

    def summary(self) -> dict[str, Any]:
        """The JSON-able part: metrics, curves, diagnostics when recorded, and the engine's
        own parts (``extra``)."""
        out: dict[str, Any] = {"metrics": self.metrics, "curves": self.curves}
        if self.diagnostics is not None:
            out["diagnostics"] = self.diagnostics
        return {**out, **self.extra}


class Results:
    """Several runs of one job (``sfg.replay`` over lists of rules, processes or seeds):
    a sequence of :class:`RunResult` with :meth:`rows` for a table."""

    def __init__(self, results: list[RunResult]):
        self.results = list(results)

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per run (:meth:`RunResult.row`): ``pandas.DataFrame(res.rows())``."""
        return [r.row() for r in self.results]

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self):
        return iter(self.results)

    def __getitem__(self, k: int) -> RunResult:
        return self.results[k]

    def __repr__(self) -> str:
        return f"Results({len(self.results)} runs; .rows() for a table)"

