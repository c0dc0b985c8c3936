"""Finished runs of a results store where researchers look at them: TensorBoard and MLflow.

``sfg report --store S --tensorboard DIR`` and ``--mlflow URI`` call this module; in Python::

    from sfg.experiments.report.export import export_runs, to_mlflow, to_tensorboard
    runs = export_runs("results.sqlite")          # one ExportRun per (grid, finished run)
    to_tensorboard(runs, "tb")                     # tensorboard --logdir tb
    to_mlflow(runs, "file:./mlruns")               # mlflow ui --backend-store-uri ./mlruns

What is exported, for every finished (``done``) run of the store and every grid that queued
it (:meth:`sfg.experiments.store.Store.grids`; runs queued without a grid name, as in stores
written before grid names were recorded, are filed under the store's file name without
``.sqlite``):

* **curves** — every curve but ``round`` as ``curve/<name>``, one point per stored value, with
  step = the round it was measured at: the run's ``round`` curve where it has one of the same
  length (training and replay runs), else the position in the curve (selftest runs);
* **final metrics** — ``final/<name>`` at step = the run's ``rounds`` in TensorBoard; under
  their own names (what MLflow's run table shows) in MLflow;
* **what the run is** — its grid, dataset, process, rule, seed, kind and sfg run id, and every
  resolved setting of its configuration (flattened with dots; strings as they are, other
  values as JSON: ``null``, ``true``, ``0.05``).

**TensorBoard**: one run folder per exported run,
``DIR/<grid>/<dataset>/<process>/<rule>/seed=<seed>-<run id, 8 digits>`` (characters other
than letters, digits and ``._,:=+@-`` become ``_``), holding one event file written with the
``tensorboard`` package's record writer: the scalars (TensorBoard keeps them as float32), and
an HParams session (the ``hparams`` plugin) with the identity and settings above, so the
HParams dashboard filters and compares runs by dataset, process, rule, seed and grid. Event
times are the run's finish time, so the same store always gives the same bytes.

**MLflow**: one MLflow experiment per grid (named after it, created when missing) and one
MLflow run per sfg run: run name ``<dataset>/<process>/<rule>/seed=<seed>``, tags ``grid``,
``dataset``, ``process``, ``rule``, ``seed``, ``kind`` and ``sfg_run_id``, parameters = the
flattened settings, metrics as above (timestamps = the run's finish time; start and end time
of the MLflow run = the sfg run's). A ``file:`` URI (or a plain folder path) is a local
MLflow file store; MLflow 3 keeps that backend only on request, so this module sets
``MLFLOW_ALLOW_FILE_STORE=true`` while it writes one (unless it is set already; reading the
store back, ``mlflow ui`` and ``MlflowClient`` need it set too).

**Exporting again adds nothing twice.** TensorBoard: a run whose event file
(``events.out.tfevents.<finish time>.sfg.<run id>``, written under a temporary name and
renamed) is already in its folder is skipped. MLflow: a run whose ``sfg_run_id`` tag is
already on a FINISHED run of the grid's experiment is skipped; one left unfinished by an
interrupted export is deleted and logged again. Both report how many runs they skipped.
Runs added to the store later are exported by the next export; sfg runs never change once
done (the run id is the hash of the configuration), so skipping is safe.

Both need optional packages (``pip install 'sfg[export]'``); without them, and for a folder
or URI that cannot be written, they raise :class:`~sfg.errors.SfgError` (one line).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sfg.errors import SfgError
from sfg.util.atomic import write_via

INSTALL_HINT = "pip install 'sfg[export]'"
CURVE_PREFIX = "curve/"
FINAL_PREFIX = "final/"  # TensorBoard only; MLflow logs final metrics under their names
STEP_CURVE = "round"
TAG_KEYS = ("grid", "dataset", "process", "rule", "seed", "kind", "sfg_run_id")

_SAFE_PATH = re.compile(r"[^A-Za-z0-9._,:=+@-]")
_SAFE_KEY = re.compile(r"[^\w.\- /:]")


@dataclass(frozen=True)
class ExportRun:
    """One finished sfg run as filed under one grid."""

    run_id: str
    grid: str
    dataset: str
    process: str
    rule: str
    seed: int
    config: Mapping[str, Any]
    metrics: Mapping[str, float]
    curves: Mapping[str, Sequence[float]]
    started: float | None = None
    finished: float | None = None

    @property
    def kind(self) -> str:
        return str(self.config.get("kind", "train"))

    @property
    def name(self) -> str:
        """``dataset/process/rule/seed=N`` (the MLflow run name)."""
        return f"{self.dataset}/{self.process}/{self.rule}/seed={self.seed}"

    @property
    def tags(self) -> dict[str, str]:
        """What the run is: grid, dataset, process, rule, seed, kind, sfg run id."""
        return {"grid": self.grid, "dataset": self.dataset, "process": self.process,
                "rule": self.rule, "seed": str(self.seed), "kind": self.kind,
                "sfg_run_id": self.run_id}

    @property
    def params(self) -> dict[str, str]:
        """The resolved settings, flattened (``a.b``), each as a string (see :func:`param_value`)."""
        return {k: param_value(v) for k, v in flatten(self.config).items()}

    @property
    def wall_time(self) -> float:
        """When the run finished (seconds since the epoch); now when the store has no time."""
        return float(self.finished) if self.finished is not None else time.time()

    def final_step(self) -> int:
        """The step final metrics are logged at: the run's ``rounds``, else its last step."""
        rounds = self.config.get("rounds")
        if isinstance(rounds, int) and not isinstance(rounds, bool):
            return rounds
        steps = [s for steps, _ in self.series().values() for s in steps]
        return max(steps, default=0)

    def series(self) -> dict[str, tuple[list[int], list[float]]]:
        """``{curve name: (steps, values)}`` of every curve but ``round`` (see module doc)."""
        return curve_series(self.curves)


