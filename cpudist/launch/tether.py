"""Run a command that dies with its caller: `python -m cpudist.launch.tether -- COMMAND ...`.

For processes started over SSH without a terminal (torchrun on each host, launch/torchrun.py): when
stdin ends (the ssh client was stopped or lost), or on SIGTERM/SIGHUP/SIGINT, the command and
everything it started is stopped (SIGTERM, then SIGKILL after a grace), also processes that left its
process group (torchrun starts each rank in a session of its own) or lost their parent (a killed
torchrun's ranks): the tether is their child subreaper, so they stay below it. It exits with the
command's code.

    python -m cpudist.launch.tether --from-secrets HF_TOKEN,LD_PRELOAD -- torchrun ...

`--from-secrets NAMES` starts the command with those variables of the run's secrets file
(cpudist/secrets.py: the file CPUDIST_SECRETS names) in its environment: --env values that the ssh
command line would show in `ps`, there from the command's start (a loader variable such as
LD_PRELOAD acts on the ranks' Python too).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from cpudist import secrets
from cpudist.errors import CpudistError
from cpudist.waits import TimedOut, wait_until

GRACE_S = 5.0
PR_SET_CHILD_SUBREAPER = 36


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    """Collect every child that has ended (orphans adopted by this subreaper too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _ended() -> bool | None:
    """True once nothing runs below this process (reaping what ended)."""
    _reap()
    return True if not descendants(os.getpid()) else None


def stop_tree(grace_s: float = GRACE_S) -> None:
    """SIGTERM everything below this process, SIGKILL what is left after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(TimedOut):
            wait_until(_ended, "the processes below to end", wait, 0.1)
            return


def command_env(names: list[str]) -> dict[str, str]:
    """This process's environment with the variables `names` of the run's secrets file."""
    values = secrets.read(os.environ) if names else {}
    missing = [name for name in names if name not in values]
    if missing:
        raise CpudistError(f"the run's secrets file holds no {', '.join(missing)}",
                           "It was written for another launch: re-run the command")
    return {**os.environ, **{name: values[name] for name in names}}


def main(argv: list[str]) -> int:
    names: list[str] = []
    if argv[:1] == ["--from-secrets"] and len(argv) > 1:
        names, argv = [name for name in argv[1].split(",") if name], argv[2:]
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        sys.stderr.write("usage: python -m cpudist.launch.tether [--from-secrets NAME,...] -- "
                         "COMMAND [ARGS...]\n")
        return 2
    try:
        env = command_env(names)
    except CpudistError as e:
        sys.stderr.write(f"error: {e.message}\n")
        return e.exit_code
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())

    def watch_stdin() -> None:
        while os.read(sys.stdin.fileno(), 4096):
            pass
        stop.set()

    child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    threading.Thread(target=watch_stdin, daemon=True).start()
    code = None
    while code is None and not stop.wait(0.2):
        code = child.poll()
    stop_tree()  # the rest of the tree: ranks of a killed agent, or everything when told to stop
    if code is None:  # stopped from outside (its status was reaped with the rest)
        return 128 + signal.SIGTERM
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
