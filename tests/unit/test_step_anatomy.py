"""Where a step goes: step_anatomy's arithmetic, the sync's CPU clock, `report --anatomy`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.results.ledger import append
from cpudist.train.anatomy import PARTS, StepLog, mismatch, step_anatomy
from cpudist.train.exchange import CommClock
from tests.unit.test_results import result


def logged(exposed: list[float], cpu: list[float], agreed: list[float], loop_s: float,
           eval_s: float) -> StepLog:
    log = StepLog(loop_s=loop_s, eval_s=eval_s)
    for e, c, a in zip(exposed, cpu, agreed, strict=True):
        log.step(e, c)
        log.agree(a)
    return log


def test_parts_of_rank_0s_step() -> None:
    # rank 0 waited 0.3 + 0.1 and 0.2 + 0.0; rank 1 (slowest in step 1) 0.1, rank 2 (in step 2) 0.2
    log = logged([0.3, 0.2], [0.05, 0.15], [0.1, 0.0], loop_s=2.6, eval_s=0.4)
    a = step_anatomy([1.0, 1.2], log, [log.waits(), [0.1, 0.5], [0.3, 0.2]])
    assert a["steps"] == 2
    assert a["compute_s"] == pytest.approx(((1.0 - 0.3 - 0.05) + (1.2 - 0.2 - 0.15)) / 2)
    assert a["sync_cpu_s"] == pytest.approx(0.1)
    assert a["wire_s"] == pytest.approx((0.1 + 0.2) / 2)  # the least wait over the ranks, per step
    assert a["wait_s"] == pytest.approx(((0.4 - 0.1) + (0.2 - 0.2)) / 2)
    assert a["eval_s"] == pytest.approx(0.2)
    assert a["sum_s"] == pytest.approx(sum(a[k] for k in PARTS))
    # the parts hold the steps, agreements and evaluations: the loop's clock, less its bookkeeping
    assert a["sum_s"] == pytest.approx((1.0 + 1.2 + 0.1 + 0.4) / 2)
    assert a["step_s"] == pytest.approx(1.3)
    assert mismatch(a) == pytest.approx(1.35 / 1.3 - 1)


def test_one_rank_has_no_wire_and_no_wait() -> None:
    log = logged([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], loop_s=0.93, eval_s=0.0)
    a = step_anatomy([0.3, 0.3, 0.3], log, [log.waits()])
    assert (a["wire_s"], a["wait_s"], a["sync_cpu_s"]) == (0.0, 0.0, 0.0)
    assert a["compute_s"] == pytest.approx(0.3)
    assert step_anatomy([], StepLog(), [[]]) == {} and mismatch({}) is None


def test_an_elastic_nodes_wire_is_told_by_part() -> None:
    """--elastic's loop notes what its wire time is made of: the parts' means over the steps, which
    add up to the wire's (one node per world: its own wait is the least)."""
    log = StepLog(loop_s=4.0)
    for quorum, exchange, commit in ((0.1, 0.5, 0.02), (0.3, 0.7, 0.04)):
        log.step(quorum + exchange + commit, 0.05)
        log.parts(quorum_s=quorum, allreduce_s=exchange, commit_s=commit)
    a = step_anatomy([2.0, 2.0], log, [log.waits()])
    assert a["wire_parts"] == pytest.approx({"quorum_s": 0.2, "allreduce_s": 0.6,
                                             "commit_s": 0.03})
    assert sum(a["wire_parts"].values()) == pytest.approx(a["wire_s"])
    assert "wire_parts" not in step_anatomy([2.0], logged([0.1], [0.0], [0.0], 2.0, 0.0), [[0.1]])


def test_sync_cpu_work_leaves_out_the_collectives_it_waited_for() -> None:
    clock = CommClock()
    with clock.work():
        start = clock.started()
        time.sleep(0.05)  # stands for a blocking all-reduce
        clock.blocking(start)
    assert clock.exposed_s >= 0.05 and clock.cpu_s < 0.02


def test_report_shows_the_anatomy_only_when_asked(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    parts = {"compute_s": 0.6, "sync_cpu_s": 0.05, "wire_s": 0.2, "wait_s": 0.1, "eval_s": 0.05,
             "sum_s": 1.0, "step_s": 0.98, "steps": 10}
    one = {**parts, "wire_s": 0.0, "wait_s": 0.0, "sum_s": 0.7, "step_s": 0.7}
    append(ledger, result(1, 100.0, step_anatomy=one))
    append(ledger, result(4, 300.0, step_anatomy=parts))
    plain = CliRunner().invoke(cli, ["report", str(ledger)], terminal_width=200)
    assert plain.exit_code == 0 and "wait for slowest" not in plain.output
    shown = CliRunner().invoke(cli, ["report", str(ledger), "--anatomy"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "where a step goes on rank 0" in shown.output and "wait for slowest" in shown.output
    assert "0.100 (10%)" in shown.output and "1.000 (+2.0%)" in shown.output
    md = CliRunner().invoke(cli, ["report", str(ledger), "--anatomy", "--format", "md"]).output
    assert "| 2 | 4 | ddp | 0.980 | 0.600 (61%) |" in md
    shown = CliRunner().invoke(cli, ["report", str(ledger), "--anatomy", "--format", "json"])
    rows = json.loads(shown.output)
    assert [r["step_anatomy_wait_s"] for r in rows] == [0.0, 0.1]
