"""The stop marker: rank 0's record that the ranks stopped on purpose after a checkpoint because
something other than the user asked (a scheduler's or the machine's SIGTERM, a spot notice), and the
request by which the launching side tells rank 0 that a stop is the user's (a user's stop leaves no
marker: nothing was preempted).

    <run folder>/preempted.json   {"step", "checkpoint", "reason", "host"}: read by the launching
                                  side, Slurm's batch script (requeue) and --on-preemption resume
    <run folder>/stop.request     empty: the launching side stops the ranks on the user's word

This module is the one that names, writes, reads and clears both; it imports nothing of cpudist.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NAME = "preempted.json"
REQUEST = "stop.request"
FIELDS = ("step", "checkpoint", "reason", "host")


@dataclass(frozen=True)
class Stop:
    """Where the ranks stopped on purpose: the step, the checkpoint saved there, why and on which
    host."""

    step: int
    checkpoint: str
    reason: str
    host: str

    def said(self, where: str = "") -> str:
        return (f"the ranks stopped at step {self.step} ({self.reason} on {self.host}) after "
                f"saving {Path(self.checkpoint).name}{where}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stop:
        return cls(int(data["step"]), str(data["checkpoint"]), str(data["reason"]),
                   str(data["host"]))


def write(folder: Path, stop: Stop) -> None:
    """Leave the marker in `folder`, whole or not at all (written aside, then renamed)."""
    path = folder / NAME
    tmp = path.with_name(f".{NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(stop.to_dict()) + "\n")
    tmp.replace(path)


def read(folder: Path) -> Stop | None:
    """The marker in `folder`, or None when there is none (or it cannot be read)."""
    try:
        return Stop.from_dict(json.loads((folder / NAME).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def exists(folder: Path) -> bool:
    return (folder / NAME).is_file()


def clear(folder: Path) -> None:
    """Remove an earlier part's marker and stop request from `folder` (a new part starts, or its
    files come home)."""
    for name in (NAME, REQUEST):
        (folder / name).unlink(missing_ok=True)


def ask(folder: Path) -> None:
    """Tell rank 0 (which runs where `folder` is) that the stop it is about to see is the user's."""
    # a folder gone or full: the stop still happens, named as a preemption
    with contextlib.suppress(OSError):
        (folder / REQUEST).touch()


def asked(folder: Path) -> bool:
    """Whether the launching side asked for the stop (the user's), rather than a scheduler or the
    machine."""
    return (folder / REQUEST).is_file()
