"""`cpudist runs`: every run from the run folders' run.json (any state) and the ledger (finished
runs without a folder here), once each."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner, Result

from cpudist.cli.main import cli
from cpudist.config import TrainConfig
from cpudist.results import ledger
from cpudist.run.life import identity
from cpudist.run.life.identity import RunInfo
from cpudist.run.life.listing import duration_text, list_runs
from tests.unit.test_planner import run as a_result


def cpudist(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def started(out: Path, run_id: str, when: str, model: str = "tiny") -> None:
    identity.write_run(out,
                       RunInfo(id=run_id, task="mrpc", model=model, where="here", state="running",
                               started_at=when, run_dir=str(out)))


def test_runs_lists_every_state_and_the_ledgers_older_runs_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    started(runs / "a", "20261126-090000-aaaaaa", "2026-11-26T09:00:00+00:00")
    identity.mark(runs / "a", "preempted", message="the ranks stopped at step 3")
    started(runs / "sweep" / "nodes1", "20261126-091000-bbbbbb", "2026-11-26T09:10:00+00:00")
    identity.mark(runs / "sweep" / "nodes1", "finished", metrics={"accuracy": 0.75})
    cfg = TrainConfig(task="sst2", output_dir=str(runs / "c"), model="tiny",
                      run_id="20261126-092000-cccccc")
    identity.begin(cfg, "cluster:demo")  # still running
    book = tmp_path / "results.jsonl"
    old = dataclasses.replace(a_result(1), run_id="mrpc-tiny-np1-20261101",
                              started_at="2026-11-01T08:00:00+00:00",
                              run_dir="/elsewhere/mrpc-tiny-np1-20261101")
    ledger.append(book, old)  # a run from before run.json: the ledger is all there is of it
    # also a folder
    ledger.append(book, dataclasses.replace(old, run_id="20261126-091000-bbbbbb", run_dir=""))
    earlier = dataclasses.replace(old, run_id="20261120-070000-dddddd",
                                  started_at="2026-11-20T07:00:00+00:00", run_dir=str(runs / "a"))
    ledger.append(book, earlier)  # a finished run whose folder a later run took over: still listed

    out = cpudist("runs", runs, "--ledger", book, "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(r["id"], r["state"]) for r in rows] == [
        ("mrpc-tiny-np1-20261101", "finished"), ("20261120-070000-dddddd", "finished"),
        ("20261126-090000-aaaaaa", "preempted"), ("20261126-091000-bbbbbb", "finished"),
        ("20261126-092000-cccccc", "running")]
    assert rows[2]["message"] == "the ranks stopped at step 3" and rows[2]["duration_s"] is not None
    assert rows[3]["metrics"] == {"accuracy": 0.75} and rows[4]["where"] == "cluster:demo"
    assert rows[0]["duration_s"] == old.wall_time_s and rows[0]["task"] == old.task

    text = cpudist("runs", runs, "--ledger", book)
    assert text.exit_code == 0
    header, *lines = text.output.splitlines()
    assert header.split() == ["id", "task", "model", "where", "state", "start", "duration",
                              "metric"]
    assert len(lines) == 5 and "preempted" in lines[2] and "accuracy=0.7500" in lines[3]


def test_a_running_runs_duration_runs_to_now_and_nothing_is_one_line(tmp_path: Path) -> None:
    started(tmp_path / "runs" / "a", "20261126-090000-aaaaaa", "2026-11-26T09:00:00+00:00")
    [row] = list_runs([tmp_path / "runs"], [], now=datetime(2026, 11, 26, 10, 2, 5, tzinfo=UTC))
    assert row.duration_s == 3725 and duration_text(row.duration_s) == "1h02m"
    assert duration_text(185) == "3m05s" and duration_text(42) == "42s" and duration_text(
        None) == "-"
    empty = cpudist("runs", tmp_path / "nothing", "--ledger", tmp_path / "none.jsonl")
    assert empty.exit_code == 0 and "no runs yet" in empty.output
