"""What every ``sfg`` sub-command prints, and how it ends: output, errors, progress, exit status.

One module, imported by every command module, so that they all behave alike:

* **Output.** Tables for people (:func:`table`, :func:`show`) on stdout, JSON for scripts
  (:func:`print_json`: strict JSON, NaN and infinities as ``null``). The rich consoles here have
  markup turned off: every string is printed literally, so a rule name, path or message that
  contains ``[red]`` or ``[/x]`` prints as written (styles are given explicitly, never as
  markup in text).
* **Errors.** :func:`error` writes exactly one line, ``error: <message>``, to stderr.
* **Progress.** :func:`progress` (a bar) and :func:`spinner`, on stderr and only on a terminal,
  for work that takes long enough to need them.
* **Exit status**, one convention for every command (:func:`run_app`): ``0`` success, ``1`` the
  work failed (:class:`WorkFailed`, e.g. a grid with failed or pending runs), ``2`` bad input
  (:class:`sfg.errors.SfgError`, a missing file, a usage error, an optional part not installed:
  the line names the extra, :mod:`sfg.util.extras`), ``130`` interrupted. A bad input
  never prints a traceback.

Start-up matters (a command imports only what it uses): this module imports nothing heavy at
import time; rich is loaded on first use and typer only inside :func:`run_app`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sfg.errors import SfgError

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table

OK = 0
FAILED = 1
BAD_INPUT = 2
INTERRUPTED = 130


class WorkFailed(Exception):
    """The input was fine but the work did not succeed (failed or pending runs).

    :func:`run_app` prints ``error: <message>`` and exits with status 1.
    """

    def __init__(self, message: str):
        super().__init__(one_line(message))


def one_line(text: object) -> str:
    """``text`` as a single line (newlines and runs of blanks become one space)."""
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------- consoles
_consoles: dict[str, Console] = {}


def stdout() -> Console:
    """The console for results (stdout). Piped output is 200 columns wide, so tables are
    not squeezed to 80; markup is off (text prints literally)."""
    if "out" not in _consoles:
        from rich.console import Console

        _consoles["out"] = Console(width=None if sys.stdout.isatty() else 200, markup=False,
                                   highlight=False, emoji=False)
    return _consoles["out"]


def stderr() -> Console:
    """The console for errors, notes and progress (stderr); markup off."""
    if "err" not in _consoles:
        from rich.console import Console

        _consoles["err"] = Console(stderr=True, markup=False, highlight=False, emoji=False)
    return _consoles["err"]


# ------------------------------------------------------------------------------- output
def echo(text: object = "") -> None:
    """One literal line on stdout."""
    print(text, file=sys.stdout, flush=True)


def caption(text: object) -> None:
    """A literal, dimmed line on stdout under a table (legends, footnotes)."""
    stdout().print(str(text), style="dim", soft_wrap=True)


def note(text: object) -> None:
    """A literal, dimmed remark on stderr (e.g. ``wrote plot.png``)."""
    if sys.stderr.isatty():
        stderr().print(str(text), style="dim", soft_wrap=True)
    else:
        print(text, file=sys.stderr, flush=True)


def error(message: object) -> None:
    """Exactly one line, ``error: <message>``, on stderr; the message printed literally."""
    text = one_line(message)
    if sys.stderr.isatty():
        from rich.text import Text

        line = Text("error:", style="bold red")
        line.append(" " + text)
        stderr().print(line, soft_wrap=True)
    else:
        print(f"error: {text}", file=sys.stderr, flush=True)


def fmt(v: Any) -> str:
    """A table cell: floats to 3 decimals (whole numbers >= 10 without), NaN as an en dash."""
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        if v.is_integer() and abs(v) >= 10:
            return f"{v:.0f}"
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def table(title: str | None = None, columns: Sequence[str | tuple[str, str]] = (), *,
          caption: str | None = None, rows: Sequence[Sequence[Any]] = (),
          overflow: str = "ellipsis") -> Table:
    """A rich table with literal title, caption and cells.

    ``columns``: names, or ``(name, justify)`` pairs (``"right"`` for numbers). ``rows`` are
    added with :func:`fmt`; add more with ``t.add_row(*cells)`` (the consoles print strings
    literally, so any text is safe in a cell).
    """
    from rich.table import Table

    t = Table(title=title, caption=caption, title_justify="left")
    for col in columns:
        name, justify = (col, "left") if isinstance(col, str) else col
        t.add_column(name, justify=justify, overflow=overflow)  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*(fmt(c) for c in row))
    return t


def show(renderable: Any) -> None:
    """Print a table (or any rich renderable, or a string, literally) on stdout."""
    stdout().print(renderable)


def jsonable(v: Any) -> Any:
    """Strict JSON values: NaN and infinities become null (json.dumps would write NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (str, int, bool)) or v is None:
        return v
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        return jsonable(v.item())
    return str(v)


