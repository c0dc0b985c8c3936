"""Running a test's work with a bound on its wall time (a hang fails the test, it never blocks
the suite)."""

from __future__ import annotations

import threading


def bounded(fn, timeout: float = 120.0, hang: str = "the run hangs"):
    """``fn()`` in a thread (its own event loop), failing the test if it runs past
    ``timeout`` seconds (``hang`` says what that means); re-raises what ``fn`` raised."""
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), f"still running after {timeout} s: {hang}"
    if "error" in out:
        raise out["error"]
    return out.get("value")
