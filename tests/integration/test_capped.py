"""The miniature cluster (tests/harness/capped.py): each host gets exactly its share of a core, and
its link its rate.

Needs root and cgroup cpu+cpuset controllers (v1 here; v2 elsewhere); run under the CPU lock, since
it measures CPU shares: `flock /tmp/cpudist-cpu.lock pytest tests/integration/test_capped.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.capped import CappedCluster, capped_requirements
from tests.harness.machine import cpus_on_distinct_cores
from tests.harness.steal import CpuWindow
from tests.integration.helpers import read_until, wait_for

# alone: it measures CPU shares, so nothing else may run beside it (README's test command runs it
# after the rest).
pytestmark = [pytest.mark.alone,
              pytest.mark.skipif(capped_requirements() is not None,
                                 reason=str(capped_requirements()))]

# two CPUs of different physical cores: hyperthreads of one core share it
CORES = cpus_on_distinct_cores()[:2]
LINK_GBPS = 1.0
BUSY = [sys.executable, "-c", "while True: pass"]
RECEIVER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 5001))
print("ready", flush=True)
conn, _ = server.accept()
received, first = 0, None
while chunk := conn.recv(1 << 20):
    first = first or time.perf_counter()
    received += len(chunk)
print(received, time.perf_counter() - first)
"""
SENDER = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], 5001))
chunk, end = b"x" * (1 << 20), time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    conn.sendall(chunk)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CappedCluster]:
    if len(CORES) < 2:
        pytest.skip(f"the half-core layout needs 2 cores; this process may use {CORES}")
    c = CappedCluster(4, tmp_path_factory.mktemp("capped"), prefix=f"mct{os.getpid() % 10000}",
                      cores_per_host=0.5, link_gbps=LINK_GBPS, cores=tuple(CORES))
    c.up()
    try:
        yield c
    finally:
        c.down()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_shares(cluster: CappedCluster, hosts: list[int],
                wall_s: float = 2.0) -> tuple[list[float], dict[int, float], str]:
    """Cores a busy loop gets on each of `hosts`, all running at once, over `wall_s` of wall time;
    each core's stolen fraction over the same interval; and a note of what else took the cores, for
    a failure's message.

    A host's group weighs as much as ten ordinary processes (tests/harness/capped.py), so the
    machine's other work barely slows it; on a machine this busy it does (here, with other jobs
    keeping ~5 processes a core runnable, the two hosts of a core got 0.75 to 0.84 of it), and the
    note says what the cores ran besides the hosts ("others"), which the steal guard does not cover:
    run these tests on a machine of their own.
    """
    # sh and nsenter exec: same PID
    loops = [subprocess.Popen(cluster.exec_argv(i, BUSY)) for i in hosts]
    try:
        # Python's start-up takes a few tens of ms of CPU: a loop past 0.2 s is spinning.
        wait_for(lambda: all(cpu_seconds(p.pid) > 0.2 for p in loops), 30, "the busy loops to spin",
                 lambda: [cpu_seconds(p.pid) for p in loops])
        with CpuWindow() as cpu:
            before, start = [cpu_seconds(p.pid) for p in loops], time.monotonic()
            time.sleep(wall_s)  # the interval measured, not a wait
            after, wall = [cpu_seconds(p.pid) for p in loops], time.monotonic() - start
    finally:
        for p in loops:
            p.kill()
            p.wait()
    shares = [(b - a) / wall for a, b in zip(before, after, strict=True)]
    cores = {host_core(i) for i in hosts}
    others = {c: round(cpu.busy[c]
                       - sum(s for s, i in zip(shares, hosts, strict=True) if host_core(i) == c), 3)
              for c in cores}
    note = f"{cpu}; others per core {others}"
    print(note)
    return shares, cpu.steal, note


