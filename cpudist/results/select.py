"""Which runs a report or a plan reads: a run named by its id (or a unique prefix of one), and the
filters `--task`, `--since`, `--last N` and `--run ID`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.results.schema import RunResult

AGO = re.compile(r"^(\d+)([dhm])$")  # --since 7d, 12h, 30m
UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def peft_label(r: RunResult) -> str:
    """'lora r=8 q,v' for a LoRA run ('' for a full fine-tune): its adapters decide its work and its
    bytes."""
    if not r.peft:
        return ""
    targets = ",".join(str(t) for t in r.peft.get("targets", ()))
    return f"lora r={r.peft.get('r')}" + (f" {targets}" if targets else "")


def run_name(r: RunResult) -> str:
    """The run's id; results written before runs had ids go by their folder's name."""
    return r.run_id or (Path(r.run_dir).name if r.run_dir else "")


def started(r: RunResult) -> datetime | None:
    """When the run started (UTC), None when it did not record it."""
    try:
        when = datetime.fromisoformat(r.started_at)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def find_run(runs: Sequence[RunResult], wanted: str) -> RunResult:
    """The run whose id is `wanted`, or the only one that starts with it (the newest result of that
    run)."""
    exact = [r for r in runs if run_name(r) == wanted]
    found = exact or [r for r in runs if wanted and run_name(r).startswith(wanted)]
    ids = sorted({run_name(r) for r in found})
    if not found:
        raise BadInput(f"no run {wanted} in the sources",
                       "Give its id as `cpudist runs` lists it, its run folder, or a ledger that "
                       "holds it")
    if len(ids) > 1:
        raise BadInput(f"run {wanted} is ambiguous: "
                       f"{', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}",
                       "Give more of its id")
    return found[-1]


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A date or time in ISO form (UTC when no zone is given), or an age: 7d, 12h, 30m."""
    ago = AGO.match(text.strip())
    if ago:
        return (now or datetime.now(UTC)) - timedelta(**{UNITS[ago.group(2)]: int(ago.group(1))})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadInput(f"--since {text!r} is neither a date nor an age",
                       "Write it like --since 2026-11-24, --since 2026-11-24T10:00 "
                       "or --since 7d") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RunFilter:
    """What to keep: every condition given must hold; `last` then keeps the newest of what is
    left."""

    tasks: tuple[str, ...] = ()
    since: datetime | None = None
    last: int | None = None
    runs: tuple[str, ...] = ()  # ids or unique prefixes

    def describe(self) -> str:
        parts = (([f"--task {','.join(self.tasks)}"] if self.tasks else [])
                 + ([f"--since {self.since.isoformat(timespec='minutes')}"] if self.since else [])
                 + ([f"--run {' '.join(self.runs)}"] if self.runs else [])
                 + ([f"--last {self.last}"] if self.last else []))
        return " ".join(parts)


def by_start(runs: Sequence[RunResult]) -> list[RunResult]:
    """Oldest first by start time; runs without one first, in the order the sources gave them."""
    floor = datetime.min.replace(tzinfo=UTC)
    return [r for _, r in sorted(enumerate(runs), key=lambda ir: (started(ir[1]) or floor, ir[0]))]


def select(runs: Sequence[RunResult], f: RunFilter) -> list[RunResult]:
    """The runs that pass the filter, in the sources' order; an empty answer is an error that names
    the filter."""
    named = {run_name(find_run(runs, wanted)) for wanted in f.runs}
    since = f.since
    kept = [r for r in runs if (not f.tasks or r.task in f.tasks)
            and (since is None or ((s := started(r)) is not None and s >= since))
            and (not f.runs or run_name(r) in named)]
    if f.last is not None:
        newest = {id(r) for r in by_start(kept)[max(0, len(kept) - f.last):]}
        kept = [r for r in kept if id(r) in newest]
    if not kept:
        raise BadInput(f"no run in the sources matches {f.describe()}",
                       f"{len(runs)} run(s) were read; `cpudist runs` lists them with their ids "
                       "and start times")
    return kept
