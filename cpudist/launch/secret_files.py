"""The run's secrets file on every node of a launch, for as long as it runs (see
cpudist/secrets.py).

The values go over ssh's stdin (`umask 077 && cat > FILE`), never into an argument, and the files
are removed when the launch ends, however it ends.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from cpudist import secrets
from cpudist.errors import JobFailed
from cpudist.launch.env import HIDDEN
from cpudist.launch.spec import RunSpec, file_pairs
from cpudist.launch.tools import is_this_machine

CONNECT_S = 10
TIMEOUT_S = 60


def _others(spec: RunSpec) -> list[str]:
    """The nodes that get their own copy: the used nodes of a hostfile but this machine (Slurm's
    nodes read the submitter's, through the shared home)."""
    if spec.hostfile is None or spec.launcher == "slurm":
        return []
    return [h.name for h in spec.hosts[: max(1, spec.np // spec.ppn)]
            if not is_this_machine(h.name)]


def _ssh(spec: RunSpec, host: str, command: str,
         stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([spec.ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_S}",
                           host, command],
                          input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S)


@contextlib.contextmanager
def placed(spec: RunSpec) -> Iterator[None]:
    """The secrets file of `spec` on this machine and every other node while the block runs; nothing
    without secrets."""
    pairs = file_pairs(spec)
    if not pairs:
        yield
        return
    where = secrets.file_for(spec.secrets_name)
    done: list[str] = []
    try:
        secrets.write_here(where, pairs)
        for host in _others(spec):
            p = _ssh(spec, host, secrets.write_command(where), secrets.render(pairs))
            if p.returncode != 0:
                raise JobFailed(f"writing the run's secrets file on {host} failed: "
                                f"{p.stderr.strip()[-200:]}",
                                "Check that this node reaches it (`cpudist hosts doctor`) and its "
                                "home is writable")
            done.append(host)
        yield
    finally:
        with contextlib.suppress(OSError):
            subprocess.run(["sh", "-c", secrets.remove_command(where)], timeout=TIMEOUT_S)
        for host in done:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                _ssh(spec, host, secrets.remove_command(where))


def left_for_job(spec: RunSpec) -> str | None:
    """A detached Slurm job's secrets file on this machine (the nodes read it through the shared
    home), left for the job: its batch script removes it at the job's end (launch/slurm.py), and so
    does the job's landing (see removed). Its path; None without secrets."""
    pairs = file_pairs(spec)
    if not pairs:
        return None
    where = secrets.file_for(spec.secrets_name)
    secrets.write_here(where, pairs)
    return where


def removed(where: str | None) -> None:
    """The secrets file `where` (as left_for_job gave it) gone from this machine."""
    if where:
        Path(where).expanduser().unlink(missing_ok=True)


# shorter values (a thread count, a flag) would hide every such digit or word of the output
MIN_HIDDEN = 6


def hider(spec: RunSpec) -> Callable[[str], str]:
    """What rank output goes through before a log or a screen: each secret value of MIN_HIDDEN
    characters or more replaced by ***."""
    values = sorted({v for _, v in spec.launch.secrets if len(v) >= MIN_HIDDEN}, key=len,
                    reverse=True)

    def hide(line: str) -> str:
        for value in values:
            line = line.replace(value, HIDDEN)
        return line

    return hide
