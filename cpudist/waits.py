"""The one wait helper: poll a check until it gives an answer or a deadline passes.

Waiting for something to become true (an instance running, an sshd's banner, a process tree gone) is
this; retrying a call that failed is `cloud/aws/client.call`'s; following a job's output is the
follower's own loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from cpudist.errors import CpudistError

T = TypeVar("T")


class TimedOut(CpudistError):
    """A wait ran past its deadline."""


def wait_until(check: Callable[[], T | None], what: str, timeout_s: float, interval_s: float = 2.0,
               hint: str = "Check it, then retry") -> T:
    """Call `check` every `interval_s` until it returns something (not None), and return that; after
    `timeout_s` raise TimedOut naming `what`. The first check is at once, the last at the deadline
    (never a sleep past it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value is not None:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimedOut(f"timed out after {timeout_s:g}s waiting for {what}", hint)
        time.sleep(min(interval_s, left))
