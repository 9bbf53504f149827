"""SSH to cluster nodes with paramiko, with host keys pinned on first contact.

The one module that talks SSH. Errors come out as CpudistErrors that name the host and the fix.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

from cpudist import state
from cpudist.errors import CpudistError

CONNECT_TIMEOUT_S = 10.0


class HostKeyChanged(CpudistError):
    """A node presented a different host key than the one pinned for it."""


class Unreachable(CpudistError):
    """A node could not be reached or logged in to."""


@dataclass(frozen=True)
class Target:
    """How to reach one node."""

    host: str
    user: str | None = None
    port: int = 22
    identity: str | None = None  # private key file; None: ssh-agent and ~/.ssh defaults


class KnownHosts:
    """A known_hosts file: keys seen before are enforced, new hosts are pinned (trust on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys = paramiko.HostKeys()
        if path.is_file():
            self.keys.load(str(path))
        self._lock = threading.Lock()

    def entry_name(self, host: str, port: int) -> str:
        return host if port == 22 else f"[{host}]:{port}"

    def pin(self, name: str, key: paramiko.PKey) -> None:
        """Remember a new host's key: merged into the file under a lock, which is replaced whole."""
        with self._lock, state.locked(self.path):
            on_disk = paramiko.HostKeys()
            if self.path.is_file():
                on_disk.load(str(self.path))
            on_disk.add(name, key.get_name(), key)
            self.keys.add(name, key.get_name(), key)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            on_disk.save(str(tmp))
            os.replace(tmp, self.path)

    def lines_for(self, names: dict[str, list[str]]) -> str:
        """known_hosts text for the nodes themselves: each pinned host's keys under the names they use."""
        out = []
        for pinned, aliases in names.items():
            entry = self.keys.lookup(pinned)
            hostnames = ",".join(dict.fromkeys(aliases))
            for kind, key in (entry or {}).items():
                out.append(f"{hostnames} {kind} {key.get_base64()}")
        return "\n".join(out) + "\n"


class _PinNew(paramiko.MissingHostKeyPolicy):
    def __init__(self, known: KnownHosts) -> None:
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known.pin(hostname, key)


class Remote:
    """An open SSH session to one node."""

    def __init__(self, target: Target, known: KnownHosts, timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.target = target
        self.client = paramiko.SSHClient()
        self.client.get_host_keys().update(known.keys)  # pinned keys: a different key is refused
        self.client.set_missing_host_key_policy(_PinNew(known))
        try:
            self.client.connect(target.host, port=target.port, username=target.user,
                                key_filename=target.identity, look_for_keys=target.identity is None,
                                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
        except paramiko.BadHostKeyException:
            self.client.close()
            raise HostKeyChanged(
                f"the host key of {target.host} changed since it was pinned in {known.path}: refusing to connect",
                f"If the node was reinstalled on purpose, re-trust it with "
                f"`cpudist hosts forget {target.host}` (or `ssh-keygen -R {target.host} -f {known.path}`) "
                f"and run `cpudist hosts ssh-setup` again") from None
        except paramiko.AuthenticationException:
            self.client.close()
            raise Unreachable(f"cannot log in to {target.host} as {target.user or 'the current user'}",
                              "Pass the key that works there with --identity, or the right --user") from None
        except (TimeoutError, OSError, paramiko.SSHException) as e:
            self.client.close()
            raise Unreachable(f"cannot reach {target.host}:{target.port} over SSH ({e})",
                              "Check that the node is up, the name resolves and sshd listens") from None

    def run(self, command: str, stdin: bytes | None = None, timeout: float = 120) -> tuple[int, str, str]:
        """Run a shell command; returns (exit code, stdout, stderr)."""
        chan_in, out, err = self.client.exec_command(command, timeout=timeout)
        if stdin is not None:
            chan_in.write(stdin)
        chan_in.channel.shutdown_write()
        stdout, stderr = out.read().decode(), err.read().decode()
        return out.channel.recv_exit_status(), stdout, stderr

    def check(self, command: str, stdin: bytes | None = None, timeout: float = 120) -> str:
        """Run a command that must succeed; its stdout."""
        code, stdout, stderr = self.run(command, stdin, timeout)
        if code != 0:
            raise CpudistError(f"on {self.target.host}: `{command.split(' &&')[0]}` failed with exit code {code}: "
                               f"{stderr.strip()[-300:]}", "Fix the node, then re-run")
        return stdout

    def stream(self, command: str) -> paramiko.Channel:
        """Start a long command; its stdout and stderr come merged on the returned channel."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise Unreachable(f"the SSH connection to {self.target.host} is closed", "Re-run the command")
        transport.set_keepalive(10)  # a dead peer is noticed in seconds, not at the next write
        channel = transport.open_session()
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        return channel

    def put(self, local_path: Path, remote_path: str) -> None:
        """Copy one file to the node."""
        with self.client.open_sftp() as sftp:
            sftp.put(str(local_path), remote_path)

    def fetch(self, remote_path: str, local_path: Path) -> bool:
        """Copy one file from the node; False when it does not exist there."""
        with self.client.open_sftp() as sftp:
            try:
                sftp.stat(remote_path)
            except FileNotFoundError:
                return False
            sftp.get(remote_path, str(local_path))
        return True

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_banner(address: str, port: int = 22, timeout_s: float = 600, interval_s: float = 2.0) -> None:
    """Wait until sshd answers on `address` with its banner (booted far enough to log in)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=5) as s:
                s.settimeout(5)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError as e:
            last = str(e)
        time.sleep(interval_s)
    raise Unreachable(f"no SSH banner from {address}:{port} after {timeout_s:g}s ({last or 'no answer'})",
                      "Check the security group allows your address (--ssh-cidr) and --connect public/private")
