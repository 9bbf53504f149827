"""The one place that spawns ranks: run the launcher, stream its output, stop it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cpudist.errors import JobFailed
from cpudist.launch.plan import Launch
from cpudist.train import events

GRACE_S = 10.0  # between SIGTERM and SIGKILL of the launcher's process group


@dataclass(frozen=True)
class Outcome:
    """How the launcher ended."""

    returncode: int
    timed_out: bool
    last_lines: tuple[str, ...]


def _stop(proc: subprocess.Popen[str]) -> None:
    """Terminate the launcher's whole process group (ours: it was started in a new session)."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def execute(launch: Launch, base_env: Mapping[str, str], on_event: Callable[[dict[str, Any]], None],
            on_line: Callable[[str], None], timeout_s: float | None = None) -> Outcome:
    """Run the launch to the end, passing events and other output lines to the callbacks."""
    proc = subprocess.Popen(list(launch.argv), env={**base_env, **launch.rank_env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    expired = threading.Event()

    def on_timeout() -> None:
        expired.set()
        _stop(proc)

    timer = threading.Timer(timeout_s, on_timeout) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            event = events.parse(line)
            if event is not None:
                on_event(event)
                continue
            tail = [*tail, line][-20:]
            on_line(line)
        proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        raise JobFailed("interrupted: all ranks were stopped", "Re-run the command to start over") from None
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:  # any other way out of the loop must not orphan the ranks
            _stop(proc)
    return Outcome(proc.returncode, expired.is_set(), tuple(tail))