@dataclass
class ExportSummary:
    """What one export did: runs written, runs skipped (already there), where."""

    target: str
    where: str
    written: int = 0
    skipped: int = 0
    groups: list[str] = field(default_factory=list)  # grids (folders or experiments) touched

    def line(self) -> str:
        grids = ", ".join(self.groups) or "none"
        return (f"{self.target}: {self.written} runs written to {self.where} (grids: {grids}), "
                f"{self.skipped} already there")


# ------------------------------------------------------------------------------ reading
def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` -> ``{"a.b": 1, "c": 2}`` (keys sorted)."""
    out: dict[str, Any] = {}
    for key in sorted(value):
        v = value[key]
        name = f"{prefix}{key}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out


def param_value(v: Any) -> str:
    """A setting as a parameter string: strings as they are, anything else as JSON."""
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def curve_series(curves: Mapping[str, Sequence[float]]) -> dict[str, tuple[list[int], list[float]]]:
    """Each curve but ``round`` with its steps: ``round``'s values where it fits, else 0, 1, ..."""
    rounds = curves.get(STEP_CURVE)
    usable = rounds is not None and all(
        isinstance(r, (int, float)) and math.isfinite(r) and float(r) == int(r) for r in rounds)
    out = {}
    for name in sorted(curves):
        if name == STEP_CURVE:
            continue
        values = [float(v) for v in curves[name]]
        if usable and len(rounds) == len(values):
            steps = [int(r) for r in rounds]
        else:
            steps = list(range(len(values)))
        out[name] = (steps, values)
    return out


def export_runs(store: Any, *, default_grid: str | None = None) -> list[ExportRun]:
    """The finished runs of ``store`` (a path or an open :class:`Store`), one per grid each.

    ``default_grid``: the grid name of runs queued without one (default: the store file's
    name without its suffix).
    """
    from sfg.experiments.store import Store

    if isinstance(store, Store):
        return _export_runs(store, default_grid or store.path.stem)
    path = Path(store)
    if not path.exists():
        raise SfgError(f"results store {path} does not exist; run `sfg grid run GRID.yaml "
                       f"--store {path}` first")
    with Store(path, create=False, readonly=True) as s:
        return _export_runs(s, default_grid or path.stem)


