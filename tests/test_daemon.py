"""sd_notify helpers against a real AF_UNIX datagram socket bound by the test (what systemd does)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tracker import daemon

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setattr(daemon, "_last_watchdog", float("-inf"))
    yield sock
    sock.close()


def received(sock) -> list[bytes]:
    """Every datagram waiting on the socket (without blocking after the first)."""
    out = [sock.recv(4096)]
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096))
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
        sock.settimeout(10)
    return out


def test_ready_status_stopping(notify_socket):
    assert daemon.ready("camera up,\nbackend caffe-openblas-dl")
    assert daemon.status("9.8 fps, 2 tracks")
    assert daemon.stopping()
    assert received(notify_socket) == [
        b"READY=1\nSTATUS=camera up, backend caffe-openblas-dl",  # the newline cannot start a new field
        b"STATUS=9.8 fps, 2 tracks",
        b"STOPPING=1",
    ]


def test_watchdog_is_rate_limited_to_half_the_interval(notify_socket, monkeypatch):
    assert not daemon.watchdog()  # no WATCHDOG_USEC: systemd armed no watchdog
    monkeypatch.setenv("WATCHDOG_USEC", str(3600 * 10**6))  # an hour: the 2nd call is surely within 30 min
    assert daemon.watchdog_interval_s() == 3600.0
    assert daemon.watchdog()
    assert not daemon.watchdog()
    assert received(notify_socket) == [b"WATCHDOG=1"]
    monkeypatch.setattr(daemon, "_last_watchdog", float("-inf"))
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # armed for another process: not us
    assert daemon.watchdog_interval_s() is None and not daemon.watchdog()
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert daemon.watchdog()
    assert received(notify_socket) == [b"WATCHDOG=1"]


def test_a_ping_the_full_queue_refused_is_sent_at_the_next_call(notify_socket, monkeypatch):
    """The refused ping counted as sent: the next was held back for half the interval, so the last
    one delivered was a whole interval old when it came, and systemd killed a working guard."""
    monkeypatch.setenv("WATCHDOG_USEC", str(3600 * 10**6))
    while daemon.status("a slow reader"):  # the datagram queue fills
        pass
    assert not daemon.watchdog()
    received(notify_socket)  # the reader catches up
    assert daemon.watchdog()
    assert received(notify_socket) == [b"WATCHDOG=1"]


def test_abstract_namespace_socket(monkeypatch):
    name = f"tracker-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert daemon.ready()
        assert sock.recv(4096) == b"READY=1"


def test_no_notify_socket_means_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    assert not daemon.ready("x") and not daemon.status("x") and not daemon.stopping() and not daemon.watchdog()


def test_a_vanished_socket_is_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert daemon.ready() is False  # nothing raised: a lost notification must not stop the guard


def test_notifications_from_a_child_process_environment(notify_socket, tmp_path):
    """As under systemd: the variables come from the environment of a freshly started process."""
    env = {**os.environ, "WATCHDOG_USEC": str(3600 * 10**6), "PYTHONPATH": str(REPO)}
    code = "from tracker import daemon; daemon.ready('up'); daemon.watchdog(); daemon.watchdog(); daemon.stopping()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert received(notify_socket) == [b"READY=1\nSTATUS=up", b"WATCHDOG=1", b"STOPPING=1"]


# -- systemd/tracker.service and scripts/install-pi ------------------------------------------------

UNIT = REPO / "systemd" / "tracker.service"


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_unit_declares_notify_watchdog_restart_policy_and_sandbox():
    s = unit_settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"] and int(s["WatchdogSec"][0]) > 0
    assert s["Restart"] == ["on-failure"] and s["RestartPreventExitStatus"] == ["2 3"]  # no loop on a config error or missing runtime
    assert s["KillMode"] == ["mixed"]  # SIGTERM to the guard alone: it closes its worker after the last batch
    assert s["User"] == ["tracker"] and s["SupplementaryGroups"] == ["video"] and s["StateDirectory"] == ["tracker"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert s[key] == ["yes"], key
    assert s["ProtectSystem"] == ["strict"] and s["CapabilityBoundingSet"] == [""]
    assert s["SystemCallFilter"][0] == "@system-service"
    assert set(s["RestrictAddressFamilies"][0].split()) <= {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert "char-video4linux rw" in s["DeviceAllow"] and s["DevicePolicy"] == ["closed"]


def _analyze(tmp_path, text: str, *args: str) -> subprocess.CompletedProcess:
    unit = tmp_path / "tracker.service"
    unit.write_text(text)
    return subprocess.run(["systemd-analyze", *args, str(unit)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    # verify insists that ExecStart exists: point it at this checkout's console script
    text = UNIT.read_text().replace("/opt/tracker/venv/bin/tracker", str(REPO / ".venv" / "bin" / "tracker"))
    result = _analyze(tmp_path, text, "verify")
    assert result.returncode == 0 and result.stderr.strip() == "" and result.stdout.strip() == "", result.stderr
    # the same check does object to a mistake (so the empty output above means something)
    broken = _analyze(tmp_path, text.replace("Restart=on-failure", "Restart=sometimes"), "verify")
    assert "restart specifier" in broken.stderr


def test_systemd_analyze_security_exposure_below_2(tmp_path):
    result = _analyze(tmp_path, UNIT.read_text(), "security", "--offline=true")
    line = [ln for ln in result.stdout.splitlines() if "Overall exposure level" in ln]
    assert line, result.stdout + result.stderr
    score = float(line[0].split(":")[1].split()[0])
    print(line[0])
    assert score < 2.0


def _install_pi(*args: str, shared: str | None = None, checkout: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRACKER_SHARED_DIR"}
    if shared is not None:
        env["TRACKER_SHARED_DIR"] = shared
    return subprocess.run(["bash", str(checkout / "scripts" / "install-pi"), *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_install_script_dry_run_lists_every_step():
    result = _install_pi("--dry-run", "--no-start")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for step in ("apt-get install", "python3-picamera2", "useradd --system", "--groups video tracker",
                 "chmod -R u=rwX,go=rX /opt/tracker/src.new", "venv --clear --system-site-packages /opt/tracker/venv",
                 "pip install --quiet -e /opt/tracker/src[mqtt,litert,bench,camera]",
                 "--check-config --config /etc/tracker/tracker.yaml", "/etc/systemd/system/tracker.service",
                 "systemctl enable tracker.service", "rm -f /etc/systemd/system/tracker.service.d/shared-data.conf"):
        assert step in out, step
    # the check sees the environment and the working directory (/) the unit gives the guard, not the caller's
    assert "runuser -u tracker -- env -i -C / PATH=" in out and "TRACKER_SHARED_DIR" not in out
    assert "systemctl restart" not in out  # --no-start
    bad = _install_pi("--frobnicate")
    assert bad.returncode == 2 and "unknown option '--frobnicate'" in bad.stderr


def test_install_script_refuses_extras_without_a_list_in_one_line():
    """`--extras` at the end exited 1 with bash's own message (line 34: 2: ...)."""
    for args in (["--extras"], ["--extras", "--dry-run"], ["--extras", "mqtt,,onnx", "--dry-run"]):
        refused = _install_pi(*args)
        value = args[1] if len(args) > 1 else ""
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr == (f"install-pi: --extras '{value}' is not a comma-separated list of pip extras; "
                                  "expected e.g. --extras mqtt,onnx\n")
    assert "pip install --quiet -e /opt/tracker/src[mqtt,onnx,camera]" in _install_pi("--dry-run", "--extras", "mqtt,onnx").stdout
    # pip only warns about an unknown extra: a typo installed the rest without onnxruntime
    refused = _install_pi("--dry-run", "--extras", "mqtt,onxx")
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert refused.stderr.startswith("install-pi: --extras: 'onxx' is not an extra of this project; expected some of "
                                     "tf,litert,onnx,") and refused.stderr.count("\n") == 1


