"""The real data shared beside the project: ``../shared/data`` from the project root (CI has
the same path; ``SFG_SHARED_DATA`` names another folder). It is not part of the project, so a
test that reads it is marked :func:`needs` and, where a file is absent, is skipped with the
reason; a test whose point is not the real data writes its own small file instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("SFG_SHARED_DATA")
            or Path(__file__).resolve().parents[1].parent / "shared" / "data")
FLASH = DATA / "flash" / "flash_state_traces_subset.json"
STUNNER = DATA / "stunner"
STUNNER_100 = STUNNER / "peersim_session_100.txt"
STUNNER_80 = STUNNER / "peersim_session_80.txt"
CIFAR10_JPEG = DATA / "cifar10-jpeg" / "cifar10_jpeg_q75_raw.tar.gz"
FEMNIST = DATA / "femnist-leaf" / "femnist_leaf_niid_05_json.tar.gz"


def needs(*paths: Path) -> pytest.MarkDecorator:
    """Skip the test, naming what is missing, unless every one of ``paths`` exists."""
    missing = [str(p) for p in paths if not p.exists()]
    return pytest.mark.skipif(bool(missing), reason="needs the shared data, absent here: "
                              + ", ".join(missing) + " (../shared/data beside the project, "
                              "or SFG_SHARED_DATA)")


def require(*paths: Path) -> None:
    """In a fixture or a test: skip, naming what is missing, unless every one of ``paths``
    exists."""
    mark = needs(*paths)
    if mark.args[0]:
        pytest.skip(mark.kwargs["reason"])
