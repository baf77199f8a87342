"""OpenBLAS's idle threads sleep soon after a multi-threaded call (`tracker.blas_idle`), in a real
child process on numpy's own OpenBLAS, and the `tracker` command sets that up first."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tracker import blas_idle
from tracker.cli import main
from tracker.machine import cores

REPO = Path(__file__).resolve().parents[1]

# A child that runs GEMMs on every core's thread, then idles for IDLE_S and prints the process CPU
# time spent while idle: OpenBLAS's helper threads polling, if they still do.
IDLE_S = 0.5
CHILD = f"""
import sys, time
if sys.argv[1] == "bound":
    from tracker.blas_idle import bound_idle_spin
    bound_idle_spin()
import numpy as np
a = np.ones((512, 512), np.float32)
for _ in range(5):
    a @ a
start = time.process_time()
time.sleep({IDLE_S})
print(time.process_time() - start)
"""


def idle_cpu_seconds(how: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", CHILD, how], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.skipif(cores() < 2, reason="one core: OpenBLAS starts no helper thread to poll")
def test_idle_blas_threads_stop_polling_once_bounded():
    polling = idle_cpu_seconds("default")
    bounded = idle_cpu_seconds("bound")
    # the default keeps a helper polling for 2**28 counter ticks (about 0.1 s on an x86 TSC, the
    # whole idle time under aarch64 emulation or on a Pi): this shows the measurement sees it
    assert polling > 0.02, f"no polling seen without the bound ({polling:.3f} s CPU while idle)"
    assert bounded < 0.02, f"idle OpenBLAS threads used {bounded:.3f} s CPU in {IDLE_S} s with the bound"


def test_the_bound_is_set_per_machine_and_a_users_own_value_is_kept(monkeypatch):
    for machine, expected in (("x86_64", "20"), ("aarch64", "14"), ("riscv64", None)):
        monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
        monkeypatch.setattr(blas_idle.platform, "machine", lambda m=machine: m)
        blas_idle.bound_idle_spin()
        assert os.environ.get("OPENBLAS_THREAD_TIMEOUT") == expected
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "7")
    monkeypatch.setattr(blas_idle.platform, "machine", lambda: "x86_64")
    blas_idle.bound_idle_spin()
    assert os.environ["OPENBLAS_THREAD_TIMEOUT"] == "7"


def test_the_tracker_command_bounds_it_before_anything_else(monkeypatch):
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    monkeypatch.setitem(blas_idle.IDLE_SPIN_LOG2_TICKS, platform.machine().lower(), 9)
    assert main(["--list-backends"]) == 0
    assert os.environ["OPENBLAS_THREAD_TIMEOUT"] == "9"
    # and nothing the command module imports at its top loads numpy (or cv2: tracker.images) before it
    done = subprocess.run([sys.executable, "-c", "import sys, tracker.cli; print('numpy' in sys.modules, "
                           "'cv2' in sys.modules)"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False False", done.stderr


def test_a_bound_that_is_no_number_is_reported_as_none(monkeypatch):
    """"²" passed str.isdigit and int() refused it: the benchmark's machine record was a traceback."""
    from tracker.machine import blas_info

    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "²")
    assert blas_info()["idle_poll_log2_ticks"] is None
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "20")
    assert blas_info()["idle_poll_log2_ticks"] == 20
