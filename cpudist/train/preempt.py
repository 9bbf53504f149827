"""Why a rank should stop early: SIGTERM, or the provider's notice that it reclaims the machine (a
spot interruption: cpudist/cloud/aws/notice.py polls for it, handed in by cpudist/rank.py as a
NoticePoller).

A signal handler only sets a flag; the loop asks at each step boundary, all ranks agree over one
all-reduce, write a checkpoint and leave with wire.exits.PREEMPTED, so the launcher and `cpudist
run` can tell "stopped to be resumed" from "failed".
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any, Protocol

NOTICE = "spot interruption notice"
PEER = "a peer rank was asked to stop"
USER = "the user's stop"


class Notice(Protocol):
    """A posted interruption: what the provider will do, and when (its own words, or None)."""

    @property
    def action(self) -> str: ...

    @property
    def time(self) -> str | None: ...


class NoticePoller(Protocol):
    """Polls the provider in the background for a notice that this machine is about to go."""

    @property
    def notice(self) -> Notice | None:
        """The first notice seen (it stays once set), or None."""
        ...

    def start(self) -> Any:
        """Start polling."""
        ...

    def stop(self) -> None:
        """Stop polling (promptly)."""
        ...


def stop_reason(reasons: list[tuple[str, str | None]]) -> tuple[str, str | None]:
    """Which (host, reason) of all ranks' to report: a spot notice first (it names the cause, where
    a SIGTERM that came with it does not), then any rank's own reason, else rank 0's."""
    own = [(host, why) for host, why in reasons if why and why != PEER]
    return next((x for x in own if x[1] and x[1].startswith(NOTICE)), own[0] if own else reasons[0])


class StopRequests:
    """SIGTERM and (on one rank per node: the others get no poller) interruption notices, asked at
    step boundaries."""

    def __init__(self, watcher: NoticePoller | None) -> None:
        self.reason: str | None = None
        self.watcher = watcher
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