def host_core(i: int) -> int:
    return CORES[i // 2]  # the half-core layout: hosts 0,1 on the first core, 2,3 on the second


def test_a_half_core_host_gets_half_a_core(cluster: CappedCluster) -> None:
    (share,), steal, note = core_shares(cluster, [0])
    # The core is otherwise free: the quota, not the core, caps it (unless the hypervisor took over
    # half).
    assert share == pytest.approx(min(0.5, 1 - steal[host_core(0)]), abs=0.05), note


def test_hosts_sharing_a_core_do_not_slow_each_other(cluster: CappedCluster) -> None:
    shares, steal, note = core_shares(cluster, [0, 1, 2, 3])  # two per core
    # Each gets half of its core: of all of it on a machine of its own; of what the hypervisor left
    # on a shared one (a CI run, 1.6x slower than this machine throughout, got 0.41 and 0.32 per
    # host: 18% and 36% of its two cores missing; it did not yet record the steal that would say
    # why).
    expected = [0.5 * (1 - steal[host_core(i)]) for i in range(4)]
    assert shares == pytest.approx(expected, abs=0.05), note
    assert max(shares) <= 0.5 + 0.05  # the quota caps each host


def test_each_host_runs_on_its_own_cpuset(cluster: CappedCluster) -> None:
    expected = [{CORES[0]}, {CORES[0]}, {CORES[1]}, {CORES[1]}]
    show = "import os, json; print(json.dumps(sorted(os.sched_getaffinity(0))))"
    for i in range(4):
        r = cluster.run(i, [sys.executable, "-c", show])
        assert r.returncode == 0, r.stderr
        assert set(json.loads(r.stdout)) == expected[i]


def test_what_sshd_starts_is_in_its_hosts_group(cluster: CappedCluster) -> None:
    for i in (1, 3):  # logged in from host 0, as a launcher does
        r = cluster.run(0, ["ssh", "-i", str(cluster.user_key), "-o", "BatchMode=yes", "-o",
                            "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
                            "LogLevel=ERROR", cluster.name(i), "cat /proc/self/cgroup"], timeout=30)
        assert r.returncode == 0, r.stderr
        groups = dict(line.split(":", 2)[1:] for line in r.stdout.splitlines())
        assert groups["cpu"] == groups["cpuset"] == f"/{cluster.group(i)}"


def test_a_shaped_link_delivers_its_rate(cluster: CappedCluster) -> None:
    receiver = subprocess.Popen(cluster.exec_argv(1,
                                                  [sys.executable, "-c", RECEIVER,
                                                   cluster.addr(1)]),
                                stdout=subprocess.PIPE, text=True)
    try:
        read_until(receiver, "ready", timeout=60)
        with CpuWindow() as cpu:
            sent = cluster.run(0, [sys.executable, "-c", SENDER, cluster.addr(1), "2.5"],
                               timeout=30)
        assert sent.returncode == 0, sent.stderr
        received, seconds = read_until(receiver, None, timeout=30)[-1].split()
    finally:
        receiver.kill()
        receiver.wait()
    gbps = int(received) * 8 / float(seconds) / 1e9
    # tbf counts whole frames: TCP payload is 1448 of 1514 bytes on the wire (95.6% of the rate).
    # Both ends share one core (hosts 0 and 1), and the kernel's copies and the bridge run on it:
    # time the hypervisor takes from that core is time nothing feeds the link (0.80 Gbit/s in the CI
    # run above), so the floor is the rate times the share of the core that was left.
    left = cpu.left([host_core(0)])
    assert LINK_GBPS * 0.90 * left <= gbps <= LINK_GBPS * 1.10, f"{gbps:.3f} Gbit/s; {cpu}"


def test_down_removes_its_groups_and_a_layout_that_does_not_fit_makes_nothing(
    tmp_path: Path) -> None:
    small = CappedCluster(1, tmp_path / "one", prefix=f"mcd{os.getpid() % 10000}",
                          cores_per_host=1.0, cores=(CORES[0],)).up()
    folders = small.group_dirs(0)
    assert all(f.is_dir() for f in folders) and small.group_pids(0) == [small.sshd_pid(0)]
    small.down()
    assert not any(f.exists() for f in folders)
    too_many = CappedCluster(3, tmp_path / "three", prefix=f"mcd{os.getpid() % 10000}",
                             cores_per_host=1.0, cores=(CORES[0],))
    with pytest.raises(ValueError, match=r"3 hosts of 1\.0 core"):
        too_many.up()
    assert not any(f.exists() for f in too_many.group_dirs(0))
