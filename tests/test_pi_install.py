"""Which backends run in this install, checked against what pyproject promises.

On aarch64 the install is the Raspberry Pi's (scripts/setup --pi: extras [pi,test,lint]); everywhere
else it is the full one (extras [all,test] plus scripts/setup-mxnet). Every backend whose runtime the
install's extras provide must be available, and every other one must say why not in one line,
from `tracker --list-backends` without a crash. scripts/test-aarch64 runs this on emulated aarch64:
it is what the README's "runs on the Pi" column is measured by.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import tomllib
from pathlib import Path

from tracker.backends import REGISTRY

REPO = Path(__file__).resolve().parents[1]
ON_ARM = platform.machine().lower() in ("aarch64", "arm64")


def _extras(name: str, table: dict[str, list[str]]) -> set[str]:
    """The extras `name` stands for, following self-references like "tracker[tf,onnx]"."""
    found = {name}
    for requirement in table[name]:
        if requirement.startswith("tracker["):
            for inner in requirement[len("tracker["):requirement.index("]")].split(","):
                found |= _extras(inner.strip(), table)
    return found


def expected_available() -> set[str]:
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    extras = _extras("pi" if ON_ARM else "all", table)
    return {
        name for name, entry in REGISTRY.items()
        # a runtime installed by a project command (MXNet's own venv) exists on x86-64 only
        if (entry.setup is None or not ON_ARM) and (entry.extra is None or entry.extra in extras)
    }


def test_pi_extra_is_a_subset_of_all():
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert _extras("pi", table) - {"pi"} <= _extras("all", table) - {"all"}


def test_every_backend_is_available_or_says_why_in_one_line():
    done = subprocess.run([sys.executable, "-m", "tracker", "--list-backends"], capture_output=True,
                          text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows: dict[str, str] = {}
    for line in done.stdout.splitlines():  # the table's row, not a later line naming a backend
        if line.split() and line.split()[0] in REGISTRY:
            rows.setdefault(line.split()[0], line)
    expected = expected_available()
    for name, entry in REGISTRY.items():
        here = rows[name].split()[1]
        assert here == ("yes" if name in expected else "no"), done.stdout
        if name not in expected:
            # the row ends with the backend's one-line reason: the pip extra that installs its
            # runtime, or why no command can here (MXNet's own venv exists on x86-64 only)
            reason = rows[name].split(maxsplit=4)[-1]
            assert f"backend {name!r}" in reason, rows[name]
            assert (entry.install_hint() if entry.setup is None else "x86-64") in reason, rows[name]
