"""``python -m sfg.cli``: the ``sfg`` program."""

from sfg.cli.main import entry

if __name__ == "__main__":
    entry()
