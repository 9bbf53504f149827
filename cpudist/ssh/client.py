"""SSH to cluster nodes with paramiko, with host keys pinned on first contact (known_hosts.py).

The one module that talks SSH. Errors come out as CpudistErrors that name the host and the fix.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko

from cpudist.errors import CpudistError
from cpudist.ssh.known_hosts import KnownHosts, entry_name
from cpudist.waits import TimedOut, wait_until

CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_S = 5.0  # how often the server is asked for a reply
# no reply for this long: the connection is lost (OpenSSH's ServerAliveCountMax 3 x 5 s)
DEAD_AFTER_S = 15.0
# what paramiko raises when a connection breaks
LINK_ERRORS = (paramiko.SSHException, OSError, EOFError)


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


class _PinNew(paramiko.MissingHostKeyPolicy):
    def __init__(self, known: KnownHosts) -> None:
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        self.known.pin(hostname, key)


class _Keepalive(threading.Thread):
    """Asks the server for a reply every KEEPALIVE_S and closes the connection when none came in
    DEAD_AFTER_S.

    paramiko's own `set_keepalive` sends messages that want no reply, so a link that drops packets
    without a word (a laptop's Wi-Fi, a firewall) went unnoticed until TCP gave up, about 15 minutes
    later.
    """

    def __init__(self, transport: paramiko.Transport) -> None:
        super().__init__(daemon=True, name="cpudist-ssh-keepalive")
        self.transport = transport
        self.lost = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(KEEPALIVE_S) and self.transport.is_active():
            answered = threading.Event()
            threading.Thread(target=self._ask, args=(answered,), daemon=True).start()
            if not answered.wait(DEAD_AFTER_S) and not self.done.is_set():
                self.lost.set()
                self.transport.close()  # wakes every reader and writer of its channels
                return

    def _ask(self, answered: threading.Event) -> None:
        # OpenSSH's own client sends this; servers answer it (with a failure, which is an answer
        # too).
        with contextlib.suppress(*LINK_ERRORS):
            self.transport.global_request("keepalive@openssh.com", wait=True)
        answered.set()


class Remote:
    """An open SSH session to one node."""

    def __init__(self, target: Target, known: KnownHosts,
                 timeout: float = CONNECT_TIMEOUT_S) -> None:
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
                f"the host key of {target.host} changed since it was pinned in {known.path}: "
                "refusing to connect",
                "If the node was reinstalled on purpose, re-trust it with `cpudist hosts forget "
                f"{target.host}` (or `ssh-keygen -R "
                f"{shlex.quote(entry_name(target.host, target.port))} -f {known.path}`) and run "
                "`cpudist hosts ssh-setup` again") from None
        except paramiko.AuthenticationException:
            self.client.close()
            raise Unreachable(f"cannot log in to {target.host} as "
                              f"{target.user or 'the current user'}",
                              "Pass the key that works there with --identity, "
                              "or the right --user") from None
        except (TimeoutError, OSError, paramiko.SSHException) as e:
            self.client.close()
            raise Unreachable(f"cannot reach {target.host}:{target.port} over SSH ({e})",
                              "Check that the node is up, "
                              "the name resolves and sshd listens") from None
        transport = self.client.get_transport()
        assert transport is not None  # connect() returned
        self._keepalive = _Keepalive(transport)
        self._keepalive.start()

    @property
    def lost(self) -> bool:
        """True once the server stopped answering (or the connection closed under us)."""
        transport = self.client.get_transport()
        return self._keepalive.lost.is_set() or transport is None or not transport.is_active()

    def lost_error(self, why: object = None) -> Unreachable:
        """The error for a connection that broke: silence (no reply to keepalives), or `why`."""
        if self._keepalive.lost.is_set():
            what = f"no answer for {DEAD_AFTER_S:g}s"
        elif why is not None:
            what = str(why) or type(why).__name__  # paramiko's EOFError says nothing
        else:
            what = "closed by the other end"
        return Unreachable(f"lost the SSH connection to {self.target.host} ({what})",
                           "Check the network between here and the node, then re-run")

    @contextlib.contextmanager
    def _link(self, doing: str, timeout: float | None = None) -> Iterator[None]:
        """paramiko's and the socket's errors as one Unreachable naming the host."""
        try:
            yield
        except TimeoutError:
            if self.lost or timeout is None:
                raise self.lost_error() from None
            raise Unreachable(f"{self.target.host} gave no answer within {timeout:g}s to `{doing}`",
                              "Check the node (is it overloaded or stuck?), then re-run") from None
        except LINK_ERRORS as e:
            raise self.lost_error(e) from None

    def run(self, command: str, stdin: bytes | Iterable[bytes] | None = None,
            timeout: float = 120) -> tuple[int, str, str]:
        """Run a shell command; returns (exit code, stdout, stderr). `stdin` may be chunks, sent as
        they come."""
        with self._link(command.split(" &&")[0][:60], timeout):
            chan_in, out, err = self.client.exec_command(command, timeout=timeout)
            self._feed(chan_in, stdin)
            stdout, stderr = out.read().decode(), err.read().decode()
            code = out.channel.recv_exit_status()
        # the channel ended without an exit status: the connection went
        if code == -1 and self.lost:
            raise self.lost_error()
        return code, stdout, stderr

    def _feed(self, chan_in: paramiko.ChannelStdinFile,
              data: bytes | Iterable[bytes] | None) -> None:
        """Write a command's stdin and close it; a command that exits before reading it all (its
        disk is full) closes the channel, and then its exit code and stderr say why, not the
        write."""
        channel = chan_in.channel
        try:
            for chunk in () if data is None else (data,) if isinstance(data, bytes) else data:
                chan_in.write(chunk)
            if not channel.closed:
                channel.shutdown_write()
        except OSError:
            if self.lost or not channel.closed:
                raise

    def check(self, command: str, stdin: bytes | Iterable[bytes] | None = None,
              timeout: float = 120) -> str:
        """Run a command that must succeed; its stdout."""
        code, stdout, stderr = self.run(command, stdin, timeout)
        if code != 0:
            raise CpudistError(f"on {self.target.host}: `{command.split(' &&')[0]}` failed with "
                               f"exit code {code}: "
                               f"{stderr.strip()[-300:]}", "Fix the node, then re-run")
        return stdout

    def stream(self, command: str) -> paramiko.Channel:
        """Start a long command; its stdout and stderr come merged on the returned channel."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise self.lost_error()
        # a lost connection closes the channel: see `lost` when reading ends
        with self._link(command):
            channel = transport.open_session()
            channel.set_combine_stderr(True)
            channel.exec_command(command)
        return channel

    def put(self, local_path: Path, remote_path: str) -> None:
        """Copy one file to the node."""
        with self._link(f"sftp put {remote_path}"), self.client.open_sftp() as sftp:
            sftp.put(str(local_path), remote_path)

    def fetch(self, remote_path: str, local_path: Path) -> bool:
        """Copy one file from the node; False when it does not exist there."""
        with self._link(f"sftp get {remote_path}"), self.client.open_sftp() as sftp:
            try:
                sftp.stat(remote_path)
            except FileNotFoundError:
                return False
            sftp.get(remote_path, str(local_path))
        return True

    def close(self) -> None:
        self._keepalive.done.set()
        self.client.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_banner(address: str, port: int = 22, timeout_s: float = 600,
                interval_s: float = 2.0) -> None:
    """Wait until sshd answers on `address` with its banner (booted far enough to log in)."""
    last = [""]

    def banner() -> bool | None:
        try:
            with socket.create_connection((address, port), timeout=5) as s:
                s.settimeout(5)
                if s.recv(64).startswith(b"SSH-"):
                    return True
        except OSError as e:
            last[0] = str(e)
        return None

    try:
        wait_until(banner, f"the SSH banner of {address}:{port}", timeout_s, interval_s)
    except TimedOut:
        raise Unreachable(f"no SSH banner from {address}:{port} after {timeout_s:g}s "
                          f"({last[0] or 'no answer'})",
                          "Check the security group allows your address (--ssh-cidr) and --connect "
                          "public/private") \
            from None