def dumps_json(v: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text of ``v`` (see :func:`jsonable`)."""
    return json.dumps(jsonable(v), indent=indent, allow_nan=False)


def print_json(v: Any, *, indent: int | None = 2) -> None:
    """Strict JSON of ``v`` on stdout."""
    echo(dumps_json(v, indent=indent))


# ------------------------------------------------------------------------------- progress
def interactive() -> bool:
    """Whether stderr is a terminal (progress bars and spinners show only then)."""
    return sys.stderr.isatty()


@contextmanager
def progress(description: str, *, enabled: bool = True
             ) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while the block runs; yields ``update(done, total)``.

    Yields ``None`` (no bar) when disabled or when stderr is not a terminal, so that logs and
    pipes stay clean; callers pass the yielded value on as their ``progress`` callback.
    """
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=stderr(),
                  transient=True) as prog:
        task = prog.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        yield update


@contextmanager
def spinner(message: str, *, enabled: bool = True) -> Iterator[None]:
    """A spinner with ``message`` on stderr while the block runs (terminal only)."""
    if not enabled or not sys.stderr.isatty():
        yield
        return
    with stderr().status(message):
        yield


# ------------------------------------------------------------------------------- exit status
def _usage_line(e: Exception) -> str:
    """One line for a command-line usage error (unknown option, bad value, missing argument)."""
    msg = one_line(e.format_message()) if hasattr(e, "format_message") else one_line(e)
    ctx = getattr(e, "ctx", None)
    path = getattr(ctx, "command_path", None) or "sfg"
    return f"{msg} (see '{path} --help')"


def _command_path(command: Any, args: Sequence[str], prog_name: str) -> str:
    """``sfg grid run``: the program and the sub-commands that ``args`` name."""
    words = [prog_name]
    for a in args:
        sub = getattr(command, "commands", {}).get(a)
        if sub is None:
            break
        words.append(a)
        command = sub
    return " ".join(words)


def _flags_as_flags(command: Any) -> None:
    """Show on/off options as flags in ``--help`` (``--json``, not ``--json <bool>``, which
    suggests a value): no type column for them, ``--help`` included."""
    for p in getattr(command, "params", ()):
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    made = command.get_help_option

    def help_option(ctx: Any) -> Any:
        opt = made(ctx)
        if opt is not None and opt.metavar is None:
            opt.metavar = ""
        return opt

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _flags_as_flags(sub)


