"""`--memory-limit MB`: the memory of a small device, for one benchmark cell's process tree.

A Raspberry Pi 3's limit is physical memory (1 GB), so the cell is capped the way the kernel caps
physical memory: a memory cgroup of its own with the limit (cgroup v2 `memory.max`, or v1
`memory.limit_in_bytes` plus `memory.memsw.limit_in_bytes` so swap does not stretch it), created
under this process's own cgroup, found from the mounts (needs write access there: root, or a
delegated systemd scope).
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


def _hierarchies(mountinfo: str) -> dict[str, tuple[Path, str]]:
    """{"memory" (v1's memory controller) or "" (v2): (its mount point, the hierarchy's path
    mounted there)} from the text of /proc/self/mountinfo. Read from the mounts, not assumed at
    /sys/fs/cgroup: a hybrid host (v1's controllers there, v2 at /sys/fs/cgroup/unified) has a
    tmpfs at /sys/fs/cgroup, where a folder and a file named memory.max can be made but cap nothing."""
    found: dict[str, tuple[Path, str]] = {}
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, fs = before.split(), after.split()  # fs: type, source, super options
        if len(fields) < 5 or len(fs) < 3:
            continue
        root, mount_point = (f.replace("\\040", " ") for f in fields[3:5])
        if fs[0] == "cgroup2":
            found.setdefault("", (Path(mount_point), root))
        elif fs[0] == "cgroup" and "memory" in fs[2].split(","):
            found.setdefault("memory", (Path(mount_point), root))
    return found


def _own_cgroups(cgroup: str) -> dict[str, str]:
    """{controller or "" (v2): this process's group in that hierarchy} from the text of
    /proc/self/cgroup."""
    groups = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                groups[name] = parts[2]
    return groups


def group_folders(mountinfo: str, cgroup: str) -> list[tuple[str, Path]]:
    """[(method, folder of this process's memory cgroup)], v1's first: where a cell's own group
    can be made, from the texts of /proc/self/mountinfo and /proc/self/cgroup."""
    mounts, groups = _hierarchies(mountinfo), _own_cgroups(cgroup)
    folders = []
    for method, key in (("cgroup-v1", "memory"), ("cgroup-v2", "")):
        if key in mounts and key in groups:
            mount_point, root = mounts[key][0], mounts[key][1].rstrip("/")
            group = groups[key]
            if group == root or group.startswith(root + "/"):  # else not visible here
                folders.append((method, mount_point / group[len(root):].lstrip("/")))
    return folders


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


class MemoryCap:
    """A limit of `limit_mb` MiB for one process tree; `method` is "cgroup-v2", "cgroup-v1" or
    "rlimit-as" (the child must then set RLIMIT_AS itself). Call `add(pid)` once the process runs,
    `oom_kills()` after it ended, `close()` always."""

    def __init__(self, limit_mb: int) -> None:
        self.limit_mb = limit_mb
        self.folder: Path | None = None
        self.method = "rlimit-as"
        limit = str(limit_mb * 2**20)
        name = f"tracker-cell-{uuid.uuid4().hex[:12]}"
        limit_files = {"cgroup-v1": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
                       "cgroup-v2": ("memory.max", "memory.swap.max")}
        for method, parent in group_folders(_read("/proc/self/mountinfo"), _read("/proc/self/cgroup")):
            limit_file, swap_file = limit_files[method]
            folder = parent / name
            try:
                folder.mkdir()
            except OSError:
                continue
            try:
                if not (folder / "cgroup.procs").exists():  # the kernel makes it in every cgroup
                    raise OSError(f"{folder} is not a cgroup")
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