def test_install_script_help_prints_its_usage():
    """--help was "unknown option '--help'", exit 2."""
    shown = _install_pi("--help")
    assert shown.returncode == 0 and shown.stderr == ""
    assert shown.stdout.startswith("Installs the guard as a systemd service on a Raspberry Pi")
    assert "sudo scripts/install-pi --extras mqtt,onnx" in shown.stdout and "set -euo" not in shown.stdout


def test_install_script_dry_run_says_it_would_write_the_config():
    """It said "wrote /etc/tracker/tracker.yaml", though a dry run writes nothing."""
    out = _install_pi("--dry-run").stdout
    assert " wrote " not in out
    if not Path("/etc/tracker/tracker.yaml").exists():
        assert "install-pi: would write /etc/tracker/tracker.yaml" in out


def test_install_script_hands_the_callers_shared_data_to_the_check_and_the_unit(tmp_path):
    shared = "/usr"  # a folder the service sees on any machine (a dry run only reads its name)
    out = _install_pi("--dry-run", "--no-start", shared=str(shared)).stdout
    check = next(line for line in out.splitlines() if "--check-config" in line)
    assert "env -i -C / PATH=" in check and f"TRACKER_SHARED_DIR={shared} " in check
    assert "write /etc/systemd/system/tracker.service.d/shared-data.conf" in out
    for value, expected in ((str(tmp_path / "missing"), "is not an existing folder"), ("shared", "is not an existing folder"),
                            ("/home", "is hidden from the service"), ("/tmp", "is hidden from the service"),
                            ("/usr/../var/tmp", "is hidden from the service")):
        refused = _install_pi("--dry-run", shared=value)
        assert refused.returncode == 2 and f"TRACKER_SHARED_DIR '{value}' {expected}" in refused.stderr, refused.stderr
        assert refused.stdout == ""  # refused before any step


