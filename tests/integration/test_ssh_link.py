"""cpudist's SSH boundary (cpudist/hosts/ssh.py) against a real sshd: a node's failure reads as one line that says
what happened there, never a paramiko exception."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.errors import CpudistError
from cpudist.hosts.ssh import KnownHosts, Remote, Target, Unreachable
from tests.harness.netns import NetnsCluster, missing_requirements

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    c = NetnsCluster(1, tmp_path_factory.mktemp("ssh-link"), prefix=f"ssl{os.getpid() % 10000}",
                     gateway="198.18.0.1")
    c.up()
    try:
        yield c
    finally:
        c.down()


def test_a_command_that_stops_reading_its_input_fails_with_its_own_words(node: NetnsCluster, tmp_path: Path) -> None:
    """#23: the head failing mid-transfer (a full disk under the stage's tar) surfaced as `OSError: Socket is
    closed` with its stderr lost; it must be the command's failure, with its exit code and stderr."""
    with Remote(Target(node.addr(0), "root", 22, str(node.user_key)), KnownHosts(tmp_path / "known")) as remote:
        with pytest.raises(CpudistError) as failed:
            remote.check("head -c 1000 >/dev/null; echo 'tar: write error: No space left on device' >&2; exit 2",
                         stdin=b"x" * 20_000_000)
        assert not isinstance(failed.value, Unreachable), failed.value
        assert "exit code 2" in failed.value.message and "No space left on device" in failed.value.message
        assert remote.check("echo still here").strip() == "still here"  # the connection itself is fine
