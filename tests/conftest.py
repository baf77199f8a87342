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


# Tests scripts/test-aarch64 leaves out under emulation, with the reason for each: one
# "node-id-prefix  reason" a line in scripts/aarch64/native-only.txt (README: "aarch64").
NATIVE_ONLY_LIST = REPO / "scripts" / "aarch64" / "native-only.txt"


def pytest_collection_modifyitems(config, items):
    """Marks `native_only` every test NATIVE_ONLY_LIST names (a node id, or a prefix of one ending
    at a `::` or a `[`); on aarch64, skips the tests of a backend the Pi install leaves out, with the
    backend's own one-line reason (tests of the missing-runtime error itself still run)."""
    import platform

    entries = []
    if NATIVE_ONLY_LIST.is_file():
        for line in NATIVE_ONLY_LIST.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                prefix, _, reason = line.strip().partition(" ")
                entries.append((prefix, reason.strip()))
    on_arm = platform.machine().lower() in ("aarch64", "arm64")
    unavailable: dict[str, str | None] = {}
    for item in items:
        for prefix, reason in entries:
            if item.nodeid == prefix or item.nodeid.startswith((prefix + "::", prefix + "[")):
                item.add_marker(pytest.mark.native_only(reason=reason))
        name = getattr(getattr(item, "module", None), "NAME", None) if on_arm else None
        if isinstance(name, str) and not item.name.startswith("test_missing_runtime"):
            from tracker.backends import REGISTRY, availability

            if name in REGISTRY:
                if name not in unavailable:
                    unavailable[name] = availability(name)
                if unavailable[name]:
                    item.add_marker(pytest.mark.skip(reason=f"not in the Raspberry Pi install: {unavailable[name]}"))
