"""tracker.bench.memory_cap: where a cell's memory cgroup is made, read from the mounts."""

from pathlib import Path

from tracker.bench import memory_cap

# /proc/self/mountinfo and /proc/self/cgroup of a hybrid host (an Intel Xeon VM of this project's):
# v1's controllers under a tmpfs at /sys/fs/cgroup, v2 at /sys/fs/cgroup/unified
HYBRID_MOUNTS = """\
23 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_GROUPS = "4:memory:/process_api/0f35\n1:cpu:/\n0::/\n"


def test_a_hybrid_host_s_groups_are_under_their_own_mounts():
    assert memory_cap.group_folders(HYBRID_MOUNTS, HYBRID_GROUPS) == [
        ("cgroup-v1", Path("/sys/fs/cgroup/memory/process_api/0f35")),
        ("cgroup-v2", Path("/sys/fs/cgroup/unified"))]


def test_a_mount_of_part_of_the_hierarchy_is_read_from_its_root():
    # a container without its own cgroup namespace: its part of the hierarchy mounted, the full path listed
    mounts = "30 25 0:26 /system.slice/box.scope /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
    groups = "0::/system.slice/box.scope/inner\n"
    assert memory_cap.group_folders(mounts, groups) == [("cgroup-v2", Path("/sys/fs/cgroup/inner"))]
    # a group outside the mounted part is not reachable here
    assert memory_cap.group_folders(mounts, "0::/user.slice\n") == []


def test_no_memory_hierarchy_no_folder():
    mounts = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    assert memory_cap.group_folders(mounts, "1:cpu:/\n") == []
    assert memory_cap.group_folders("", "") == []


def test_a_folder_that_is_not_a_cgroup_is_not_taken_for_one(tmp_path, monkeypatch):
    # the tmpfs of a hybrid host lets a folder and a file named memory.max be made: they cap nothing
    monkeypatch.setattr(memory_cap, "group_folders", lambda mountinfo, cgroup: [("cgroup-v2", tmp_path)])
    cap = memory_cap.MemoryCap(256)
    assert cap.method == "rlimit-as" and cap.folder is None
    assert list(tmp_path.iterdir()) == []
    cap.close()
