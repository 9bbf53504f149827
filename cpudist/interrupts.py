"""SIGTERM and SIGHUP as Ctrl-C: a killed or hung-up command cleans up the way an interrupted one does."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _raise(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt like SIGINT does."""
    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def shielded(on_interrupt: Callable[[], None]) -> Iterator[None]:
    """Within the block (a cleanup), Ctrl-C, SIGTERM and SIGHUP only call `on_interrupt`: it runs to the end."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda signum, frame: on_interrupt()) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
