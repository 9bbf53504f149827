"""A cgroup that holds the processes started in it to a CPU quota, on the hierarchy that has the cpu
controller.

The kernel binds each controller to one hierarchy: a cgroup v1 one (`cpu.cfs_quota_us` under
/sys/fs/cgroup/cpu, as this development machine mounts it) or the cgroup v2 one (`cpu.max`, at
/sys/fs/cgroup on a v2-only machine such as stock Debian 12, or at /sys/fs/cgroup/unified on a
hybrid one). /proc/cgroups says which: its cpu row's hierarchy column is that of a v1 hierarchy, or
0 when no v1 hierarchy has the controller, which leaves it to v2. A machine can test one of the two
for real.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the kernel's default period


def cpu_controller_version(proc_cgroups: str | None = None) -> int | None:
    """1 when a cgroup v1 hierarchy holds the cpu controller, 2 when it is left to cgroup v2, None:
    no such controller (or it is disabled)."""
    if proc_cgroups is None:
        try:
            proc_cgroups = Path("/proc/cgroups").read_text()
        except OSError:
            return None
    for line in proc_cgroups.splitlines():
        fields = line.split()  # subsys_name hierarchy num_cgroups enabled
        if len(fields) == 4 and fields[0] == "cpu":
            if fields[3] != "1":
                return None
            return 1 if fields[1] != "0" else 2
    return None


def v2_mount(root: Path = CGROUP_ROOT) -> Path | None:
    """The cgroup2 mount that offers the cpu controller: /sys/fs/cgroup (v2 only) or its `unified`
    (hybrid)."""
    for mount in (root, root / "unified"):
        controllers = mount / "cgroup.controllers"
        if controllers.is_file() and "cpu" in controllers.read_text().split():
            return mount
    return None


def quota_unavailable(version: int, root: Path = CGROUP_ROOT) -> str | None:
    """Why a group with a cgroup v`version` CPU quota cannot be made here, or None when it can.

    A reason starting "cgroup v1 holds the cpu controller" (for v2) or "cgroup v2 holds the cpu
    controller" (for v1) says the machine has the other one; tests/conftest.py lets CI skip on
    exactly that.
    """
    holder = cpu_controller_version()
    if holder is None:
        return "this kernel has no cpu cgroup controller (/proc/cgroups)"
    if holder != version:
        return (f"cgroup v{holder} holds the cpu controller on this machine (/proc/cgroups), so "
                f"cgroup v{version} cannot have it: a kernel binds a controller to one hierarchy")
    if version == 1 and not (root / "cpu" / "cpu.cfs_quota_us").is_file():
        return f"cgroup v1 has the cpu controller but it is not mounted at {root / 'cpu'}"
    if version == 2:
        mount = v2_mount(root)
        if mount is None:
            return f"no cgroup2 mount at {root} or {root / 'unified'} offers the cpu controller"
        try:  # child groups get the controller only where the parent passes it on (idempotent)
            (mount / "cgroup.subtree_control").write_text("+cpu")
        except OSError as e:
            return (f"the cgroup2 root at {mount} will not pass the cpu controller to child groups "
                    f"({e}): it holds processes of its own (a container's cgroup)")
    return None


@dataclass(frozen=True)
class QuotaGroup:
    """A cgroup named `name` at the top of the cpu controller's hierarchy, held to `cores` CPUs."""

    name: str
    cores: float
    version: int
    root: Path = CGROUP_ROOT

    @property
    def folder(self) -> Path:
        if self.version == 1:
            return self.root / "cpu" / self.name
        mount = v2_mount(self.root)
        if mount is None:
            raise RuntimeError(str(quota_unavailable(2, self.root)))
        return mount / self.name

    def create(self) -> QuotaGroup:
        """Make the group and set its quota (a reason from quota_unavailable() must be None
        first)."""
        quota = round(self.cores * PERIOD_US)
        self.folder.mkdir()
        try:
            if self.version == 1:
                (self.folder / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.folder / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (self.folder / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        except BaseException:
            self.folder.rmdir()
            raise
        return self

    def join_argv(self, argv: list[str]) -> list[str]:
        """`argv` behind a shell that joins the group first: everything it starts is held to the
        quota."""
        return ["sh", "-c", f'echo $$ > "{self.folder}/cgroup.procs" && exec "$@"', "quota", *argv]

    def join(self, pid: int) -> None:
        (self.folder / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Move whatever is still in the group to its parent, then delete it."""
        if not self.folder.is_dir():
            return
        for pid in (self.folder / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # gone meanwhile
                (self.folder.parent / "cgroup.procs").write_text(pid)
        self.folder.rmdir()

    def mount_command(self) -> str:
        """Shell that mounts this hierarchy at /sys/fs/cgroup in a mount namespace that has none (a
        namespace host from `ip netns exec`), laid out as a machine with this cgroup version has it,
        so its ranks read the quota."""
        if self.version == 1:
            return ("mount -t tmpfs cgroup_root /sys/fs/cgroup && mkdir /sys/fs/cgroup/cpu && "
                    "mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu")
        return "mount -t cgroup2 cgroup2 /sys/fs/cgroup"