def _export_runs(store: Any, default_grid: str) -> list[ExportRun]:
    grids = store.grids()
    curves = store.curves()
    out = []
    for r in store.runs("done"):
        for grid in grids.get(r["run_id"]) or [default_grid]:
            out.append(ExportRun(
                run_id=r["run_id"], grid=grid, dataset=str(r["dataset"]),
                process=str(r["process"]), rule=str(r["rule"]), seed=int(r["seed"]),
                config=r["config"], metrics=r["metrics"], curves=curves.get(r["run_id"], {}),
                started=r["started"], finished=r["finished"]))
    return out


def _by_grid(runs: Iterable[ExportRun]) -> dict[str, list[ExportRun]]:
    out: dict[str, list[ExportRun]] = {}
    for run in runs:
        out.setdefault(run.grid, []).append(run)
    return out


def check_available(*, tensorboard: bool = False, mlflow: bool = False) -> None:
    """Raise :class:`SfgError` naming the install when a wanted exporter's package is missing
    (before anything is written)."""
    if tensorboard:
        _tensorboard_modules()
    if mlflow:
        _mlflow_modules()


# --------------------------------------------------------------------------- TensorBoard
def _path_part(text: str) -> str:
    part = _SAFE_PATH.sub("_", str(text)) or "_"
    return "_" * len(part) if set(part) == {"."} else part


def run_folder(run: ExportRun, *, id_digits: int = 8) -> Path:
    """``<grid>/<dataset>/<process>/<rule>/seed=<seed>-<run id>``, relative to the log dir."""
    return Path(*(_path_part(p) for p in (run.grid, run.dataset, run.process, run.rule,
                                          f"seed={run.seed}-{run.run_id[:id_digits]}")))


def event_file_name(run: ExportRun) -> str:
    """``events.out.tfevents.<finish time>.sfg.<run id>``: TensorBoard's pattern, fixed per run."""
    return f"events.out.tfevents.{int(run.wall_time):010d}.sfg.{run.run_id}"


def _hparam(v: Any) -> Any:
    if isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return param_value(v)


def _tensorboard_modules():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import summary_v2 as hparams
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError as e:
        raise SfgError(f"--tensorboard needs the tensorboard package ({e}); install it with "
                       f"{INSTALL_HINT}") from None
    return event_pb2, summary_pb2, hparams, RecordWriter


def _events(run: ExportRun, event_pb2, summary_pb2, hparams) -> list:
    wall = run.wall_time
    events = [event_pb2.Event(wall_time=wall, file_version="brain.Event:2")]
    values = {"grid": run.grid, "sfg_run_id": run.run_id,
              **{k: _hparam(v) for k, v in flatten(run.config).items()}}
    events.append(event_pb2.Event(wall_time=wall, step=0, summary=hparams.hparams_pb(
        values, trial_id=f"{run.grid}/{run.name}/{run.run_id}", start_time_secs=run.started)))
    by_step: dict[int, list] = {}
    for name, (steps, vals) in run.series().items():
        for step, v in zip(steps, vals, strict=True):
            by_step.setdefault(step, []).append(
                summary_pb2.Summary.Value(tag=CURVE_PREFIX + name, simple_value=v))
    for step in sorted(by_step):
        events.append(event_pb2.Event(wall_time=wall, step=step,
                                      summary=summary_pb2.Summary(value=by_step[step])))
    final = [summary_pb2.Summary.Value(tag=FINAL_PREFIX + k, simple_value=float(v))
             for k, v in sorted(run.metrics.items()) if isinstance(v, (int, float))]
    if final:
        events.append(event_pb2.Event(wall_time=wall, step=run.final_step(),
                                      summary=summary_pb2.Summary(value=final)))
    return events


