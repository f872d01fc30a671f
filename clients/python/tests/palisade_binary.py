"""The ``palisade`` binary the Python tests run: ``$PALISADE_BIN``, else
``target/debug/palisade`` at the repository root. The client's tests and the backend
tests (``tests/backends``) both find it here."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def palisade_bin() -> Path:
    """The binary's path; fails the test, saying how to build it, when it is missing."""
    explicit = os.environ.get("PALISADE_BIN")
    path = Path(explicit) if explicit else REPO_ROOT / "target" / "debug" / "palisade"
    if not path.is_file():
        pytest.fail(
            f"the palisade binary is missing at {path}: run `cargo build -p palisade-cli` "
            "at the repository root, or set PALISADE_BIN",
            pytrace=False,
        )
    return path
