"""Every run this machine knows of, for `cpudist runs`: the run folders' run.json, and the ledger's
finished runs that have none (runs from before run.json). Pure but for reading those files.

    runs/<run>/run.json             a run started here (or from here, on a cluster), in whatever
                                    state it is
    runs/<sweep>/nodesN/run.json    a sweep's runs
    ~/.cpudist/results.jsonl        the ledger: finished runs only
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpudist.launch.kinds import scheduled
from cpudist.results.schema import RunResult
from cpudist.run.life.identity import RunInfo, read_run
from cpudist.wire import names


@dataclass(kw_only=True, frozen=True)
class RunRow:
    """One run as `cpudist runs` lists it."""

    id: str
    task: str
    model: str
    where: str
    state: str
    started_at: str
    duration_s: float | None  # None: unknown (no start time)
    metrics: dict[str, float] = field(default_factory=dict)
    run_dir: str = ""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def row_of_info(info: RunInfo, now: datetime) -> RunRow:
    """A run.json as a row; a running run's duration runs to `now`."""
    start, end = _parse_time(info.started_at), _parse_time(info.ended_at)
    end = end or (now if info.state == "running" else None)
    duration = (end - start).total_seconds() if start and end else None
    return RunRow(id=info.id, task=info.task, model=info.model, where=info.where, state=info.state,
                  started_at=info.started_at, duration_s=duration,
                  metrics=dict(info.metrics), run_dir=info.run_dir, message=info.message)


def row_of_result(result: RunResult) -> RunRow:
    """A ledger line (a finished run) as a row."""
    where = f"cluster:{result.cluster}" if result.cluster else result.launcher if scheduled(
        result.launcher) else "here"
    return RunRow(id=result.run_id, task=result.task, model=result.model, where=where,
                  state="finished", started_at=result.started_at, duration_s=result.wall_time_s,
                  metrics=dict(result.metrics), run_dir=result.run_dir)


def run_files(folders: Iterable[Path]) -> list[Path]:
    """run.json files in run folders, folders of run folders, and sweeps' folders inside those."""
    found: list[Path] = []
    for folder in folders:
        for pattern in (names.RUN, f"*/{names.RUN}", f"*/*/{names.RUN}"):
            found += sorted(folder.glob(pattern))
    return list(dict.fromkeys(found))


def list_runs(folders: Sequence[Path], ledger: Sequence[RunResult],
              now: datetime | None = None) -> list[RunRow]:
    """Every run in the folders and the ledger, once each (run.json wins), oldest start first."""
    now = now or datetime.now(UTC)
    rows = [row_of_info(info, now) for path in run_files(folders)
            if (info := read_run(path.parent)) is not None]
    seen_ids = {r.id for r in rows}
    for result in ledger:  # by id only: a folder reused by a later run still lists the earlier one
        if result.run_id in seen_ids:
            continue
        seen_ids.add(result.run_id)
        rows.append(row_of_result(result))
    return sorted(rows,
                  key=lambda r: (_parse_time(r.started_at) or datetime.min.replace(tzinfo=UTC),
                                 r.id))


def duration_text(seconds: float | None) -> str:
    """1h02m, 3m05s, 42s; '-' when unknown."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def metric_text(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items()) or "-"
