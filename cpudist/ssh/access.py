"""SSH as the cloud layer uses it (cpudist.cloud.access.NodeAccess): its callers in cli/ and run/
pass this in."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from cpudist.hostfile import Host
from cpudist.ssh.client import Remote, Target, wait_banner
from cpudist.ssh.keys import generate_key
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.ssh.setup import ssh_setup


class SshAccess:
    """cloud/'s NodeAccess over paramiko and OpenSSH (the same calls `cluster up` made itself
    before)."""

    def wait_banner(self, address: str, port: int, timeout_s: float) -> None:
        wait_banner(address, port, timeout_s)

    def login(self, address: str, user: str, port: int, key: Path, known_hosts: Path) -> Remote:
        return Remote(Target(address, user, port, str(key)), KnownHosts(known_hosts))

    def setup(self, reach: Sequence[str], inside: Sequence[str], user: str, port: int, key: Path,
              folder: Path) -> list[tuple[str, str]]:
        results = ssh_setup([Host(a) for a in reach], user, str(key), port, folder / "known_hosts",
                            inside=list(inside), key_folder=folder)
        return [(r.host, f) for r in results for f in r.fails]

    def forget(self, known_hosts: Path, addresses: Iterable[str]) -> None:
        for a in addresses:
            KnownHosts(known_hosts).forget(a)

    def new_key(self, comment: str) -> tuple[str, str]:
        pair = generate_key(comment)
        return pair.private, pair.public
