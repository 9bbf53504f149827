"""Why a rank should stop early: SIGTERM, or a spot interruption notice from the instance metadata.

A signal handler only sets a flag; the loop asks at each step boundary, all ranks agree over one
all-reduce, write a checkpoint and leave with EXIT_PREEMPTED, so the launcher and `cpudist run`
can tell "stopped to be resumed" from "failed".
"""

from __future__ import annotations

import signal
from types import FrameType

from cpudist.train.notice import DEFAULT_IMDS, NoticeWatcher, on_ec2

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on purpose, resume to go on
MARKER = "preempted.json"  # rank 0 writes it in the run folder: step, checkpoint, reason


NOTICE = "spot interruption notice"
PEER = "a peer rank was asked to stop"


def stop_reason(reasons: list[tuple[str, str | None]]) -> tuple[str, str | None]:
    """Which (host, reason) of all ranks' to report: a spot notice first (it names the cause, where a SIGTERM
    that came with it does not), then any rank's own reason, else rank 0's."""
    own = [(host, why) for host, why in reasons if why and why != PEER]
    return next((x for x in own if x[1] and x[1].startswith(NOTICE)), own[0] if own else reasons[0])


def imds_endpoint(setting: str) -> str | None:
    """The metadata service to poll: `auto` is AWS's own on EC2 only, `off` none, else the URL given."""
    if setting == "off":
        return None
    if setting == "auto":
        return DEFAULT_IMDS if on_ec2() else None
    return setting.rstrip("/")


class StopRequests:
    """SIGTERM and (on one rank per node) interruption notices, asked at step boundaries."""

    def __init__(self, imds: str | None, poll_s: float = 5.0) -> None:
        self.reason: str | None = None
        self.watcher = NoticeWatcher(imds, poll_s) if imds else None
        self._previous = signal.getsignal(signal.SIGTERM)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.reason = self.reason or "SIGTERM"

    def __enter__(self) -> StopRequests:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.watcher is not None:
            self.watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)
        if self.watcher is not None:
            self.watcher.stop()

    def pending(self) -> str | None:
        """The reason to stop seen on this rank so far, if any."""
        if self.reason is None and self.watcher is not None and self.watcher.notice is not None:
            n = self.watcher.notice
            self.reason = f"{NOTICE} ({n.action} at {n.time or 'an unstated time'})"
        return self.reason
