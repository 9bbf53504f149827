"""Threads from the CPUs a rank may use: cgroup quotas (v1 and v2) parsed from text, and the split
among ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpudist.cpu import (
    parse_cfs_quota,
    parse_cgroup_paths,
    parse_cpu_max,
    parse_cpuinfo,
    quota_folders,
    usable_cores,
)
from cpudist.errors import BadInput
from cpudist.hosts.doctor import compare, usable_text
from cpudist.launch.env import EnvSpec, node_env
from cpudist.train.threads import CpuShare, pinned_threads, threads_for
from tests.harness.quota import cpu_controller_version

V1 = """12:cpuset:/
4:memory:/process_api/92fbe2444184548e8913cb4a01dd125e
2:cpu,cpuacct:/slurm/uid_0/job_7
0::/
"""


def env_spec(cores: int, ppn: int, backend: str, **more: object) -> EnvSpec:
    """A node's rank environment inputs on host h0 (keywords: EnvSpec takes no positions)."""
    return EnvSpec(physical_cores=cores, ppn=ppn, backend=backend, master_addr="h0", master_port=1,
                   hub_offline=False, **more)  # type: ignore[arg-type]


def test_cgroup_paths_of_v1_and_v2() -> None:
    paths = parse_cgroup_paths(V1)
    assert paths["cpu"] == paths["cpuacct"] == "/slurm/uid_0/job_7"
    assert paths["memory"].startswith("/process_api/") and paths[""] == "/"
    assert parse_cgroup_paths("0::/user.slice/app.scope\n") == {"": "/user.slice/app.scope"}


def test_quota_text() -> None:
    assert parse_cfs_quota("5000\n", "10000\n") == 0.5
    assert parse_cfs_quota("-1", "100000") is None
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("max 100000") is None


@given(st.integers(1, 10**7), st.integers(1000, 10**6))
def test_v1_and_v2_agree(quota: int, period: int) -> None:
    assert (parse_cpu_max(f"{quota} {period}\n") == parse_cfs_quota(str(quota), str(period))
            == quota / period)


def test_quota_folders_walk_up_to_the_mount() -> None:
    folders = quota_folders({"cpu": "/a/b", "": "/x"}, Path("/cg"))
    assert folders[:3] == [Path("/cg/cpu/a/b"), Path("/cg/cpu/a"), Path("/cg/cpu")]
    assert Path("/cg/x") in folders and Path("/cg/unified/x") in folders and Path("/cg") in folders


@pytest.mark.parametrize(("cores", "quota", "usable"),
                         [(2, None, 2), (2, 0.5, 1), (8, 2.5, 3), (2, 16.0, 2)])
def test_usable_cores(cores: int, quota: float | None, usable: int) -> None:
    assert usable_cores(cores, quota) == usable


def test_cpuinfo_names_the_cores_it_counts() -> None:
    text = "\n\n".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i // 2}\n"
                       for i in range(4))
    assert parse_cpuinfo(text).core_ids == {"0:0", "0:1"}  # 2 hyperthreads per core
    assert parse_cpuinfo(text, allowed={2, 3}).core_ids == {"0:1"}


def share(host: str, cores: str, quota: float | None = None) -> CpuShare:
    return CpuShare(host, frozenset(f"0:{c}" for c in cores.split(",")), quota)


def test_threads_follow_the_node_each_rank_is_on() -> None:
    """A whole node, a node whose ranks run under `taskset -c 0`, a node held to half a core by its
    cgroup."""
    full, pinned, quota = share("a", "0,1"), share("b", "0"), share("c", "0,1", 0.5)
    everyone = [full, pinned, quota]
    assert [threads_for(s, everyone) for s in everyone] == [2, 1, 1]


def test_ranks_of_a_node_split_its_cores() -> None:
    shared = [share("a", "0,1,2,3"), share("a", "0,1,2,3")]
    assert threads_for(shared[0], shared) == 2
    bound = [share("a", "0,1"), share("a", "2,3")]  # a launcher bound each rank to its own cores
    assert threads_for(bound[0], bound) == 2
    assert threads_for(shared[0], [*shared, share("a", "0,1,2,3")]) == 1  # 3 ranks on 4 cores
    # a 2-CPU quota
    assert threads_for(share("a", "0,1,2,3", 2.0), [share("a", "0,1,2,3", 2.0)] * 2) == 1
    assert threads_for(shared[0], shared, allotted=1) == 1  # Slurm granted one CPU per task


def test_a_pinned_count_wins() -> None:
    # cpudist's own launch
    assert pinned_threads({"CPUDIST_THREADS": "auto", "OMP_NUM_THREADS": "7"}) is None
    assert pinned_threads({"CPUDIST_THREADS": "3"}) == 3
    assert pinned_threads({"OMP_NUM_THREADS": "5"}) == 5  # a rank started by hand
    assert pinned_threads({}) is None
    with pytest.raises(BadInput):
        pinned_threads({"CPUDIST_THREADS": "0"})


def test_launcher_env_lets_ranks_decide_unless_pinned() -> None:
    assert node_env(env_spec(8, 2, "gloo"))["CPUDIST_THREADS"] == "auto"
    env = node_env(env_spec(8, 2, "gloo", overrides=(("OMP_NUM_THREADS", "3"),)))
    assert env["CPUDIST_THREADS"] == env["OMP_NUM_THREADS"] == "3"


def test_doctor_flags_a_node_with_fewer_usable_cores() -> None:
    head = {"cpu": {"model": "X", "flags": [], "physical_cores": 2}, "usable_cores": 2,
            "cpu_quota": None}
    node = {**head, "usable_cores": 1, "cpu_quota": 0.5}
    assert compare(head, node, None) == ("1 usable cores != head's 2 (cgroup quota 0.5 CPUs)",)
    assert compare(head, head, None) == ()
    assert usable_text(node) == "1 (cgroup quota 0.5 CPUs)" and usable_text(head) == "2"


PROC_CGROUPS = ("#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
                "cpuset\t3\t1\t1\n"
                "cpu\t{h}\t1\t{e}\n"
                "memory\t4\t65\t1\n")


def test_which_cgroup_version_holds_the_cpu_controller() -> None:
    """The end-to-end quota tests (tests/integration/test_threads_cgroup.py) pick the real hierarchy
    from this."""
    assert cpu_controller_version(PROC_CGROUPS.format(h=1, e=1)) == 1  # v1 mounts it (this machine)
    # left to the unified hierarchy
    assert cpu_controller_version(PROC_CGROUPS.format(h=0, e=1)) == 2
    assert cpu_controller_version(PROC_CGROUPS.format(h=0, e=0)) is None  # cgroup_disable=cpu
    assert cpu_controller_version("#subsys_name\thierarchy\tnum_cgroups\tenabled\n") is None
