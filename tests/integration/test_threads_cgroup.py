"""A rank sizes its threads from its cgroup's CPU quota, end to end: `cpudist run` started inside a
cgroup held to fewer CPUs than this machine has, and the rank's thread count read back from
result.json.

cgroup v1 (`cpu.cfs_quota_us`) and v2 (`cpu.max`, stock Debian 12 has only v2) are each tested with
a real group and the kernel's own files, but a kernel gives the cpu controller to one hierarchy only
(tests/harness/quota.py): a machine runs one of the two and skips the other, a skip CI accepts only
where the other version holds the controller (tests/conftest.py). So that cpu.max is read end to end
on every machine, one more test builds a v2-only machine's layout in a private mount namespace: a
real cgroup2 mount at /sys/fs/cgroup and a real group the run joins (so the rank's /proc/self/cgroup
is the kernel's), where only the group's cpu.max file is supplied (a tmpfs over the group's folder),
since no cgroup2 group has one where v1 holds the controller. That file is read, not enforced: the
kernel's throttling is not what cpudist does. Needs root.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.harness.machine import physical_cores
from tests.harness.quota import PERIOD_US, QuotaGroup, quota_unavailable
from tests.integration.helpers import CPUDIST

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroups, mounts)")]


def quota_below_the_cores() -> tuple[float, int]:
    """A fractional quota one and a half CPUs under the cores this process may use, and the threads
    a rank held to it should run (rounded up: 0.5 of a CPU still runs a thread); the rank would run
    one more without it."""
    cores = physical_cores()
    if cores < 2:
        pytest.skip("needs 2 physical cores to tell a held rank from a free one; this process may "
                    f"use {cores}")
    quota = cores - 1.5
    return quota, math.ceil(quota)


def run_argv(shared_data: Path, out: Path) -> list[str]:
    return [*CPUDIST, "run", "mrpc", "--np", "1", "--data-dir", str(shared_data / "glue" / "MRPC"),
            "--model", "tiny", "--max-steps", "1", "--no-eval", "--output-dir", str(out)]


def threads_of(out: Path) -> list[int]:
    return list(json.loads((out / "result.json").read_text())["rank_threads"])


def run_in(group: QuotaGroup, shared_data: Path, out: Path) -> list[int]:
    group.create()
    try:
        r = subprocess.run(group.join_argv(run_argv(shared_data, out)), capture_output=True,
                           text=True, timeout=300, stdin=subprocess.DEVNULL)
    finally:
        group.remove()
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return threads_of(out)


@pytest.mark.parametrize("version", [1, 2])
def test_a_ranks_threads_follow_its_cgroup_quota(shared_data: Path, tmp_path: Path,
                                                 version: int) -> None:
    why = quota_unavailable(version)
    if why is not None:
        pytest.skip(why)
    quota, expected = quota_below_the_cores()
    group = QuotaGroup(f"cpudist-thr{version}-{os.getpid()}", quota, version)
    assert run_in(group, shared_data, tmp_path / "run") == [expected]


V2_LAYOUT = """
set -eu
# a v2-only machine's layout; v1's cpu mount is gone from this namespace
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir "/sys/fs/cgroup/$GROUP"
rc=0
sh -c 'echo $$ > "/sys/fs/cgroup/$GROUP/cgroup.procs" &&
       mount -t tmpfs cpu-max "/sys/fs/cgroup/$GROUP" &&
       echo "$CPU_MAX" > "/sys/fs/cgroup/$GROUP/cpu.max" &&
       exec "$@"' run "$@" || rc=$?
umount "/sys/fs/cgroup/$GROUP"
rmdir "/sys/fs/cgroup/$GROUP"
exit $rc
"""


def test_cpu_max_of_a_ranks_v2_group_sizes_its_threads(shared_data: Path, tmp_path: Path) -> None:
    """cpu.max at the rank's own v2 group, where /proc/self/cgroup's `0::/GROUP` line leads (see the
    docstring)."""
    quota, expected = quota_below_the_cores()
    env = {**os.environ, "GROUP": f"cpudist-thrv2-{os.getpid()}",
           "CPU_MAX": f"{round(quota * PERIOD_US)} {PERIOD_US}"}
    out = tmp_path / "run"
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", V2_LAYOUT,
                        "v2",
                        *run_argv(shared_data, out)], capture_output=True, text=True, timeout=300,
                       env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert threads_of(out) == [expected]  # a rank that missed the file would run expected + 1
