"""The command of a generated reference page (``python -m sfg.engines OUT``,
``python -m sfg.metrics OUT``): print the page, or write it to OUT."""

from __future__ import annotations

import sys
from collections.abc import Callable


def page_main(markdown: Callable[[], str], argv: list[str]) -> int:
    """Print ``markdown()``, or write it to ``argv[0]``; exit status 0."""
    text = markdown()
    if argv:
        with open(argv[0], "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