def test_install_script_copies_the_project_and_not_the_checkouts_environments_and_caches(tmp_path):
    """It copied all but .venv, .git, bench-out and train-work: .venv-mxnet (300 MB), the caches,
    build/ and *.egg-info went to /opt/tracker/src too (355 MB for 14 MB of project)."""
    checkout = tmp_path / "checkout"
    project = ["pyproject.toml", "scripts/install-pi", "scripts/lib/not-copied.sh", "tracker/__init__.py",
               "tests/test_cache.py", "models/a.caffemodel"]
    other = [".git/HEAD", ".venv/bin/python", ".venv-mxnet/bin/python", "tracker/__pycache__/x.pyc", ".pytest_cache/v",
             ".ruff_cache/v", ".mypy_cache/v", ".hypothesis/v", "build/lib/x.py", "tracker.egg-info/PKG-INFO",
             "bench-out/x", "train-work/x", "test-artifacts/x", ".cache/x"]
    for name in project + other:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("x")
    for script in ("install-pi", "lib/not-copied.sh"):
        (checkout / "scripts" / script).write_text((REPO / "scripts" / script).read_text())
    out = _install_pi("--dry-run", "--no-start", checkout=checkout).stdout
    # the copy the dry run shows, run into an archive of the test's
    tar = next(line[2:].split() for line in out.splitlines() if line.startswith(f"+ tar -C {checkout} "))
    archive = tmp_path / "src.tar"
    tar[tar.index("-cf") + 1] = str(archive)
    subprocess.run(tar, check=True, timeout=60)
    listed = subprocess.run(["tar", "-tf", str(archive)], capture_output=True, text=True, check=True, timeout=60).stdout
    copied = {name.removeprefix("./") for name in listed.splitlines() if not name.endswith("/")}
    assert copied == set(project)




