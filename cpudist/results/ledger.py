"""The results ledger: one RunResult per JSON line, only ever appended."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.results.schema import RunResult
from cpudist.wire import names


def append(path: Path, result: RunResult) -> None:
    """Append one result as a single write under an exclusive lock, so lines never interleave."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(result.to_dict(), sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock


def _parse(text: str, where: str) -> RunResult:
    try:
        return RunResult.from_dict(json.loads(text))
    except (json.JSONDecodeError, TypeError) as e:
        raise BadInput(f"unreadable result at {where}: {e}",
                       "Remove or fix that line; the ledger keeps one JSON object "
                       "per line") from None


def read_ledger(path: Path) -> list[RunResult]:
    """Every result in a ledger, oldest first."""
    lines = path.read_text().splitlines()
    return [_parse(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]


def read_result(path: Path) -> RunResult:
    """The result.json of one run."""
    return _parse(path.read_text(), str(path))


def load_sources(paths: Iterable[Path]) -> list[RunResult]:
    """Results from ledgers (.jsonl), result.json files, run folders, or folders of run folders."""
    out: list[RunResult] = []
    for path in paths:
        if path.is_dir():
            found = sorted([path / names.RESULT] if (path / names.RESULT).is_file()
                           else path.glob(f"*/{names.RESULT}"))
            if not found:
                raise BadInput(f"no result.json in {path}", "Give a run folder, or a ledger file")
            out += [read_result(p) for p in found]
        elif path.is_file():
            out += read_ledger(path) if path.suffix == ".jsonl" else [read_result(path)]
        else:
            raise BadInput(f"no such ledger or run folder: {path}",
                           "Run `cpudist run` first, or pass the ledger/run folder to report")
    return out