def _write_events(f, run: ExportRun, modules) -> None:
    """The run's event records (:func:`_events`) to the binary file ``f``."""
    event_pb2, summary_pb2, hparams, RecordWriter = modules
    writer = RecordWriter(f)
    for event in _events(run, event_pb2, summary_pb2, hparams):
        writer.write(event.SerializeToString())
    writer.flush()


def to_tensorboard(runs: Iterable[ExportRun], logdir: str | os.PathLike) -> ExportSummary:
    """Write each run's event file under ``logdir`` (see the module doc); skip those present."""
    runs = list(runs)
    modules = _tensorboard_modules()
    root = Path(logdir)
    summary = ExportSummary("tensorboard", str(root))
    if root.exists() and not root.is_dir():
        raise SfgError(f"--tensorboard {root} is a file; give a folder (created if missing)")
    folders: dict[Path, str] = {}
    for run in runs:  # two runs of one cell that share 8 digits of run id: use all 16
        folder = run_folder(run)
        if folders.setdefault(folder, run.run_id) != run.run_id:
            folders[run_folder(run, id_digits=64)] = run.run_id
    for grid, group in _by_grid(runs).items():
        summary.groups.append(grid)
        for run in group:
            folder = run_folder(run)
            if folders.get(folder) != run.run_id:
                folder = run_folder(run, id_digits=64)
            target = root / folder / event_file_name(run)
            if target.exists():
                summary.skipped += 1
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                write_via(target, lambda f, run=run: _write_events(f, run, modules))
            except OSError as e:
                raise SfgError(f"cannot write TensorBoard events under {root} "
                               f"({e.strerror or e}: {e.filename or target}); give a writable "
                               "folder for --tensorboard") from None
            summary.written += 1
    return summary


# -------------------------------------------------------------------------------- MLflow
def tracking_uri(uri: str) -> str:
    """A plain path becomes a ``file://`` URI; anything with a scheme is kept as given."""
    text = str(uri).strip()
    if not text:
        raise SfgError("--mlflow needs a tracking URI such as file:./mlruns or "
                       "http://localhost:5000")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) and not re.match(r"^[A-Za-z]:[\\/]", text):
        return text
    return Path(text).expanduser().resolve().as_uri()


def _file_store_path(uri: str) -> Path | None:
    if not uri.startswith("file:"):
        return None
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise SfgError(f"--mlflow {uri}: a file: URI names a local folder (file:///abs/path "
                       "or file:relative/path), not a host")
    return Path(unquote(parsed.path or "."))


def _check_folder(path: Path, uri: str) -> None:
    if path.exists() and not path.is_dir():
        raise SfgError(f"--mlflow {uri}: {path} is a file; give a folder for the MLflow store")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SfgError(f"--mlflow {uri}: cannot create {path} ({e.strerror or e}); give a "
                       "writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SfgError(f"--mlflow {uri}: {path} is not writable; give a writable folder")


@contextmanager
def _file_store_allowed(local: bool) -> Iterator[None]:
    """``MLFLOW_ALLOW_FILE_STORE=true`` while exporting to a file store, unless already set."""
    if not local or "MLFLOW_ALLOW_FILE_STORE" in os.environ:
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


def _mlflow_modules():
    try:
        from mlflow.entities import Metric, Param, RunStatus, RunTag, ViewType
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        raise SfgError(f"--mlflow needs the mlflow package ({e}); install it with "
                       f"{INSTALL_HINT}") from None
    return MlflowClient, MlflowException, Metric, Param, RunTag, RunStatus, ViewType


def _metric_key(name: str) -> str:
    return _SAFE_KEY.sub("_", name)


def _batches(metrics: list, params: list, tags: list):
    """Chunks within MLflow's log_batch limits (1000 entities, 100 params or tags)."""
    while params or tags:
        p, params = params[:100], params[100:]
        t, tags = tags[:100 - len(p)], tags[100 - len(p):]
        yield [], p, t
    for i in range(0, len(metrics), 1000):
        yield metrics[i:i + 1000], [], []


def _existing(client, experiment_id: str, view_type) -> dict[str, list]:
    """``{sfg run id: [MLflow runs carrying it]}`` in the experiment (active runs)."""
    out: dict[str, list] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], run_view_type=view_type.ACTIVE_ONLY,
                                  max_results=50000, page_token=token)
        for r in page:
            rid = r.data.tags.get("sfg_run_id")
            if rid:
                out.setdefault(rid, []).append(r)
        token = getattr(page, "token", None)
        if not token:
            return out


