"""What the cloud layer needs of SSH, handed in by its caller, and the one choice of a node's
address.

cloud/ imports neither cpudist.ssh nor cpudist.hosts: `cluster up` waits for sshd, installs the
cluster key, configures node 0 before it is imaged, forgets stale host keys, and `ami build` uploads
a wheel to its builder, all through a `NodeAccess` its caller passes in
(cpudist.ssh.access.SshAccess, from cli/ or run/). A test or another transport can pass its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from cpudist.errors import CpudistError

PUBLIC_HINT = "Use --connect private from inside the VPC, or a subnet that assigns public addresses"


def address(private_ip: str | None, public_ip: str | None, connect: str, what: str,
            hint: str = PUBLIC_HINT) -> str:
    """How this machine reaches a node: its private or its public address (`--connect`); `what`
    names the node."""
    chosen = private_ip if connect == "private" else public_ip
    if not chosen:
        raise CpudistError(f"{what} has no {connect} address", hint)
    return chosen


class Session(Protocol):
    """A login session on one node (cpudist.ssh.client.Remote is one)."""

    def check(self, command: str, stdin: bytes | None = None, timeout: float = 120) -> str: ...

    def put(self, local_path: Path, remote_path: str) -> None: ...


class NodeAccess(Protocol):
    """The SSH the cloud layer uses, passed in by its caller; host keys are pinned in
    `known_hosts`."""

    def wait_banner(self, address: str, port: int, timeout_s: float) -> None:
        """Wait until sshd answers on `address` (booted far enough to log in)."""

    def login(self, address: str, user: str, port: int, key: Path,
              known_hosts: Path) -> AbstractContextManager[Session]:
        """A session on the node at `address`, logged in with `key`, closed when the block ends."""

    def setup(self, reach: Sequence[str], inside: Sequence[str], user: str, port: int, key: Path,
              folder: Path) -> list[tuple[str, str]]:
        """Install the cluster key of `folder` on every node (`reach`: addresses from here, logging
        in with `key`; `inside`: the same nodes as they reach each other); the (from, to) pairs that
        cannot connect."""

    def forget(self, known_hosts: Path, addresses: Iterable[str]) -> None:
        """Drop the pinned host keys of `addresses` (a replaced machine behind an old address)."""

    def new_key(self, comment: str) -> tuple[str, str]:
        """A new key pair: (private, public), OpenSSH text."""
