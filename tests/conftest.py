"""Shared test fixtures: where the shared test data lives, and the default model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTDATA = REPO.parent / "shared" / "testdata"


@pytest.fixture(scope="session")
def testdata() -> Path:
    """`../shared/testdata`; skipped with a reason where it is absent, but never in CI."""
    if not TESTDATA.is_dir():
        if os.environ.get("CI"):
            raise RuntimeError(f"shared test data missing at {TESTDATA}; CI must have it")
        pytest.skip(f"shared test data not found at {TESTDATA}")
    return TESTDATA
