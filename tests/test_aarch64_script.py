"""scripts/test-aarch64's "cannot emulate here" verdict: exit 77 and one line naming the reason; and
the pytest command it runs in the emulated root.

These run the real script, which stops at its precondition checks (before it installs, mounts or
downloads anything), or past them with stubs for what would build, mount or enter the root. They
are native_only: they test the x86-64 host side of the emulation, and inside the emulated root the
script would see a native aarch64 machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test-aarch64"
CANNOT_EMULATE = 77
PREFIX = "test-aarch64: cannot emulate aarch64 on this machine: "

pytestmark = pytest.mark.native_only


def _run(env_extra: dict[str, str], tmp_path: Path, **kwargs) -> tuple[subprocess.CompletedProcess, str]:
    reason_file = tmp_path / "reason"
    env = {"PATH": os.environ["PATH"], "TRACKER_AARCH64_REASON_FILE": str(reason_file),
           "TRACKER_AARCH64_CACHE": str(tmp_path / "cache"), **env_extra}
    proc = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, **kwargs)
    reason = reason_file.read_text() if reason_file.exists() else ""
    return proc, reason


def _expected_reason(missing: Path) -> str:
    if os.getuid() != 0:
        return "needs root to mount and chroot (running as uid"
    return f"no qemu-aarch64 emulator at TRACKER_AARCH64_QEMU={missing} (expected an executable qemu-aarch64-static)"


def test_missing_qemu_is_one_line_and_exit_77(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "qemu-aarch64-static"
    proc, reason = _run({"TRACKER_AARCH64_QEMU": str(missing)}, tmp_path)
    assert proc.returncode == CANNOT_EMULATE, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(PREFIX + _expected_reason(missing))
    assert proc.stdout == ""
    # The same line for .ci/run to repeat loudly.
    assert reason == lines[0] + "\n"
    # A precondition failure touches nothing: no cache directory, no root.
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to another uid needs root; as non-root the test above covers it")
def test_without_root_is_one_line_and_exit_77() -> None:
    # pytest's tmp_path sits under a 0700 directory; nobody needs one it can write to.
    with tempfile.TemporaryDirectory() as shared:
        Path(shared).chmod(0o777)
        reason_file = Path(shared) / "reason"
        # setpriv (util-linux) runs the script as nobody, with no way back to root: the script must
        # name the missing privilege rather than fail on its first mount.
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(SCRIPT)],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TRACKER_AARCH64_REASON_FILE": str(reason_file)},
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == CANNOT_EMULATE, proc.stderr
        assert proc.stderr.splitlines() == [
            PREFIX + "needs root to mount and chroot (running as uid 65534; sudo -n is not available)"
        ]
        assert reason_file.read_text() == proc.stderr


# -- the pytest command it runs in the root: the script inside its mount namespace (TRACKER_AARCH64_NS
# set: past the host's checks), on a scratch checkout whose root builder, mounts and chroot are stubs

def _stub(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)


def _pytest_arguments(tmp_path: Path, *args: str) -> list[str]:
    """The arguments `scripts/test-aarch64 ARGS` hands pytest in the emulated root."""
    checkout = tmp_path / "checkout"
    for name in ("test-aarch64", "aarch64/common.sh", "lib/not-copied.sh"):
        (checkout / "scripts" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SCRIPT.parent / name, checkout / "scripts" / name)
    _stub(checkout / "scripts" / "aarch64" / "build-root", 'mkdir -p "$1/etc" && echo built=now > "$1/etc/tracker-aarch64-root"\n')
    bin_dir = tmp_path / "bin"
    for tool in ("mount", "cp"):  # the host's files into the root, and the mounts
        _stub(bin_dir / tool, "exit 0\n")
    _stub(bin_dir / "id", "echo 0\n")
    _stub(bin_dir / "uname", "echo x86_64\n")
    _stub(bin_dir / "chroot", 'printf "%s\\n" "$@" > "$CALLS"\n')
    calls = tmp_path / "chroot-args"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TRACKER_AARCH64_NS": "1", "TRACKER_AARCH64_CACHE": str(tmp_path / "cache"),
           "CALLS": str(calls)}
    proc = subprocess.run([str(checkout / "scripts" / "test-aarch64"), *args], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    chrooted = calls.read_text().splitlines()
    return chrooted[chrooted.index("test-aarch64") + 1:]  # after bash -c's $0


def test_extra_arguments_narrow_the_aarch64_selection_and_an_own_m_replaces_it(tmp_path: Path) -> None:
    """`scripts/test-aarch64 -k caffe`, the header's own example, replaced `-m "not native_only"`: it
    ran caffe's native-only tests under emulation too."""
    assert _pytest_arguments(tmp_path / "none") == ["-m", "not native_only"]
    assert _pytest_arguments(tmp_path / "k", "-k", "caffe") == ["-m", "not native_only", "-k", "caffe"]
    assert _pytest_arguments(tmp_path / "m", "-k", "caffe", "-m", "native_only") == ["-k", "caffe", "-m", "native_only"]
    assert _pytest_arguments(tmp_path / "m2", "-mnative_only") == ["-mnative_only"]
