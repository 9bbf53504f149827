"""The node watch (cpudist/launch/watch.py) against real sshd hosts: a node that vanishes mid-launch
(links down, then everything on it killed: what tests/harness/power.py does to a terminated
instance) stops a launch that would otherwise wait for ever, within the stated bound, naming that
node and no other; a watching session that ends while its node still answers is only replaced."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.launch import runner
from cpudist.launch.spec import Launch
from cpudist.launch.watch import DETECTION_BOUND_S, KEEPALIVE_S, NodeWatch
from cpudist.ssh.client import KnownHosts, Remote, Target
from cpudist.ssh.keys import ssh_config, ssh_wrapper
from tests.harness.netns import NetnsCluster, missing_requirements, sh
from tests.harness.power import kill_namespace
from tests.integration.helpers import cmdline

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]

# A launcher that never notices a dead node, as mpiexec.hydra waiting for a silent proxy.
HANGS = (sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)")
STOP_S = runner.GRACE_S  # the launcher's own stop after the report (SIGTERM, grace, SIGKILL)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetnsCluster, str]]:
    """Two hosts this process reaches through a gateway, and the ssh wrapper that launchers use
    between nodes."""
    c = NetnsCluster(2, tmp_path_factory.mktemp("watch"), prefix=f"cnw{os.getpid() % 10000}",
                     net="198.18.9", gateway="198.18.9.1")
    c.up()
    try:
        folder = c.state / "cluster"
        folder.mkdir()
        shutil.copy(c.user_key, folder / "id_ed25519")
        (folder / "id_ed25519").chmod(0o600)
        for i in range(c.n):
            with Remote(Target(c.addr(i), "root", 22, str(c.user_key)),
                        KnownHosts(folder / "known_hosts")):
                pass  # pins its host key where the config looks
        (folder / "ssh_config").write_text(ssh_config(str(folder), "root"))
        wrapper = folder / "ssh"
        wrapper.write_text(ssh_wrapper(str(folder)))
        wrapper.chmod(0o755)
        yield c, str(wrapper)
    finally:
        c.down()


def watching_sessions(c: NetnsCluster, i: int) -> list[int]:
    """The watch's `cat` on host i (its idle session's far end)."""
    return [pid for pid in c.pids(i) if cmdline(pid).strip() == "cat"]


def local_sessions(ssh: str) -> list[int]:
    """This machine's ssh clients through the wrapper (its config's path is on their command
    line)."""
    config = str(Path(ssh).parent / "ssh_config")
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and config in cmdline(int(p))]


def test_a_session_that_ends_while_its_node_answers_is_replaced_not_reported(
        pair: tuple[NetnsCluster, str]) -> None:
    c, ssh = pair
    watch = NodeWatch([c.addr(0), c.addr(1)], ssh)
    stopped = threading.Event()
    watch.start(stopped.set)
    try:
        deadline = time.monotonic() + 30
        while not (first := watching_sessions(c, 1)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(first) == 1, "no watching session on host 1"
        os.kill(first[0], 9)
        deadline = time.monotonic() + KEEPALIVE_S + 30
        while not ((again := watching_sessions(c, 1))
                   and again != first) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert again and again != first, "the ended session was not replaced"
        assert watch.lost is None and not stopped.is_set()
    finally:
        watch.close()
    # close ends them on both hosts
    assert watching_sessions(c, 0) == [] and watching_sessions(c, 1) == []
    assert local_sessions(ssh) == []


def test_a_node_that_vanishes_stops_the_launch_within_the_bound_naming_it(
        pair: tuple[NetnsCluster, str]) -> None:
    c, ssh = pair
    watch = NodeWatch([c.addr(0), c.addr(1)], ssh)
    gone: list[float] = []

    def power_off_host_1(line: str) -> None:
        if line == "started" and not gone:
            time.sleep(KEEPALIVE_S)  # sessions up and idle, keepalives answered
            # silence first: no FIN, no RST
            sh("ip", "-n", c.name(1), "link", "set", "eth0", "down")
            gone.append(time.monotonic())
            kill_namespace(c.name(1))

    outcome = runner.execute(Launch(HANGS, {}), os.environ, lambda e: None, power_off_host_1,
                             timeout_s=150, watch=watch)
    took = time.monotonic() - gone[0]
    assert not outcome.timed_out and outcome.returncode != 0
    assert watch.lost is not None and watch.lost.node == c.addr(1), watch.lost
    assert took < DETECTION_BOUND_S + STOP_S + 5, took  # 5 s for a loaded machine's slowness
    print(f"lost {watch.lost} reported and launch stopped {took:.1f}s after the node went silent")
    assert watching_sessions(c, 0) == [] and local_sessions(ssh) == []
