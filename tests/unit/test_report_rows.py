"""Reports that cannot mislead (issue 24, item 2): repeats are one row, the baseline is chosen by a
rule and named, impossible speedups are flagged with a cause, runs are filtered, and CSV/JSON carry
numbers."""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.errors import BadInput
from cpudist.results.ledger import append
from cpudist.results.render import render_csv, render_json, render_markdown
from cpudist.results.report import scaling_rows
from cpudist.results.schema import RunResult
from cpudist.results.select import RunFilter, find_run, parse_since, select
from tests.unit.test_planner import run


def at(i: int, nodes: int = 1, ppn: int = 1, sps: float = 16.0, **kw: Any) -> RunResult:
    """The i-th run of a ledger (ids and start times in order), `sps` samples/s on nodes x ppn ranks
    (4 cores each)."""
    fields: dict[str, Any] = {"run_id": f"20261126-10{i:02d}00-{i:06x}",
                              "started_at": f"2026-11-26T10:{i:02d}:00+00:00",
                              "steady_samples_per_s": sps,
                              "threads_per_rank": 4 // ppn, "metrics": {"accuracy": 0.8}}
    fields.update(kw)
    return run(nodes, ppn, step_s=32 * nodes * ppn / sps, **fields)


def test_repeats_of_a_configuration_are_one_row_median_n_and_range() -> None:
    runs = [at(0, sps=10.0), at(1, ppn=2, sps=20.0), at(2, sps=12.0), at(3, ppn=2, sps=24.0),
            at(4, sps=11.0), at(5, ppn=2, sps=21.0, metrics={"accuracy": 0.7})]
    one, two = scaling_rows(runs)
    assert (one.n, two.n) == (3, 3) and (one.ranks, two.ranks) == (1, 2)
    assert one.speedup == 1.0 and (one.speedup_min,
                                   one.speedup_max) == pytest.approx((10 / 11, 12 / 11))
    assert two.samples_per_s == 21.0 and two.speedup == pytest.approx(21 / 11)
    assert (two.speedup_min, two.speedup_max) == pytest.approx((20 / 11, 24 / 11))
    assert two.efficiency == pytest.approx(21 / 22) and two.metrics == {"accuracy": 0.8}  # medians
    # the newest
    assert two.run_ids == tuple(r.run_id for r in runs[1::2]) and two.run_id == runs[5].run_id
    assert two.date == "2026-11-26 10:05" and not two.flagged
    assert one.baseline == tuple(r.run_id for r in runs[0::2])
    assert one.baseline_why.startswith(f"the median of 3 runs {runs[0].run_id}")
    assert "(1 node, 1 rank): the fewest nodes, then ranks" in one.baseline_why
    cells = two.cells()
    assert cells[-4:] == ["3", "1.82-2.18x", f"{runs[5].run_id} +2", "2026-11-26 10:05"]


def test_default_baseline_is_fewest_nodes_then_ranks_and_a_named_one_wins_its_group() -> None:
    runs = [at(0, nodes=2, sps=30.0), at(1, ppn=2, sps=28.0), at(2, sps=16.0),
            at(3, nodes=4, sps=50.0), at(4, nodes=2, sps=30.0, model="bert-base"),
            at(5, nodes=4, sps=56.0, model="bert-base")]
    rows = scaling_rows(runs)
    mini = [r for r in rows if "minilm" in r.group]
    assert [(r.nodes, r.ranks) for r in mini] == [(1, 1), (1, 2), (2, 2), (4, 4)]
    assert {r.baseline
            for r in mini} == {(runs[2].run_id,)} and mini[2].speedup == pytest.approx(30 / 16)
    bert = [r for r in rows if "bert-base" in r.group]
    assert bert[0].baseline_why.startswith(f"{runs[4].run_id} (2 nodes, 2 ranks): the fewest "
                                           "nodes, then ranks")
    assert bert[1].speedup == pytest.approx(56 / 30) and bert[1].efficiency == pytest.approx(
        56 / 30 / 2)
    named = scaling_rows(runs, baseline=runs[1])
    assert {r.baseline for r in named if "minilm" in r.group} == {(runs[1].run_id,)}
    assert named[0].baseline_why == f"{runs[1].run_id}, named by --baseline"
    # fewer ranks: faster per rank is fine
    assert named[0].speedup == pytest.approx(16 / 28) and not named[0].flagged
    # not in its group
    assert {r.baseline for r in named if "bert-base" in r.group} == {(runs[4].run_id,)}
    wide = scaling_rows([at(6, nodes=2, ppn=1, sps=30.0, model="d"),
                         at(7, ppn=4, sps=50.0, model="d")])
    # 1 node of 4 ranks before 2 nodes of 1: nodes first
    assert wide[0].baseline == (f"20261126-100700-{7:06x}",)


CASES = {  # name: (baseline runs, the other configuration's runs, what the cause must say)
    "short run": ([at(0, sps=8.0, steps=5)], [at(1, ppn=2, sps=71.0, steps=5)],
                  "likely a short run dominated by warm-up: 5 steps"),
    "baseline warm-up": ([at(0, sps=10.0, steady_samples_per_s=20.0)], [at(1, ppn=2, sps=38.0)],
                         "the baseline's warm-up: its steady rate is 2.00x its mean over 100 "
                         "steps; on steady "
                         "samples/s (past the first steps) it is 1.90x, 95% efficiency"),
    "fewer threads": ([at(0, sps=10.0, threads_per_rank=1)],
                      [at(1, ppn=2, sps=30.0, threads_per_rank=2)],
                      "the baseline used fewer threads per node (1) than this run (4)"),
    "noisy repeats": ([at(0, sps=5.0), at(2, sps=10.0), at(3, sps=10.0)], [at(1, ppn=2, sps=30.0)],
                      "the baseline's repeats differ by 100%: a noisy machine"),
    "other CPU": ([at(0, sps=10.0, cpu={"model": "Old"})], [at(1, ppn=2, sps=30.0)],
                  "the runs ran on different CPUs (Old, Xeon)"),
    "slowed": ([at(0, sps=10.0)], [at(1, ppn=2, sps=30.0)],
               "likely a slowed baseline (another load"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_speedup_beyond_the_added_ranks_is_flagged_with_its_likely_cause(case: str) -> None:
    base, other, cause = CASES[case]
    rows = scaling_rows([*base, *other])
    assert not rows[0].flagged  # the baseline itself
    flagged = rows[1]
    assert (flagged.flagged and "is beyond what 2x the ranks allow" in flagged.check
            and cause in flagged.check)
    md = render_markdown(rows)
    assert f"! 1 node, 2 ranks: efficiency {flagged.efficiency:.0%} is beyond" in md
    assert f"| {flagged.efficiency:.0%} ! |" in md


def test_within_tolerance_and_below_ideal_nothing_is_flagged() -> None:
    rows = scaling_rows([at(0, sps=10.0), at(1, ppn=2, sps=21.5), at(2, ppn=4, sps=30.0)])
    assert [r.flagged for r in rows] == [False, False, False] and "!" not in render_markdown(rows)


def test_filters_task_since_last_and_run() -> None:
    runs = [at(i, task="rte" if i == 2 else "mrpc") for i in range(6)]
    assert [r.run_id for r in select(runs, RunFilter(tasks=("rte",)))] == [runs[2].run_id]
    since = select(runs, RunFilter(since=parse_since("2026-11-26T10:03")))
    assert [r.run_id for r in since] == [r.run_id for r in runs[3:]]
    # --last goes by start time, not the order of the sources
    shuffled = [runs[4], runs[0], runs[5], runs[1]]
    newest = [runs[4].run_id, runs[5].run_id]
    assert [r.run_id for r in select(shuffled, RunFilter(last=2))] == newest
    assert [r.run_id for r in select(runs, RunFilter(tasks=("mrpc",), last=2))] == newest
    assert select(runs, RunFilter(runs=(runs[3].run_id[:-1],))) == [runs[3]]  # a unique prefix
    assert (parse_since("7d", datetime(2026, 11, 26, tzinfo=UTC))
            == datetime(2026, 11, 19, tzinfo=UTC))
    with pytest.raises(BadInput, match="is ambiguous"):
        find_run(runs, "20261126-10")
    with pytest.raises(BadInput,
                       match="no run in the sources matches --task rte --since 2026-11-26T10:03"):
        select(runs, RunFilter(tasks=("rte",), since=parse_since("2026-11-26T10:03")))
    with pytest.raises(BadInput, match="neither a date nor an age"):
        parse_since("yesterday")


def test_csv_and_json_carry_numbers() -> None:
    rows = scaling_rows([at(0, sps=10.0, usd_per_hour=3.6), at(1, ppn=2, sps=19.0),
                         at(2, ppn=2, sps=21.0), at(3, ppn=4, sps=60.0, threads_per_rank=4)])
    text = render_csv(rows)
    numeric = ("nodes", "ranks", "speedup", "speedup_min", "speedup_max", "efficiency", "n",
               "samples_per_s", "train_time_s", "eval_accuracy", "cost_usd", "comm_share")
    try:
        import pandas as pd
    # pandas comes with datasets; without it, every numeric cell must still parse as a float
    except ImportError:
        table = list(csv.DictReader(io.StringIO(text)))
        values = {c: [float(r[c]) if r[c] else math.nan for r in table] for c in numeric}
        flagged = [r["flagged"] == "True" for r in table]
    else:
        frame = pd.read_csv(io.StringIO(text))
        assert all(pd.api.types.is_numeric_dtype(frame[c]) for c in numeric), frame.dtypes
        values = {c: list(frame[c]) for c in numeric}
        flagged = list(frame["flagged"])
    assert values["speedup"] == pytest.approx([1.0, 2.0, 6.0])
    assert values["efficiency"] == pytest.approx([1, 1, 1.5])
    assert values["n"] == [1, 2, 1] and values["speedup_min"][1] == pytest.approx(1.9)
    assert (values["cost_usd"][0] == pytest.approx(3.6 * 325 / 3600)
            and math.isnan(values["cost_usd"][1]))
    assert values["eval_accuracy"] == pytest.approx([0.8] * 3) and flagged == [False, False, True]
    data = json.loads(render_json(rows))
    assert [d["speedup"]
            for d in data] == pytest.approx([1.0, 2.0, 6.0]) and data[2]["efficiency"] == 1.5
    assert data[1]["run_ids"] == [rows[1].run_ids[0], rows[1].run_ids[1]] and data[1]["n"] == 2
    assert (data[2]["flagged"] is True
            and "fewer threads per node (4) than this run (16)" in data[2]["check"])
    assert data[0]["cost_usd"] == values["cost_usd"][0]
    assert data[0]["baseline"] == [rows[0].run_id] and "fewest nodes" in data[0]["baseline_why"]


def test_old_results_without_id_or_start_still_report(tmp_path: Path) -> None:
    old = {k: v for k, v in at(0).to_dict().items() if k not in ("run_id", "started_at")}
    (tmp_path / "ledger.jsonl").write_text(json.dumps({**old, "run_dir": "/runs/first"}) + "\n"
                                           + json.dumps(at(1, ppn=2, sps=30.0).to_dict()) + "\n")
    out = CliRunner().invoke(cli, ["report", str(tmp_path / "ledger.jsonl"), "--format", "md"])
    assert out.exit_code == 0, out.output
    # its folder's name, no date
    assert "| 1 | 1 | 1 |" in out.output and "| first | - |" in out.output
    assert "baseline: first (1 node, 1 rank)" in out.output


def test_report_cli_filters_and_names_its_baseline(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    runs = [at(0, sps=10.0), at(1, ppn=2, sps=19.0), at(2, sps=12.0, task="rte"),
            at(3, ppn=2, sps=18.0)]
    for r in runs:
        append(ledger, r)
    out = CliRunner().invoke(cli, ["report", str(ledger), "--task", "mrpc"])
    assert out.exit_code == 0, out.output
    assert (f"baseline: {runs[0].run_id} (1 node, 1 rank): the fewest nodes, then ranks, of the "
            "group" in out.output)
    assert (runs[2].run_id not in out.output and f"{runs[3].run_id} +1" in out.output
            and "started (UTC)" in out.output)
    named = CliRunner().invoke(cli,
                               ["report", str(ledger), "--last", "1", "--baseline",
                                runs[0].run_id[:-2], "--json"])
    # the named baseline joins the one run kept; JSON alone on stdout
    data = json.loads(named.output)
    assert [(d["ranks"], d["n"], d["speedup"]) for d in data] == [
        (1, 1, 1.0), (2, 1, pytest.approx(1.8))]
    assert data[1]["baseline_why"] == f"{runs[0].run_id}, named by --baseline"
    for args, message in ((["--run", "nope"], "no run nope in the sources"),
                          (["--since", "2027-01-01"],
                           "no run in the sources matches --since 2027-01-01T00:00"),
                          (["--last", "0"], "Invalid value for '--last'")):
        bad = CliRunner().invoke(cli, ["report", str(ledger), *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_lora_runs_are_their_own_group_and_plan_never_bases_a_full_fine_tune_on_one() -> None:
    from cpudist.results.planner import pick_baseline, same_job

    lora = {"method": "lora", "r": 8, "targets": ["query", "value"]}
    full, adapters = at(0, sps=10.0), at(1, sps=40.0, peft=lora)
    full4, adapters4 = at(2, nodes=4, sps=30.0), at(3, nodes=4, sps=150.0, peft=lora)
    rows = scaling_rows([full, adapters, full4, adapters4])
    groups = {r.group for r in rows}
    assert len(groups) == 2 and any("lora r=8 query,value" in g for g in groups)
    speedups = {(("lora" in r.group), r.nodes): r.speedup for r in rows}
    assert speedups[(False, 4)] == pytest.approx(3.0)
    assert speedups[(True, 4)] == pytest.approx(150 / 40)
    assert not same_job(full, adapters) and same_job(adapters, adapters4)
    assert not same_job(adapters, at(4, peft={**lora, "r": 16}))
    base, _ = pick_baseline([full, adapters])  # the newest 1-node run's job: LoRA's
    assert base.run_id == adapters.run_id
