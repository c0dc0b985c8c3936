"""The ``sfg`` command. Thin: parse, call the library, print (tables for people, --json for scripts).

Every sub-command lives in its own module and is imported here directly (a broken one fails
loudly instead of vanishing from ``--help``); none of them imports this module back. They share
:mod:`sfg.cli.console` for output, errors, progress and the exit status: 0 success, 1 work failed,
2 bad input (one ``error: ...`` line on stderr, never a traceback).

Start-up: the command modules import only typer and :mod:`sfg.cli.console` at import time; each
command imports the library it needs when it runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import typer

from sfg.cli import console
from sfg.cli import grid as grid_cli
from sfg.cli import net as net_cli
from sfg.cli import pretrain as pretrain_cli
from sfg.cli import replay as replay_cli
from sfg.cli import report as report_cli
from sfg.cli import run as run_cli
from sfg.cli import traces as traces_cli

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="sfg — decentralised learning when devices go offline.")



def _version(value: bool) -> None:
    if value:
        from sfg import __version__

        console.echo(f"sfg {__version__}")
        raise typer.Exit(0)


@app.callback()
def _plugins(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="Print sfg's version and exit"),
    plugin: list[str] = typer.Option(
        [], "--plugin", metavar="MODULE",
        help="Import MODULE first: your own rules, datasets, models or outage processes "
             "(repeatable; also SFG_PLUGINS=mod1,mod2; installed packages are found through "
             "their sfg.rules / sfg.datasets / sfg.models / sfg.processes entry points)"),
    no_plugins: bool = typer.Option(
        False, "--no-plugins",
        help="Do not load the installed plugins (entry points); also SFG_NO_PLUGINS=1. "
             "--plugin and SFG_PLUGINS modules still load"),
) -> None:
    import os

    from sfg import plugins

    if no_plugins:
        os.environ[plugins.OFF] = "1"  # the command's child processes too
    plugins.add_to_env(plugin)  # the command's child processes load them too
    # a plugin that fails to import is noted and named by what needs it (sfg rules lists it;
    # an unknown name says so): --help and the built-in names keep working
    plugins.load(plugin, strict=False)


replay_cli.register(app)  # replay, rules, processes


@app.command()
def demo(
    quick: bool = typer.Option(False, help="One seed and 30 rounds: a smoke test of the pipeline"),
    resume: bool = typer.Option(False, help="Keep runs already in sfg-out/demo.sqlite"),
) -> None:
    """The main job on embedded data (no download): pilot, replay, paired grid, report."""
    from sfg.util.extras import require

    require("sfg demo", "torch", "sklearn", "matplotlib")
    from sfg.cli.demo import run_demo

    run_demo(quick=quick, resume=resume)


run_cli.register(app)  # run
report_cli.register(app)  # report
net_cli.register(app)  # swarm, node, tls-ca
pretrain_cli.register(app)  # pretrain
app.add_typer(traces_cli.app, name="traces", help="Real availability traces: stats and plots.")
app.add_typer(grid_cli.app, name="grid", help="Paired experiment grids and the results store.")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit status 0 success, 1 work failed, 2 bad input (see :mod:`sfg.cli.console`)."""
    from sfg.reproducible import problem

    wrong = problem()
    if wrong:
        console.error(wrong)
        return console.BAD_INPUT
    return console.run_app(app, argv, prog_name="sfg")


def entry() -> None:
    """The installed ``sfg`` program: :func:`main`, then the process ends without the
    interpreter's teardown where nothing is left to do in it (:func:`sfg.cli.console.exit_process`)."""
    console.exit_process(main())


if __name__ == "__main__":
    entry()
