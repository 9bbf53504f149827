"""The launching `cpudist run` process, as another shell finds it: its PID, host and start time
(from /proc).

run.json records these at `begin` so that `cpudist stop` can signal that process, and only that one:
a PID is reused once its process is gone, and the start time (clock ticks since boot, /proc/PID/stat
field 22) tells the recorded process from a later one with the same number.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """A process as run.json names it."""

    pid: int
    host: str
    start: int  # clock ticks after boot; 0: unknown


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (ticks after boot), or None when there is no such process, or it
    has exited and waits for its parent to reap it (a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold spaces and parentheses
    # fields 3 (state) and 22 (starttime)
    return None if fields[0] in ("Z", "X") else int(fields[19])


def this_process() -> Proc:
    """This process, to record in run.json."""
    return Proc(os.getpid(), socket.gethostname(), start_ticks(os.getpid()) or 0)


def this_host() -> str:
    return socket.gethostname()


def alive(proc: Proc) -> bool:
    """Whether the recorded process still runs here: same PID and the same start time."""
    return proc.start != 0 and start_ticks(proc.pid) == proc.start


def ignores(pid: int, sig: int) -> bool:
    """Whether process `pid` ignores `sig` (its SigIgn mask): a `cpudist run` started by `&` in a
    script ignores SIGINT."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines()
                 if line.startswith("SigIgn:")), 0)
    return bool(mask >> (sig - 1) & 1)


def interrupt(proc: Proc) -> int:
    """Send the recorded process SIGINT (SIGTERM where it ignores SIGINT: cpudist treats both alike)
    if it is still that process; return the signal sent. Raises ProcessLookupError when it is not.

    The check and the signal go through one pidfd, so a PID reused between them is never
    signalled."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError as e:
        raise ProcessLookupError(proc.pid) from e
    try:
        if not alive(proc):
            raise ProcessLookupError(proc.pid)
        sig = signal.SIGTERM if ignores(proc.pid, signal.SIGINT) else signal.SIGINT
        signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)
    return sig
