"""cpudist's SSH boundary (cpudist/ssh/) against a real sshd: a node's failure reads as one line
that says what happened there, never a paramiko exception; host keys pinned on any port are the ones
OpenSSH's ssh then accepts; the nodes' ssh gives up on a node that went silent."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.errors import CpudistError
from cpudist.ssh.client import KnownHosts, Remote, Target, Unreachable
from cpudist.ssh.keys import ssh_config
from cpudist.ssh.known_hosts import entry_name
from cpudist.state import CLUSTER_DIR
from tests.harness.netns import SSHD, NetnsCluster, missing_requirements, sh
from tests.integration.helpers import kill_tree

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    c = NetnsCluster(1, tmp_path_factory.mktemp("ssh-link"), prefix=f"ssl{os.getpid() % 10000}",
                     gateway="198.18.0.1")
    c.up()
    try:
        yield c
    finally:
        c.down()


def test_a_command_that_stops_reading_its_input_fails_with_its_own_words(node: NetnsCluster,
                                                                         tmp_path: Path) -> None:
    """#23: the head failing mid-transfer (a full disk under the stage's tar) surfaced as `OSError:
    Socket is closed` with its stderr lost; it must be the command's failure, with its exit code and
    stderr."""
    with Remote(Target(node.addr(0), "root", 22, str(node.user_key)),
                KnownHosts(tmp_path / "known")) as remote:
        with pytest.raises(CpudistError) as failed:
            remote.check("head -c 1000 >/dev/null; echo 'tar: write error: No space left on "
                         "device' >&2; exit 2",
                         stdin=b"x" * 20_000_000)
        assert not isinstance(failed.value, Unreachable), failed.value
        assert "exit code 2" in failed.value.message \
            and "No space left on device" in failed.value.message
        # the connection itself is fine
        assert remote.check("echo still here").strip() == "still here"


def openssh(known: Path, port: int, *argv: str, key: Path) -> list[str]:
    """OpenSSH's own client as the launchers use it: this key, these pins only, never a prompt."""
    return ["ssh", "-p", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o",
            f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null", "-o",
            "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *argv]


@pytest.fixture
def sshd_on_2222(node: NetnsCluster, tmp_path: Path) -> Iterator[int]:
    """A second sshd on host 0, on port 2222 (same host key and logins), stopped by its PID
    afterwards."""
    pid_file, d = tmp_path / "sshd-2222.pid", node.node_dir(0)
    sh(*node.exec_argv(0,
                       [SSHD, "-f", str(d / "sshd_config"), "-p", "2222", "-o",
                        f"PidFile={pid_file}", "-E", str(tmp_path / "sshd-2222.log")]))
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    try:
        yield 2222
    finally:
        os.kill(pid, signal.SIGTERM)


def test_a_key_pinned_on_another_port_is_the_one_openssh_accepts_and_forget_drops_it(
        node: NetnsCluster, sshd_on_2222: int, tmp_path: Path) -> None:
    """paramiko pins `[addr]:2222` (OpenSSH's name for a non-22 port); OpenSSH's ssh then connects
    with that file alone, and `forget(addr)` (what `cpudist hosts forget` does) removes the pin so
    ssh refuses again."""
    known_path, addr = tmp_path / "known_hosts", node.addr(0)
    with Remote(Target(addr, "root", sshd_on_2222, str(node.user_key)),
                KnownHosts(known_path)) as remote:
        assert remote.check("echo hi").strip() == "hi"
    assert KnownHosts(known_path).keys.lookup(entry_name(addr, 2222)) is not None
    ok = subprocess.run(openssh(known_path, 2222, f"root@{addr}", "true", key=node.user_key),
                        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ok.returncode == 0, ok.stderr
    assert KnownHosts(known_path).forget(addr)
    refused = subprocess.run(openssh(known_path, 2222, f"root@{addr}", "true", key=node.user_key),
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr, \
        refused.stderr


def test_the_nodes_ssh_gives_up_on_a_node_that_went_silent(node: NetnsCluster,
                                                           tmp_path: Path) -> None:
    """#23: the nodes' ssh_config (what the launchers' ssh wrapper uses) must end an ssh to a node
    that vanished (no FIN, no RST: packets dropped) in ~15 s; without ServerAlive* it waits for ever
    on an idle session."""
    home = tmp_path / "home"
    folder = home / CLUSTER_DIR
    folder.mkdir(parents=True)
    shutil.copy(node.user_key, folder / "id_ed25519")
    (folder / "id_ed25519").chmod(0o600)
    addr = node.addr(0)
    with Remote(Target(addr, "root", 22, str(node.user_key)), KnownHosts(folder / "known_hosts")):
        pass  # pins the host key where the config looks
    (folder / "ssh_config").write_text(ssh_config(str(folder), "root"))
    ssh = subprocess.Popen(["ssh", "-F", str(folder / "ssh_config"), addr,
                            "echo connected; exec sleep 600"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                           text=True)
    assert node.gateway is not None  # this process reaches the node from there
    drop = ["ip", "netns", "exec", node.name(0), "iptables", "-{}", "INPUT", "-s", node.gateway,
            "-j", "DROP"]
    try:
        assert ssh.stdout is not None and ssh.stdout.readline().strip() == "connected", ssh.stderr
        sh(*[a.format("I") for a in drop])
        silent_at = time.monotonic()
        try:
            code = ssh.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("ssh still waiting 60 s after the node went silent")
        took = time.monotonic() - silent_at
        # 3 unanswered keepalives 5 s apart, not a quick error
        assert code == 255 and took >= 10, (code, took)
    finally:
        sh(*[a.format("D") for a in drop], check=False)
        kill_tree(ssh)