def test_install_script_refuses_to_run_from_the_tree_it_replaces(tmp_path):
    """Run from /opt/tracker/src (its own install, or a clone put there), it moved that tree to
    src.old, deleted it with its .git and .venv, and stopped at `install systemd/tracker.service`:
    a relative path in a folder that was gone. Run on copies whose prefix is a folder of the test's."""
    prefix = tmp_path / "opt" / "tracker"
    script = (REPO / "scripts" / "install-pi").read_text()
    assert script.count("\nprefix=/opt/tracker\n") == 1
    script = script.replace("\nprefix=/opt/tracker\n", f"\nprefix={prefix}\n")
    for checkout in (prefix / "src", prefix / "src.old", tmp_path / "elsewhere"):
        for name in ("pyproject.toml", "scripts/lib/not-copied.sh"):
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            (checkout / name).write_text((REPO / name).read_text())
        (checkout / "scripts" / "install-pi").write_text(script)
    (tmp_path / "link").symlink_to(prefix / "src")
    for checkout in (prefix / "src", prefix / "src.old", tmp_path / "link"):
        refused = _install_pi("--dry-run", checkout=checkout)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr == (f"install-pi: run from '{checkout}', which it replaces with the copy it installs; "
                                  "expected a checkout elsewhere (e.g. git clone into ~/tracker)\n")
    elsewhere = _install_pi("--dry-run", checkout=tmp_path / "elsewhere")
    assert elsewhere.returncode == 0, elsewhere.stderr
    # the unit and the config come from the tree installed, not from the folder the script is run in
    assert f"install -m 0644 {prefix}/src/systemd/tracker.service " in elsewhere.stdout

def test_install_script_makes_the_units_state_and_cache_directories():
    """/var/cache/tracker was left to systemd's CacheDirectory=, which makes it at the first start
    only: after `--no-start` the README's commands as the service's user had no cache to write."""
    s = unit_settings()
    out = _install_pi("--dry-run", "--no-start").stdout
    for kind, parent in (("State", "/var/lib"), ("Cache", "/var/cache")):
        (name,), (mode,) = s[f"{kind}Directory"], s[f"{kind}DirectoryMode"]
        assert f"+ install -d -m {mode} -o tracker -g tracker {parent}/{name}\n" in out, kind


def _service_user_commands() -> list[list[str]]:
    """The README's commands as the service's user (`sudo -u tracker env ...`), split as the shell splits them."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines() if line.lstrip().startswith("sudo -u tracker env ")]


def test_readme_runs_the_service_users_commands_in_the_units_environment():
    """The README's benchmark as the service's user set STATE_DIRECTORY alone: the converted models'
    cache went to that user's home, which it has none of, and every converting backend failed in a
    benchmark that exited 0. Its enroll was a shorthand, `... tracker enroll alice photos/`."""
    unit_env = dict(pair.split("=", 1) for value in unit_settings()["Environment"] for pair in value.split())
    folders = {name: value.replace("%C", "/var/cache") for name, value in unit_env.items() if "%C" in value}
    assert set(folders) == {"TRACKER_CACHE_DIR", "MPLCONFIGDIR"}
    tracker = "/opt/tracker/venv/bin/tracker"
    commands = _service_user_commands()
    assert [command[command.index(tracker) + 1:] for command in commands] == [
        ["--config", "/etc/tracker/tracker.yaml", "--backend", "all", "--benchmark", "--out", "/var/lib/tracker/bench"],
        ["enroll", "alice", "photos/", "--config", "/etc/tracker/tracker.yaml"]]
    for command in commands:
        assigned = dict(word.split("=", 1) for word in command[len("sudo -u tracker env".split()):command.index(tracker)])
        assert assigned == {"STATE_DIRECTORY": "/var/lib/tracker", **folders}, command

@pytest.mark.timeout(30)
def test_a_reader_that_never_reads_does_not_block_the_guard(tmp_path, monkeypatch):
    address = str(tmp_path / "slow.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        sent = [daemon.status(f"frame {i}") for i in range(100)]  # far beyond the datagram queue
    assert sent[0] is True and sent[-1] is False
