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


@pytest.fixture(scope="session")
def johns(testdata) -> dict[str, list[Path]]:
    """dlib's five "johns": person name -> their 11 aligned 150x150 face chips, sorted."""
    root = testdata / "faces" / "dlib" / "johns"
    people = {p.name: sorted(p.glob("*.jpg")) for p in sorted(root.iterdir()) if p.is_dir()}
    assert len(people) == 5 and all(len(files) == 11 for files in people.values())
    return people


@pytest.fixture(scope="session")
def backend_caches(tmp_path_factory):
    """backend name -> its converted-model cache folder, one per backend for the whole session:
    a backend's tests in tests/backends/ (its own file's and test_parity.py's) convert once."""
    made: dict[str, Path] = {}

    def cache(name: str) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp(f"cache-{name}")
        return made[name]

    return cache


@pytest.fixture
def exit_within_one_wait(monkeypatch):
    """A function of a module that waits on its children's pipes with `select.select`: it makes
    that module's first wait end with nothing ready, but only once the newest child of this
    process has exited (left unreaped for the code under test). The child's last message and its
    exit then both fall between that wait and the check of whether the child still runs: the race
    a loaded machine gives now and then, made certain. Returns the list the first wait appends the
    child's exit to, so that a test can show the race was really run."""
    import select
    from types import SimpleNamespace

    import psutil

    waited: list = []

    def select_after_an_exit(rlist, wlist, xlist, timeout=None):
        if not waited:
            child = max(psutil.Process().children(), key=lambda p: p.create_time())
            waited.append(os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT))
            return [], [], []
        return select.select(rlist, wlist, xlist, timeout)

    def arm(module) -> list:
        monkeypatch.setattr(module, "select", SimpleNamespace(select=select_after_an_exit))
        return waited

    return arm


# What scripts/test-aarch64 runs under emulation, and why: scripts/aarch64/suite.txt (README: "aarch64").
AARCH64_SUITE = REPO / "scripts" / "aarch64" / "suite.txt"


def _matches(nodeid: str, prefix: str) -> bool:
    if "::" not in prefix and prefix.endswith("]"):  # FILE[ID]: the tests of FILE parametrised with id ID
        path, _, param = prefix[:-1].partition("[")
        return nodeid.startswith(path + "::") and nodeid.endswith(f"[{param}]")
    return nodeid == prefix or nodeid.startswith((prefix + "::", prefix + "["))


def _backend_of(item) -> str | None:
    """The backend a test is about: its module's NAME, or its `backend` parameter (tests/backends/test_parity.py)."""
    name = getattr(getattr(item, "module", None), "NAME", None)
    if name is None and hasattr(item, "callspec"):
        name = item.callspec.params.get("backend")
    return name if isinstance(name, str) else None


def pytest_collection_modifyitems(config, items):
    """Marks `native_only` every test AARCH64_SUITE does not select ("+ prefix  why") or excludes
    ("- prefix  why"): the emulated aarch64 run deselects them. A prefix is a node id, a start of
    one ending at "::" or "[", or FILE[ID]: the tests of FILE parametrised with id ID. On aarch64,
    the tests of a backend the Pi install leaves out (their module's NAME or their `backend`
    parameter) are skipped with that backend's own one-line reason (tests of the missing-runtime
    error still run)."""
    import platform

    selected, excluded = [], []
    if AARCH64_SUITE.is_file():
        for line in AARCH64_SUITE.read_text().splitlines():
            sign, _, rest = line.strip().partition(" ")
            prefix, _, why = rest.strip().partition(" ")
            if sign in ("+", "-"):
                (selected if sign == "+" else excluded).append((prefix, why.strip()))
    on_arm = platform.machine().lower() in ("aarch64", "arm64")
    unavailable: dict[str, str | None] = {}
    for item in items:
        why_not = next((why for prefix, why in excluded if _matches(item.nodeid, prefix)), None)
        if why_not is None and not any(_matches(item.nodeid, prefix) for prefix, _ in selected):
            why_not = "not in scripts/aarch64/suite.txt: no platform-dependent part"
        if why_not is not None:
            item.add_marker(pytest.mark.native_only(reason=why_not))
        name = _backend_of(item) if on_arm else None
        if name is not None and not item.name.startswith("test_missing_runtime"):
            from tracker.backends import REGISTRY, availability

            if name in REGISTRY:
                if name not in unavailable:
                    unavailable[name] = availability(name)
                if unavailable[name]:
                    item.add_marker(pytest.mark.skip(reason=f"not in the Raspberry Pi install: {unavailable[name]}"))
