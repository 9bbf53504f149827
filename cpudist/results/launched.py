"""What only the launching side knows of a run, and rank 0's report: the two halves of result.json.

`Launched` is built once where the run starts (run/start.py), before staging moves the user's paths
to the nodes' copies, and grows as the launch learns more (the launcher, a scheduler's job id, the
staging, the model fetched home). Its card part is known before the ranks start: the launch leaves
it in the run folder (LAUNCHED), where rank 0 reads it, so the model card rank 0 writes (and
--model-s3 copies) is the final one. Rank 0 writes its report (RANK_REPORT); run/outcome.record
alone merges the two into result.json.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpudist.results.schema import RunResult

LAUNCHED = "launched.json"  # the card part, in the run folder while the ranks run
# rank 0's RunResult (a script's from its metric file), before the outcome's merge
RANK_REPORT = "rank_report.json"
CARD_FIELDS = ("command", "cluster", "usd_per_hour", "data", "launcher")
# a field that result.json (and every ledger) names otherwise
RESULT_NAMES = {"job_id": "slurm_job_id"}


@dataclass(kw_only=True, frozen=True)
class Launched:
    """The launching side's part of a run's record; unset fields leave rank 0's values."""

    command: str = ""  # the `cpudist run` command line, as typed (the card shows it)
    cluster: str | None = None
    usd_per_hour: float | None = None  # the price of the nodes (the card's cost)
    # the user's data paths as given, not the nodes' copies
    data: dict[str, str] = field(default_factory=dict)
    launcher: str = ""
    job_id: str | None = None  # a scheduler's job (result.json: slurm_job_id)
    recoveries: int = 0  # --on-preemption resume
    time_lost_s: float = 0.0
    # what a run from outside the cluster sent
    staging: dict[str, Any] = field(default_factory=dict)
    # where the run is recorded, when not where the ranks wrote (a laptop's folder)
    run_dir: str = ""
    model_dir: str = ""  # the model fetched home, when it was
    # --elastic: the planned nodes and their ranks (each node's rank is in a world of its own)
    nodes: list[str] = field(default_factory=list)
    world_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Launched:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def card_part(self) -> Launched:
        """What the model card shows: known before the ranks start."""
        return Launched(**{k: getattr(self, k) for k in CARD_FIELDS})

    def apply(self, r: RunResult) -> RunResult:
        """Rank 0's result with what this side knows (the user's data paths over the copies the
        ranks read)."""
        default = Launched()
        changes = {RESULT_NAMES.get(k, k): v for k, v in self.to_dict().items()
                   if v != getattr(default, k)}
        return r.with_updates(**{**changes, "data": {**r.data, **self.data}})


def write_card_part(out: Path, launched: Launched) -> None:
    """Leave the card part where rank 0 reads it, before the ranks start."""
    out.mkdir(parents=True, exist_ok=True)
    (out / LAUNCHED).write_text(json.dumps(launched.card_part().to_dict()) + "\n")


def read_card_part(run_dir: Path) -> Launched:
    """The card part rank 0 renders the card with (empty when the launch left none: rank 0 on
    another host)."""
    try:
        return Launched.from_dict(json.loads((run_dir / LAUNCHED).read_text()))
    except (OSError, ValueError):
        return Launched()


def write_report(out: Path, r: RunResult) -> Path:
    """Rank 0's report (atomically: the launching side never reads half of one)."""
    tmp = out / (RANK_REPORT + ".tmp")
    tmp.write_text(json.dumps(r.to_dict(), indent=2) + "\n")
    return tmp.replace(out / RANK_REPORT)


def read_report(out: Path) -> RunResult | None:
    """Rank 0's report; None when the ranks wrote none."""
    path = out / RANK_REPORT
    return RunResult.from_dict(json.loads(path.read_text())) if path.is_file() else None
