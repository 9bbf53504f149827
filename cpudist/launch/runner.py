"""The one place that spawns ranks: run the launcher (launch/per_host.py: one per host), stream its
output, stop it cleanly."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cpudist.errors import Interrupted
from cpudist.launch.spec import Launch
from cpudist.launch.watch import NodeWatch
from cpudist.wire import events, rank_errors
from cpudist.wire.checkpointing import Saving

GRACE_S = 10.0  # between SIGTERM and SIGKILL of the launcher's process group
# ... longer while rank 0 writes a checkpoint (its `saving` event without the `checkpoint` one yet),
# up to this long after the SIGTERM: a stop lets the checkpoint being written be whole.
CHECKPOINT_GRACE_S = 300.0
# After a rank said it lost a peer (gone, or silent for --dist-timeout): the launcher's own time to
# end the job. Hydra left a job up for as long as a hung rank lived (a stopped rank: 10 minutes,
# then killed by hand); past this grace the launcher's process group is stopped (SIGTERM, GRACE_S,
# SIGKILL), whatever it waits for.
FAILED_GRACE_S = 20.0


_LAUNCHER_BLAME = (re.compile(r"RUNNING AT (\S+)"), re.compile(r"on node (\S+?)[ ,.]"))


def failed_host(lines: tuple[str, ...]) -> str | None:
    """The host where the failure began: the launcher's blame (Hydra: RUNNING AT h; Open MPI: on
    node h), else a rank's own error line, else a rank that only lost a peer (its line comes first
    when the peer died silently, killed or cut off, yet the peer is where it began)."""
    for pattern in _LAUNCHER_BLAME:
        for line in lines:
            m = pattern.search(line)
            if m:
                return m.group(1)
    errors = sorted((rank_errors.is_lost_peer(line), host) for line in lines
                    if (host := rank_errors.host_of(line)))
    return errors[0][1] if errors else None


def rank_error(lines: tuple[str, ...], host: str | None) -> str | None:
    """The rank error line that says most about a failure that began on `host`: that host's own,
    else the first that is not a lost peer, else the first."""
    errors = [(line.strip(), found) for line in lines if (found := rank_errors.host_of(line))]
    ranked = sorted(errors, key=lambda e: (e[1] != host, rank_errors.is_lost_peer(e[0])))
    return ranked[0][0] if ranked else None


@dataclass(frozen=True)
class Outcome:
    """How the launcher ended."""

    returncode: int
    timed_out: bool
    last_lines: tuple[str, ...]
    failed_host: str | None = None  # with one launcher per host: the first that failed
    # stopped by cpudist FAILED_GRACE_S after a rank lost its peer (the launcher still ran)
    gave_up: bool = False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: still a member
        return True
    return True


def stop_launcher(proc: subprocess.Popen[str], saving: Saving | None = None) -> None:
    """Terminate the launcher's whole process group (ours: it was started in a new session):
    SIGTERM, then SIGKILL to whatever of the group still lives after GRACE_S (CHECKPOINT_GRACE_S
    while `saving` says a checkpoint is being written), the launcher or not (a rank that ignores
    SIGTERM or is stopped outlives a launcher that exits on it)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    since = time.monotonic()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE_S)

    def waited() -> bool:
        grace = CHECKPOINT_GRACE_S if saving is not None and saving.busy() else GRACE_S
        return time.monotonic() - since >= grace

    while _group_alive(proc.pid) and not waited():
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def execute(launch: Launch, base_env: Mapping[str, str], on_event: Callable[[dict[str, Any]], None],
            on_line: Callable[[str], None], timeout_s: float | None = None,
            watch: NodeWatch | None = None,
            on_stop: Callable[[], None] | None = None) -> Outcome:
    """Run the launch to the end, passing events and other output lines to the callbacks; a node
    that `watch` finds lost stops it (its `lost` says which). On Ctrl-C, `on_stop` is called before
    the ranks get SIGTERM."""
    proc = subprocess.Popen(list(launch.argv), env={**base_env, **launch.rank_env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    if watch is not None:
        watch.start(lambda: stop_launcher(proc))
    expired = threading.Event()

    def on_timeout() -> None:
        expired.set()
        stop_launcher(proc)

    timer = threading.Timer(timeout_s, on_timeout) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    gave_up = threading.Event()

    def give_up() -> None:
        gave_up.set()
        stop_launcher(proc)

    failing = threading.Timer(FAILED_GRACE_S, give_up)  # armed by the first lost-peer line
    failing.daemon = True
    tail: list[str] = []
    saving = Saving()

    def passed_event(line: str) -> bool:
        event = events.parse(line)
        if event is not None:
            saving.see(event)
            on_event(event)
        return event is not None

    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            if passed_event(line):
                continue
            tail = [*tail, line][-20:]
            on_line(line)
            # not started yet: the first such line only
            if rank_errors.is_lost_peer(line) and failing.ident is None:
                failing.start()
        proc.wait()
    except KeyboardInterrupt:
        if on_stop is not None:
            on_stop()
        _stop_reading(proc, saving, lambda line: None if passed_event(line) else on_line(line))
        raise Interrupted("interrupted: all ranks were stopped",
                          "Re-run the command to start over") from None
    finally:
        if timer:
            timer.cancel()
        failing.cancel()
        if watch is not None:
            watch.close()
        if proc.poll() is None:  # any other way out of the loop must not orphan the ranks
            stop_launcher(proc)
    return Outcome(proc.returncode, expired.is_set(), tuple(tail), gave_up=gave_up.is_set())


def _stop_reading(proc: subprocess.Popen[str], saving: Saving,
                  to_callbacks: Callable[[str], None]) -> None:
    """Stop the launcher's group while its last lines (the checkpoint being saved, the ranks' stop)
    still reach the callbacks; a second Ctrl-C kills the group at once."""
    assert proc.stdout is not None
    stdout = proc.stdout

    def read_rest() -> None:
        for raw in stdout:
            to_callbacks(raw.rstrip("\n"))

    reader = threading.Thread(target=read_rest, daemon=True)
    reader.start()
    try:
        stop_launcher(proc, saving)
    except KeyboardInterrupt:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # what the pipe still holds; a process outside the group may keep it open
    reader.join(timeout=5.0)
