"""Namespace hosts powered like EC2 instances: switched off with everything on them, booted in
phases.

Used by tests/harness/world.py. Off: the host's links go down first, so nothing it runs can say
goodbye (no FIN, no RST: its peers hear silence, as from a node that vanished), then every process
whose network namespace is the host's (found by the namespace's inode, /proc/<pid>/ns/net) is
killed, sshd included. On: a thread walks the boot's phases (`world.Boot`): links down until EC2
says `running`, then nothing on port 22 (refused), then a listener that resets every connection
before any banner (sshd starting), then sshd with the machine's host key (a new one for a new
machine). Each step checks the host's generation, which every power-off bumps: a boot overtaken by
a stop or a terminate gives up instead of starting sshd on a machine that is off.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.harness.netns import NetnsCluster, sh

CLONE_NEWNET = 0x40000000
LINKS = ("eth0", "eth1")  # private and public interfaces of a world host (eth1 may be absent)


@dataclass(frozen=True)
class Boot:
    """How a machine comes up after RunInstances or StartInstances (small defaults keep the suite
    fast)."""

    # EC2 shows it `pending` (the emulator's part); the host's links are down
    pending_s: float = 0.5
    refusing_s: float = 0.5  # `running`, network up, no sshd yet: port 22 refuses
    no_banner_s: float = 1.0  # sshd starting: connections on port 22 are reset before any banner


def namespace_pids(ns: str) -> list[int]:
    """Processes whose network namespace is `ns` (same inode and device as /run/netns/<ns>)."""
    try:
        target = os.stat(f"/run/netns/{ns}")
    except FileNotFoundError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, or a zombie (no namespaces left)
            continue
        if (st.st_ino, st.st_dev) == (target.st_ino, target.st_dev):
            found.append(int(entry))
    return found


def kill_namespace(ns: str, within_s: float = 10.0) -> None:
    """SIGKILL every process of namespace `ns` until none is left (new ones may be forked
    meanwhile)."""
    deadline = time.monotonic() + within_s
    while pids := namespace_pids(ns):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of {ns} survive SIGKILL: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def listen_in_namespace(ns: str, port: int) -> socket.socket:
    """A TCP listener on all of namespace `ns`'s addresses, made from a short thread that setns()es
    there."""
    made: list[socket.socket] = []
    errors: list[str] = []

    def make() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                errors.append(os.strerror(ctypes.get_errno()))
                return
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))
            s.listen(64)
            made.append(s)
        finally:
            os.close(fd)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if not made:
        raise RuntimeError(f"cannot listen on port {port} in {ns}: {errors or 'see above'}")
    return made[0]


def _reset_everyone(listener: socket.socket, stop: threading.Event) -> None:
    """Accept and reset (SO_LINGER 0) every connection until `stop`; then close the listener."""
    listener.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            break
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    listener.close()


class Power:
    """Power state of a cluster's hosts; `lock` is the world's (held by the caller of `off` and
    `on`)."""

    def __init__(self, hosts: NetnsCluster, lock: threading.Lock,
                 state_of: Callable[[str], str | None]) -> None:
        self.hosts = hosts
        self.lock = lock
        self.state_of = state_of  # instance id -> its EC2 state now (None: unknown)
        self.on_for: dict[int, str] = {}  # host -> instance it is powered on for (booting or up)
        self.up_for: dict[int, str] = {}  # host -> instance whose sshd answers
        self.generation: dict[int, int] = {}
        self.no_banner: dict[int, tuple[threading.Event, threading.Thread]] = {}
        self.closed = False

    def off(self, i: int) -> None:
        """Switch host i off: links down, then every process of its namespace killed. Caller holds
        the lock."""
        self.generation[i] = self.generation.get(i, 0) + 1
        self.on_for.pop(i, None)
        self.up_for.pop(i, None)
        self._links(i, "down")
        self._stop_no_banner(i)
        kill_namespace(self.hosts.name(i))
        (self.hosts.node_dir(i) / "sshd.pid").unlink(missing_ok=True)

    def on(self, i: int, instance_id: str, new_key: bool, boot: Boot) -> None:
        """Boot host i for `instance_id` (after `off`), phase by phase, in a thread. Caller holds
        the lock."""
        self.on_for[i] = instance_id
        gen = self.generation.get(i, 0)
        threading.Thread(target=self._boot, args=(i, instance_id, gen, new_key, boot),
                         daemon=True).start()

    def wait_up(self, i: int, instance_id: str | None = None, timeout_s: float = 60) -> None:
        """Until host i's sshd answers (for `instance_id`, when given)."""
        deadline = time.monotonic() + timeout_s
        while (up := self.up_for.get(i)) is None or (instance_id and up != instance_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"host {i} did not boot within {timeout_s:g}s")
            time.sleep(0.05)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for i in list(self.no_banner):
                self._stop_no_banner(i)

    def _current(self, i: int, gen: int) -> bool:
        return not self.closed and self.generation.get(i, 0) == gen

    def _boot(self, i: int, instance_id: str, gen: int, new_key: bool, boot: Boot) -> None:
        if new_key:  # now, not when sshd starts: keeps its start short (port 22 refuses meanwhile)
            key = self.hosts.node_dir(i) / "ssh_host_ed25519_key"
            key.unlink(missing_ok=True)
            key.with_suffix(".pub").unlink(missing_ok=True)
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.hosts.name(i), "-f",
               str(key))
        while (state := self.state_of(instance_id)) == "pending":
            if not self._current(i, gen):
                return
            time.sleep(0.05)
        if state != "running":
            return
        with self.lock:
            if not self._current(i, gen):
                return
            self._links(i, "up")
        time.sleep(boot.refusing_s)
        with self.lock:
            if not self._current(i, gen):
                return
            stop = threading.Event()
            listener = listen_in_namespace(self.hosts.name(i), 22)
            t = threading.Thread(target=_reset_everyone, args=(listener, stop), daemon=True)
            t.start()
            self.no_banner[i] = (stop, t)
        time.sleep(boot.no_banner_s)
        with self.lock:
            if not self._current(i, gen):
                return
            self._stop_no_banner(i)
            self.hosts._launch_sshd(i, new_key=False)
            self.up_for[i] = instance_id

    def _stop_no_banner(self, i: int) -> None:
        entry = self.no_banner.pop(i, None)
        if entry is not None:
            entry[0].set()
            entry[1].join(timeout=5)

    def _links(self, i: int, how: str) -> None:
        ns = self.hosts.name(i)
        for dev in LINKS:
            if Path(f"/run/netns/{ns}").exists():
                sh("ip", "-n", ns, "link", "set", dev, how, check=dev == "eth0")
