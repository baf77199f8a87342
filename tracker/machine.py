"""What machine the benchmark runs on: CPU model, cores, BLAS, versions, and the sgemm peak.

The sgemm peak is this machine's float32 matrix-multiply throughput through numpy's BLAS on all
cores: the yardstick against which a backend's effective GFLOP/s is stated as a fraction.
"""

from __future__ import annotations

import os
import platform
import sys
import time

# ARM's "CPU part" numbers (implementer 0x41) for the cores a Raspberry Pi or an ARM server has;
# aarch64 kernels print no "model name" line, only these.
_ARM_PARTS = {
    "0xd03": "Cortex-A53",
    "0xd04": "Cortex-A35",
    "0xd05": "Cortex-A55",
    "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72",
    "0xd09": "Cortex-A73",
    "0xd0a": "Cortex-A75",
    "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1",
    "0xd40": "Neoverse-V1",
    "0xd49": "Neoverse-N2",
}


def _cpuinfo() -> dict[str, str]:
    """The first value of each key of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """A human-readable CPU model, e.g. "AMD EPYC" or "Raspberry Pi 3 Model B Rev 1.2 (Cortex-A53)"."""
    info = _cpuinfo()
    if info.get("model name"):
        return info["model name"]
    core = None
    if info.get("CPU implementer") == "0x41":
        part = info.get("CPU part", "")
        core = _ARM_PARTS.get(part, f"ARM part {part}")
    board = info.get("Model")
    if board and core:
        return f"{board} ({core})"
    return board or core or platform.processor() or platform.machine() or "unknown"


def cores() -> int:
    """CPUs this process may run on (the affinity mask, not the host's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_key() -> dict:
    """The identity of a machine for the calibration profile: {"cpu", "cores", "arch"}."""
    return {"cpu": cpu_model(), "cores": cores(), "arch": platform.machine()}


def blas_info() -> dict:
    """numpy's BLAS: name, version, CPU kernel set and thread count (threadpoolctl, then numpy's build config),
    and how long its idle threads poll (OPENBLAS_THREAD_TIMEOUT, see tracker.blas_idle; None: OpenBLAS's default)."""
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "")
    blas: dict[str, str | int | None] = {"name": None, "version": None, "architecture": None, "threads": None,
                                         "idle_poll_log2_ticks": int(timeout) if timeout.isdecimal() else None}
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            if pool.get("user_api") == "blas":
                blas.update(
                    name=pool.get("internal_api"),
                    version=pool.get("version"),
                    architecture=pool.get("architecture"),
                    threads=pool.get("num_threads"),
                )
                break
    except Exception:  # threadpoolctl is best effort; numpy's build config below still names the BLAS
        pass
    if blas["name"] is None:
        try:
            import numpy as np

            build = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
            blas.update(name=build.get("name"), version=build.get("version"))
        except Exception:
            pass
    return blas


def memory_mb(available: bool = False) -> float | None:
    """The machine's memory in MiB, or with available=True what new processes can use now
    (the kernel's MemAvailable); None where psutil cannot tell."""
    try:
        import psutil

        memory = psutil.virtual_memory()
        return round((memory.available if available else memory.total) / 2**20, 1)
    except Exception:
        return None


def sgemm_peak(n: int = 1024, min_seconds: float = 0.5, max_repeats: int = 20) -> dict:
    """float32 n x n matmul through numpy (all BLAS threads), best of at least 3 timed repeats.

    Returns {"gflops", "n", "repeats", "best_s"}; gflops = 2 n^3 / best time / 1e9. n = 1024 is big
    enough for OpenBLAS to reach its peak on a Cortex-A53 and on x86 while staying at 12 MB.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    np.matmul(a, b, out=c)  # warm-up: thread start, page faults
    best = float("inf")
    repeats = 0
    start = time.perf_counter()
    while repeats < 3 or (time.perf_counter() - start < min_seconds and repeats < max_repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
        repeats += 1
    return {"gflops": round(2 * n**3 / best / 1e9, 3), "n": n, "repeats": repeats, "best_s": best}


def machine_info(peak: dict, load_at_start: list[float] | None) -> dict:
    """The results.json "machine" object (see tracker.bench); `load_at_start`: `load_average()`
    as the command began, before any of its own work (the sgemm peak, the detectors) loaded the
    machine."""
    key = machine_key()
    return {
        **key,
        "system": platform.platform(),
        "memory_mb": memory_mb(),
        "blas": blas_info(),
        "sgemm_peak_gflops": peak["gflops"],
        "sgemm": {"n": peak["n"], "repeats": peak["repeats"], "best_s": peak["best_s"]},
        "load_average": {"start": load_at_start, "end": None},
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: how busy the machine was besides the benchmark."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def base_versions() -> dict:
    """Versions of the parent's own parts; runtimes are added per backend by the children."""
    import numpy as np

    import tracker

    return {"python": sys.version.split()[0], "numpy": np.__version__, "tracker": tracker.__version__}
