"""The ``sfg`` command line: one module per command (:mod:`~sfg.cli.replay`,
:mod:`~sfg.cli.run`, :mod:`~sfg.cli.grid`, :mod:`~sfg.cli.report`, :mod:`~sfg.cli.net`,
:mod:`~sfg.cli.traces`, :mod:`~sfg.cli.pretrain`, :mod:`~sfg.cli.demo`), the program that
gathers them (:mod:`~sfg.cli.main`) and the console helpers they share
(:mod:`~sfg.cli.console`). Importing this package loads none of them."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The program: exit status 0 success, 1 work failed, 2 bad input (:func:`sfg.cli.main.main`)."""
    from sfg.cli.main import main as run

    return run(argv)


def entry() -> None:
    """The installed ``sfg`` command (:func:`sfg.cli.main.entry`)."""
    from sfg.cli.main import entry as run

    run()