def _notices_as_notes() -> None:
    """Print each :class:`sfg.errors.SfgNotice` (a setting adjusted so a small run runs) as
    one ``note: ...`` line on stderr, once per message."""
    import warnings

    from sfg.errors import SfgNotice

    warnings.filterwarnings("default", category=SfgNotice)
    shown = warnings.showwarning
    if getattr(shown, "sfg_notes", False):
        return  # already in place (a second command in this process)

    def show(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, SfgNotice):
            note(f"note: {message}")
        else:
            shown(message, category, filename, lineno, file, line)

    show.sfg_notes = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def run_app(app: Any, argv: Sequence[str] | None = None, *, prog_name: str = "sfg") -> int:
    """Run a typer app with the one exit-status convention; returns the status.

    0 success; 1 :class:`WorkFailed` (or a command that exits with 1); 2 bad input
    (:class:`SfgError`, a missing or unreadable input file, a usage error); 130 interrupted.
    Errors are one ``error: ...`` line on stderr, never a traceback. Exceptions that are none
    of these are bugs and propagate with their traceback.
    """
    import typer

    command = typer.main.get_command(app)
    _flags_as_flags(command)
    _notices_as_notes()
    try:
        from sfg.util.safety import check_repeated_options

        check_repeated_options(command, list(sys.argv[1:] if argv is None else argv))
        rv = command.main(args=list(argv) if argv is not None else None, prog_name=prog_name,
                          standalone_mode=False)
    except SfgError as e:
        error(e)
        return BAD_INPUT
    except WorkFailed as e:
        error(e)
        return FAILED
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        if e.filename is None:
            raise
        why = {FileNotFoundError: "file not found", IsADirectoryError: "a folder, not a file",
               NotADirectoryError: "not a folder", PermissionError: "permission denied"}
        error(f"{why[type(e)]}: {e.filename}; check the path")
        return BAD_INPUT
    except (KeyboardInterrupt, typer.Abort):
        error("interrupted; results already written are kept")
        return INTERRUPTED
    except ImportError as e:  # an optional part not installed: name its extra (sfg.util.extras)
        from sfg.util.extras import missing_extra

        args = list(sys.argv[1:] if argv is None else argv)
        missing = missing_extra(e, _command_path(command, args, prog_name))
        if missing is None:
            raise
        error(missing)
        return BAD_INPUT
    except Exception as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `sfg` or `sfg grid` alone: help, then error
            ctx = getattr(e, "ctx", None)
            if ctx is not None:
                echo(ctx.get_help())
            error(f"missing command; choose one of the commands above "
                  f"(see '{getattr(ctx, 'command_path', prog_name)} --help')")
            return BAD_INPUT
        if hasattr(e, "exit_code") and hasattr(e, "format_message"):  # a click usage error
            error(_usage_line(e))
            code = int(e.exit_code)
            return code if code in (OK, FAILED, BAD_INPUT) else BAD_INPUT
        raise
    if isinstance(rv, int) and not isinstance(rv, bool):  # typer.Exit(code) is *returned* here
        return rv
    return OK


# Components whose objects do work when the interpreter frees them (an SQLite connection
# checkpoints its write-ahead log and removes the -wal/-shm files; Ray, gRPC and ZeroMQ close
# sockets and stop helper processes): when one is loaded, the process exits the usual way.
_TEARDOWN_MATTERS = ("sqlite3", "ray", "grpc", "zmq")


def exit_process(code: int) -> None:
    """End the ``sfg`` program with ``code``, skipping the interpreter's teardown when nothing
    is left to do in it.

    First, what a normal exit does for the program's results, in the same order as CPython's
    own shutdown: non-daemon threads are joined (thread pools finish their queued work), the
    ``atexit`` handlers run (multiprocessing and temporary folders are cleaned up), stdout and
    stderr are flushed. Then ``os._exit``: what is skipped is freeing every module and object,
    with torch's and LLVM's C++ destructors, about 0.6 s of a default ``sfg run`` with nothing
    left to write (measured: whole process 3.85 s → 3.2 s). When a component of
    ``_TEARDOWN_MATTERS`` is loaded, when stdout cannot be flushed, or where the interpreter
    lacks the hooks, this is a plain ``sys.exit(code)``. Only the installed program calls it
    (:func:`sfg.cli.main.entry`); :func:`run_app` and ``sfg.cli.main.main`` return the status.

    ``threading._shutdown`` and ``atexit._run_exitfuncs`` are the interpreter's internals
    (:mod:`sfg.util.internals`, ``fast-exit``): used only where both are there, functions;
    otherwise, and under ``SFG_PUBLIC_API=1``, the plain ``sys.exit(code)``."""
    import atexit
    import os
    import threading

    from sfg.util import internals

    shutdown = getattr(threading, "_shutdown", None)
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if any(name in sys.modules for name in _TEARDOWN_MATTERS):
        sys.exit(code)
    if internals.taken("fast-exit", internals.forced() or not callable(shutdown)
                       or not callable(run_exitfuncs)):
        sys.exit(code)
    try:
        shutdown()
        run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:  # noqa: BLE001 - e.g. a closed pipe: the usual exit reports it
        sys.exit(code)
    os._exit(code)
