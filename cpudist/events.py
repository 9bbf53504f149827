"""Rank 0's progress events on stdout: one marked JSON line each, parsed by the runner."""

from __future__ import annotations

import json
import sys
from typing import Any

MARKER = "@@cpudist "


def emit(event: str, **fields: Any) -> None:
    """Print one event line (the runner turns these into a progress bar)."""
    sys.stdout.write(MARKER + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def parse(line: str) -> dict[str, Any] | None:
    """The event on a line of rank output, or None for ordinary output."""
    at = line.find(MARKER)
    if at < 0:
        return None
    try:
        value = json.loads(line[at + len(MARKER):])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
