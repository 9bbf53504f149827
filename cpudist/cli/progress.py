"""Showing a running job: a progress bar from rank 0's events, rank output as it comes."""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cpudist.wire import events

HELD_LINES = 20  # --quiet: the rank lines shown when the job fails (all are in ranks.log)


class JobView:
    """Renders events and rank lines on stderr: a live bar on a terminal, plain lines elsewhere;
    `quiet`: nothing, unless the job fails (then its last rank lines, before the error)."""

    def __init__(self, quiet: bool = False) -> None:
        self.console = Console(stderr=True)
        self.quiet = quiet
        self.live = self.console.is_terminal
        self.progress: Progress | None = None
        self.task_id: Any = None
        self.held: deque[str] = deque(maxlen=HELD_LINES)

    def show_held(self) -> None:
        """--quiet and the job failed: the last rank lines, which its error points at."""
        for line in self.held:
            print(line, file=sys.stderr, flush=True)
        self.held.clear()

    def on_line(self, line: str) -> None:
        if self.quiet:  # rank output (weight loading, ready lines, warnings): kept for a failure
            self.held.append(line)
        elif self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)

    def on_event(self, event: dict[str, Any]) -> None:
        kind = events.kind(event)
        if kind == events.START:
            total = int(event["total"])
            if self.live and not self.quiet:
                self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                         TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                         console=self.console)
                self.progress.start()
                self.task_id = self.progress.add_task("train", total=total, info="",
                                                      completed=int(event.get("step", 0)))
            else:
                done = int(event.get("step", 0))
                self._plain(f"training: {total} steps" + (f", from step {done}" if done else ""))
        elif kind == events.PROGRESS:
            info = events.progress_text(event)
            if self.progress is not None:
                self.progress.update(self.task_id, completed=event["step"], info=info)
            else:
                self._plain(f"step {event['step']}/{event['total']}  {info}")
        elif kind == events.NODES:
            self.on_line(f"[cpudist] {events.nodes_text(event)}")
        elif kind == events.WAITING:
            self.on_line(f"[cpudist] {events.waiting_text(event)}")
        elif kind == events.CHECKPOINT:
            self.on_line(f"[cpudist] checkpoint at step {event['step']}: {event['path']}")
        elif kind == events.PREEMPTED:
            self.close()
            self._plain(f"stopping at step {event['step']}: {event['reason']} on {event['host']}")
        elif kind == events.EVALUATED:  # during training (--eval-every): the bar goes on
            scores = " ".join(f"{k}={v:.4f}" for k, v in event["metrics"].items())
            if not self.quiet:
                self.on_line(f"[cpudist] evaluation at step {event['step']}: {scores}")
        elif kind == events.MODEL:
            self._plain(f"model saved: {event['path']} (step {event['step']}, "
                        f"{event['bytes'] / 1e6:.1f} MB, {event['seconds']:.1f}s)")
        elif kind == events.MODEL_S3:
            if "error" in event:  # shown even with --quiet: the copy the user asked for is missing
                print(f"[cpudist] WARNING: the model was not copied to {event['url']}: "
                      f"{event['error']} (it is in the run folder)", file=sys.stderr, flush=True)
            else:
                self._plain(f"model copied to {event['url']} ({event['files']} files, "
                            f"{event['bytes'] / 1e6:.1f} MB, {event['seconds']:.1f}s)")
        elif kind == events.EVAL:
            self.close()
            self._plain(f"evaluating on {event['rows']} rows")

    def _plain(self, text: str) -> None:
        if not self.quiet:
            print(f"[cpudist] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
