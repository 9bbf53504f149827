"""Rank 0's two events around a checkpoint write, and the launching side's reading of them: a stop
that lands while a checkpoint is being written waits for it to be whole
(cpudist/launch/runner.py)."""

from __future__ import annotations

from typing import Any

from cpudist.wire import events


class Saving:
    """Whether rank 0 is writing a checkpoint: a `saving` event seen, its `checkpoint` event not
    yet."""

    def __init__(self) -> None:
        self.step: int | None = None

    def see(self, event: dict[str, Any]) -> None:
        if events.kind(event) == events.SAVING:
            self.step = int(event.get("step", 0))
        elif events.kind(event) == events.CHECKPOINT:
            self.step = None

    def busy(self) -> bool:
        return self.step is not None
