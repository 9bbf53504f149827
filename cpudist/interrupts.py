"""SIGTERM and SIGHUP as Ctrl-C: a killed or hung-up command cleans up the way an interrupted one
does.

A signal the command was started with ignored stays ignored: `nohup` ignores SIGHUP, a shell's `&`
without job control ignores SIGINT, and the user meant the command to outlive those.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _heeded() -> list[int]:
    """SIGINT, SIGTERM and SIGHUP, less those this process was started ignoring (nohup's SIGHUP)."""
    return [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            if signal.getsignal(sig) != signal.SIG_IGN]


class Interrupts:
    """Whether a stop signal arrived in the block: remembered even where the raised
    KeyboardInterrupt was swallowed (a signal handled inside a `__del__` or a library's broad except
    only prints a warning)."""

    def __init__(self) -> None:
        self.received: int | None = None

    def _raise(self, signum: int, frame: Any) -> None:
        self.received = signum
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if a signal came in, whatever became of the first one."""
        if self.received is not None:
            raise KeyboardInterrupt


@contextmanager
def signals_interrupt() -> Iterator[Interrupts]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt, and are remembered."""
    seen = Interrupts()
    previous = {sig: signal.signal(sig, seen._raise) for sig in _heeded()}
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def shielded(on_interrupt: Callable[[], None]) -> Iterator[None]:
    """Within the block (a cleanup), Ctrl-C, SIGTERM and SIGHUP only call `on_interrupt`: it runs to
    the end."""
    previous = {sig: signal.signal(sig, lambda signum, frame: on_interrupt()) for sig in _heeded()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
