"""Running the real `cpudist` command the way a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CPUDIST = [sys.executable, "-m", "cpudist.cli"]


def cpudist(*args: str | Path, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cpudist ARGS` to the end and capture its output."""
    return subprocess.run([*CPUDIST, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def descendants(pid: int) -> list[int]:
    """PIDs of every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def read_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    """The lines of a running command's output up to the first that holds `marker` (or to its end)."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            break
    return seen
