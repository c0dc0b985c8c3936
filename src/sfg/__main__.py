"""``python -m sfg ...``: the ``sfg`` program (same as the installed command)."""

from sfg.cli.main import entry

if __name__ == "__main__":
    entry()