def _log_run(client, run: ExportRun, experiment_id: str, mods) -> None:
    _, _, Metric, Param, RunTag, RunStatus, _ = mods
    ms = int(run.wall_time * 1000)
    start = int(run.started * 1000) if run.started is not None else ms
    mlrun = client.create_run(experiment_id, start_time=start, tags=run.tags, run_name=run.name)
    rid = mlrun.info.run_id
    metrics = [Metric(_metric_key(k), float(v), ms, 0) for k, v in sorted(run.metrics.items())
               if isinstance(v, (int, float))]
    for name, (steps, vals) in run.series().items():
        key = _metric_key(CURVE_PREFIX + name)
        metrics.extend(Metric(key, v, ms, step) for step, v in zip(steps, vals, strict=True))
    params = [Param(k, v) for k, v in run.params.items()]
    for m, p, t in _batches(metrics, params, []):
        client.log_batch(rid, metrics=m, params=p, tags=t)
    client.set_terminated(rid, status=RunStatus.to_string(RunStatus.FINISHED), end_time=ms)


def to_mlflow(runs: Iterable[ExportRun], uri: str) -> ExportSummary:
    """Log each run to the MLflow tracking store at ``uri`` (see the module doc)."""
    runs = list(runs)
    uri = tracking_uri(uri)
    local = _file_store_path(uri)
    if local is not None:
        _check_folder(local, uri)
    mods = _mlflow_modules()
    MlflowClient, MlflowException = mods[0], mods[1]
    summary = ExportSummary("mlflow", uri)
    with warnings.catch_warnings(), _file_store_allowed(local is not None):
        warnings.simplefilter("ignore", FutureWarning)  # MLflow's notice on the file backend
        try:
            client = MlflowClient(tracking_uri=uri, registry_uri=uri if local else None)
            for grid, group in _by_grid(runs).items():
                summary.groups.append(grid)
                exp = client.get_experiment_by_name(grid)
                if exp is None:
                    experiment_id = client.create_experiment(grid)
                elif exp.lifecycle_stage != "active":
                    raise SfgError(f"--mlflow {uri}: experiment {grid!r} is deleted there; "
                                   f"restore it (mlflow experiments restore --experiment-id "
                                   f"{exp.experiment_id}) or remove it for good first")
                else:
                    experiment_id = exp.experiment_id
                existing = _existing(client, experiment_id, mods[6])
                for run in group:
                    there = existing.get(run.run_id, [])
                    if any(r.info.status == "FINISHED" for r in there):
                        summary.skipped += 1
                        continue
                    for r in there:  # left unfinished by an interrupted export
                        client.delete_run(r.info.run_id)
                    _log_run(client, run, experiment_id, mods)
                    summary.written += 1
        except MlflowException as e:
            text = str(getattr(e, "message", e)).strip()
            if "unsupported URI" in text or "Could not find a registered" in text:
                scheme = uri.split(":", 1)[0]
                raise SfgError(f"--mlflow {uri}: the installed MLflow cannot open {scheme}: "
                               "stores; use file:PATH (a local folder) or http(s)://HOST:PORT "
                               "(a tracking server); database URIs need the full mlflow "
                               "package (pip install mlflow)") from None
            first = text.splitlines()
            raise SfgError(f"--mlflow {uri}: {first[0] if first else type(e).__name__}") from None
        except OSError as e:
            raise SfgError(f"--mlflow {uri}: cannot write the MLflow store "
                           f"({e.strerror or e}: {e.filename or uri})") from None
    return summary
