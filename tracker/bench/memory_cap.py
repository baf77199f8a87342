"""`--memory-limit MB`: the memory of a small device, for one benchmark cell's process tree.

A Raspberry Pi 3's limit is physical memory (1 GB), so the cell is capped the way the kernel caps
physical memory: a memory cgroup of its own with the limit (cgroup v2 `memory.max`, or v1
`memory.limit_in_bytes` plus `memory.memsw.limit_in_bytes` so swap does not stretch it), created
under this process's own cgroup (needs write access there: root, or a delegated systemd scope).
The cell's process is moved in right after it starts; its children (a worker) follow it. Past the
limit the kernel's OOM killer ends the largest process of the cell, which `oom_kills()` reports.

Where no memory cgroup can be made, the fallback is RLIMIT_AS, set by the cell itself: a cap on
virtual address space, which depends on the CPU's thread count and the allocator rather than on
memory used (mxnet-openblas-dl cannot even load under 1024 MB on some machines), so the results
name the method used (`settings.memory_limit_method`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroups() -> dict[str, str]:
    """{controller or "" (v2): path} from /proc/self/cgroup."""
    groups = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                groups[name] = path
    except (OSError, ValueError):
        pass
    return groups


class MemoryCap:
    """A limit of `limit_mb` MiB for one process tree; `method` is "cgroup-v2", "cgroup-v1" or
    "rlimit-as" (the child must then set RLIMIT_AS itself). Call `add(pid)` once the process runs,
    `oom_kills()` after it ended, `close()` always."""

    def __init__(self, limit_mb: int) -> None:
        self.limit_mb = limit_mb
        self.folder: Path | None = None
        self.method = "rlimit-as"
        limit = str(limit_mb * 2**20)
        groups = _own_cgroups()
        name = f"tracker-cell-{uuid.uuid4().hex[:12]}"
        candidates = []
        if "memory" in groups:
            candidates.append(("cgroup-v1", CGROUP_ROOT / "memory" / groups["memory"].lstrip("/") / name,
                               ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")))
        if "" in groups:
            candidates.append(("cgroup-v2", CGROUP_ROOT / groups[""].lstrip("/") / name,
                               ("memory.max", "memory.swap.max")))
        for method, folder, (limit_file, swap_file) in candidates:
            try:
                folder.mkdir()
            except OSError:
                continue
            try:
                (folder / limit_file).write_text(limit)
                if (folder / swap_file).exists():  # v1: memory + swap; v2: swap alone
                    (folder / swap_file).write_text(limit if method == "cgroup-v1" else "0")
            except OSError:
                _remove(folder)
                continue
            self.folder, self.method = folder, method
            break

    def add(self, pid: int) -> None:
        if self.folder is not None:
            (self.folder / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """Processes the OOM killer ended inside the cap (0 under rlimit-as)."""
        if self.folder is None:
            return 0
        for events in ("memory.events", "memory.oom_control"):
            try:
                for line in (self.folder / events).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                continue
        try:  # old v1 kernels have no oom_kill counter: the limit was hit at least
            return int((self.folder / "memory.failcnt").read_text() or 0) and 1
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        if self.folder is not None:
            _remove(self.folder)
            self.folder = None


def _remove(folder: Path) -> None:
    """rmdir a cgroup; processes still in it (none once the cell was reaped) go to its parent first."""
    try:
        for pid in (folder / "cgroup.procs").read_text().split():
            (folder.parent / "cgroup.procs").write_text(pid)
    except OSError:
        pass
    try:
        os.rmdir(folder)
    except OSError:
        pass


def cap_method(limit_mb: int | None) -> str | None:
    """The method a cell under `limit_mb` gets here (None without a limit), for the results."""
    if not limit_mb:
        return None
    cap = MemoryCap(limit_mb)
    cap.close()
    return cap.method
