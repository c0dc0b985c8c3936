"""One error type for bad input: a one-line message that says what is wrong and how to fix it."""

from __future__ import annotations


class SfgError(ValueError):
    """Bad input (unknown name, parameter out of range, malformed file...).

    The CLI prints ``error: <message>`` and exits with status 2; no traceback.
    Messages are a single line and name the fix.
    """

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split("\n")))


def check(condition: bool, message: str) -> None:
    """Raise :class:`SfgError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise SfgError(message)


class SfgNotice(UserWarning):
    """A setting adjusted so that a small run can run (the graph's k at small N, an outage
    target that N × T cannot resolve): one line naming the value used. The CLI prints it as
    ``note: ...`` on stderr; in Python it is a warning of this category."""


def notice(message: str) -> None:
    """Issue one :class:`SfgNotice` line (see there)."""
    import warnings

    warnings.warn(" ".join(str(message).split("\n")), SfgNotice, stacklevel=2)
