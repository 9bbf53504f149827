"""Pure parts of the miniature cluster: how hosts are laid on cores, what each cgroup gets, the tbf
spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.capped import HostCap, cgroup_version, group_settings, layout, tbf_spec


def test_whole_cores_give_each_host_its_own() -> None:
    assert layout(1.0, [0, 1]) == [HostCap("0", 10_000), HostCap("1", 10_000)]
    assert layout(2, [0, 1, 2, 3, 4]) == [HostCap("0,1", 20_000), HostCap("2,3", 20_000)]


def test_half_cores_put_two_hosts_on_each_core_with_half_a_quota() -> None:
    caps = layout(0.5, [0, 1])
    assert [c.cpus for c in caps] == ["0", "0", "1", "1"]
    assert {c.cores for c in caps} == {0.5}


@pytest.mark.parametrize("bad", [1.5, 0.3])
def test_shares_that_do_not_divide_cores_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="cores per host"):
        layout(bad, [0, 1])


def test_v1_and_v2_settings() -> None:
    cap, root = HostCap("1", 5_000), Path("/cg")
    v1 = dict(group_settings(1, "g", cap, root))
    assert (v1[root / "cpuset/g/cpuset.cpus"] == "1"
            and v1[root / "cpu/g/cpu.cfs_quota_us"] == "5000")
    assert v1[root / "cpu/g/cpu.cfs_period_us"] == "10000"
    v2 = group_settings(2, "g", cap, root)
    # controllers enabled before the group's files
    assert v2[0] == (root / "cgroup.subtree_control", "+cpu +cpuset")
    assert dict(v2)[root / "g/cpu.max"] == "5000 10000" and dict(v2)[root / "g/cpuset.cpus"] == "1"


def test_tbf_burst_holds_a_gso_packet_and_two_ms_at_the_rate() -> None:
    assert tbf_spec(1.0) == "tbf rate 1000000kbit burst 250000 latency 20ms"
    assert "burst 65536 " in tbf_spec(0.1)


def test_cgroup_version_is_read_from_the_mounted_controllers(tmp_path: Path) -> None:
    v1, v2, neither = tmp_path / "v1", tmp_path / "v2", tmp_path / "neither"
    for f in ("cpu/cpu.cfs_quota_us", "cpuset/cpuset.cpus"):
        (v1 / f).parent.mkdir(parents=True, exist_ok=True)
        (v1 / f).write_text("")
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    neither.mkdir()
    # a hybrid machine's unified tree: no cpu here
    (neither / "cgroup.controllers").write_text("io memory\n")
    assert [cgroup_version(p) for p in (v1, v2, neither)] == [1, 2, None]
