"""steps.jsonl, one line per optimizer step: its one writer, for rank 0 of a run and for each node
of an elastic run.

A resumed run keeps the lines of the steps up to its checkpoint (those after it are trained again);
an elastic node started again keeps every line it logged, and takes from the live peer it heals
from the lines of the steps trained while it was away. Either way a line half written when a
process was killed is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# the lines of the last steps an elastic node hands a joiner with its state (what a node away
# longer misses of the record stays missing from its steps.jsonl)
STEPS_TAIL = 20_000


def _steps(lines: list[str]) -> list[tuple[int, str]]:
    """(step, line) of the whole lines (a process killed mid-write leaves a partial last one)."""
    found = []
    for line in lines:
        try:
            found.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError):
            continue
    return found


class StepsLog:
    """steps.jsonl at `path`, keeping the earlier lines of the steps through `keep_through` (0:
    none, a fresh run; None: all, an elastic node started again)."""

    def __init__(self, path: Path, keep_through: int | None) -> None:
        self.path = path
        kept = (_steps(path.read_text().splitlines())
                if keep_through != 0 and path.is_file() else [])
        self.file = path.open("w")
        self._write([line for step, line in kept if keep_through is None or step <= keep_through])

    def add(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(row) + "\n")

    def flush(self) -> None:
        self.file.flush()

    def _write(self, lines: list[str]) -> None:
        self.file.write("".join(line + "\n" for line in lines))
        self.file.flush()

    def _logged(self) -> list[tuple[int, str]]:
        self.file.flush()
        return _steps(self.path.read_text().splitlines())

    def tail(self) -> list[str]:
        """The last STEPS_TAIL lines, for a joiner."""
        return [line for _, line in self._logged()[-STEPS_TAIL:]]

    def fill(self, lines: list[str]) -> None:
        """A peer's lines of the steps after this node's last logged one."""
        logged = self._logged()
        last = logged[-1][0] if logged else 0
        self._write([line for step, line in _steps(lines) if step > last])

    def close(self) -> None:
        self.file.close()
