"""One writer per file: result.json is written by run/outcome.record alone, the model card by
results/card.py (rank 0's export, once), rank 0's report by results/launched.py; the launching
side's record reaches the ranks typed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import cpudist
from cpudist.config import TrainConfig
from cpudist.errors import JobFailed
from cpudist.results.launched import Launched, read_card_part, write_card_part, write_report
from cpudist.results.schema import RunResult
from cpudist.run.outcome import record
from cpudist.run.request import LaunchOptions, RunRequest
from tests.unit import test_results

PACKAGE = Path(cpudist.__file__).resolve().parent
WRITES = re.compile(
    r"\.(write_text|write_bytes|replace)\(|write_atomic\(|write_private\(|open\([^)]*[\"']w")
NAMES = {  # a file of the run folder -> how the package spells it -> its one writer
    "result.json": (re.compile(r"\bRESULT\b|result\.json"), {"run/outcome.py"}),
    "model card": (re.compile(r"\bCARD\b|README\.md"), {"results/card.py"}),
    "rank report": (re.compile(r"\bRANK_REPORT\b|rank_report\.json"), {"results/launched.py"}),
}


def writers(spelled: re.Pattern[str]) -> set[str]:
    """The package's modules with a line that writes (or renames into place) a path spelled so."""
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            for line in path.read_text().splitlines()
            if WRITES.search(line) and spelled.search(line) and not line.lstrip().startswith("#")}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_each_file_of_the_run_has_one_writer(name: str) -> None:
    spelled, allowed = NAMES[name]
    assert writers(spelled) == allowed


def test_the_card_is_rendered_into_place_once_by_rank_0s_export() -> None:
    callers = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
               if re.search(r"(?<!def )\bwrite_card\(", path.read_text())}
    # not again by the launching side: --model-s3 copies this card
    assert callers == {"train/export.py"}


def result(**changes: object) -> RunResult:
    return test_results.result(2, 10.0, run_dir="/h/r", **changes,
                               data={"source": "glue-tsv", "dir": "/head/stage/abc",
                                     "train_rows": 10})


def test_record_merges_the_launching_side_into_the_rank_report_and_writes_result_json_once(
    tmp_path: Path) -> None:
    write_report(tmp_path, result())
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "README.md").write_text("rank 0's card\n")
    launched = Launched(command="cpudist run mrpc --np 2", cluster="c1", usd_per_hour=0.5,
                        data={"dir": "glue/MRPC"}, launcher="mpich", job_id="7", recoveries=1,
                        run_dir="/laptop/run", staging={"head": "h"})
    ledger = tmp_path / "ledger.jsonl"
    r = record(tmp_path, ledger, launched)
    written = json.loads((tmp_path / "result.json").read_text())
    assert written == json.loads(json.dumps(r.to_dict())) and json.loads(
        ledger.read_text()) == written
    assert (r.command, r.cluster, r.usd_per_hour, r.launcher, r.slurm_job_id, r.recoveries) == (
        "cpudist run mrpc --np 2", "c1", 0.5, "mpich", "7", 1)
    assert r.run_dir == "/laptop/run" and r.staging == {"head": "h"}
    # the user's path, rank 0's rows
    assert r.data == {"source": "glue-tsv", "dir": "glue/MRPC", "train_rows": 10}
    # rank 0's card is the final one
    assert (tmp_path / "model" / "README.md").read_text() == "rank 0's card\n"


def test_an_unset_launched_field_keeps_rank_0s_value(tmp_path: Path) -> None:
    write_report(tmp_path, result(launcher="srun"))
    r = record(tmp_path, None, Launched())
    assert r.launcher == "srun" and r.run_dir == "/h/r" and r.data["dir"] == "/head/stage/abc"


def test_no_rank_report_is_a_failed_job(tmp_path: Path) -> None:
    with pytest.raises(JobFailed, match=r"rank_report\.json"):
        record(tmp_path, None, Launched())
    assert not (tmp_path / "result.json").exists()


def test_the_card_part_reaches_rank_0_through_the_run_folder(tmp_path: Path) -> None:
    full = Launched(command="cpudist run mrpc", usd_per_hour=1.5, data={"train": "a.csv"},
                    launcher="openmpi", staging={"head": "h"}, recoveries=2, run_dir="/laptop")
    assert read_card_part(tmp_path) == Launched()  # none left: rank 0 on a host of its own
    write_card_part(tmp_path, full)
    assert read_card_part(tmp_path) == Launched(command="cpudist run mrpc", usd_per_hour=1.5,
                                                data={"train": "a.csv"}, launcher="openmpi")


def test_the_launched_record_travels_in_the_request_to_a_head() -> None:
    launched = Launched(command="cpudist run mrpc --head h", cluster="c", usd_per_hour=0.25,
                        data={"dir": "d"})
    request = RunRequest(train=TrainConfig(task="mrpc", output_dir="runs/x"),
                         launch=LaunchOptions(), launched=launched)
    assert RunRequest.from_json(request.to_json()).launched == launched
