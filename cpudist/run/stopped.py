"""What a stopped run can go on from, said the same way in the terminal, run.json, `cpudist runs`,
`logs` and `stop`.

    StopSeen     rank 0's `stopped` (the user's) or `preempted` event, kept as the run's output
                 goes by
    resume_command(command, run dir)   the run's own command with --resume auto
                                       --output-dir <its folder>
    after_stop(...)                    (what happened, what to do): the checkpoint to resume,
                                       else start over
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from cpudist.run.request import Callbacks
from cpudist.train.checkpoint_meta import complete_checkpoints, step_of
from cpudist.wire import events
from cpudist.wire.stop_marker import Stop


class StopSeen:
    """The last stop event of rank 0 among a run's events (the user's stop leaves no marker file to
    read)."""

    def __init__(self) -> None:
        self.stop: Stop | None = None

    def wrap(self, cb: Callbacks) -> Callbacks:
        def on_event(event: dict[str, Any]) -> None:
            if events.kind(event) in events.STOPS:
                self.stop = Stop.from_dict(event)
            cb.on_event(event)

        return dataclasses.replace(cb, on_event=on_event)

    def __call__(self) -> Stop | None:
        return self.stop


def resume_command(command: str, run_dir: str) -> str:
    """The run's command with --resume auto --output-dir <its folder> (instead of any it had)."""
    words = shlex.split(command) if command else ["cpudist", "run", "<the same options>"]
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in ("--output-dir", "--resume"):
            skip = True
        elif not word.startswith(("--output-dir=", "--resume=")):
            kept.append(word)
    return shlex.join([*kept, "--resume", "auto", "--output-dir", run_dir]).replace(
        "'<the same options>'", "<the same options>")


def after_stop(stop: Stop | None, checkpoints: Path | None, command: str,
               run_dir: Path) -> tuple[str, str]:
    """(what it left, the resume command or ''): the stop's checkpoint, else the newest complete one
    of the run folder's checkpoints, else nothing to resume."""
    if stop is not None:
        return stop.said(), resume_command(command, str(run_dir))
    found = complete_checkpoints(checkpoints) if checkpoints is not None else []
    if found:
        step = step_of(found[0].name)
        return (f"the newest complete checkpoint is {found[0].name} (step {step})",
                resume_command(command, str(run_dir)))
    return "it left no checkpoint", ""


def hint(resume: str) -> str:
    """The hint after a stop: the exact resume command, or how to start over."""
    return f"Resume: {resume}" if resume else "Re-run the command to start over"

