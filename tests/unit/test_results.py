from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from cpudist.errors import BadInput
from cpudist.results.ledger import append, load_sources, read_ledger
from cpudist.results.render import render_csv, render_json, render_markdown
from cpudist.results.report import COLUMNS, scaling_rows
from cpudist.results.schema import RunResult


def result(world: int, sps: float, **kw: object) -> RunResult:
    base: dict[str, object] = dict(
        task="mrpc", model="tiny", world_size=world,
        nodes=tuple(f"n{i}" for i in range(max(1, world // 2))),
        ppn=min(world, 2), precision="fp32", backend="gloo", sync="ddp", per_rank_batch_size=16,
        grad_accum=1, global_batch_size=16 * world, max_seq_len=128, steps=10, train_samples=160
        * world,
        train_time_s=160 * world / sps, eval_time_s=1.0, wall_time_s=10.0, train_samples_per_s=sps,
        steady_samples_per_s=sps, train_tokens_per_s=sps * 50, metrics={"accuracy": 0.7, "f1": 0.8},
        comm_bytes_per_step=0, versions={}, cpu={}, max_steps=10, run_id=f"r{world}")
    base.update(kw)
    return RunResult(**base)  # type: ignore[arg-type]


def test_speedup_and_efficiency_against_smallest_run() -> None:
    rows = scaling_rows([result(4, 300.0), result(1, 100.0), result(2, 180.0)])
    assert [r.ranks for r in rows] == [1, 2, 4]
    assert [round(r.speedup, 3) for r in rows] == [1.0, 1.8, 3.0]
    assert [round(r.efficiency, 3) for r in rows] == [1.0, 0.9, 0.75]
    assert rows[2].samples_per_s_per_rank == 75.0


def test_groups_do_not_mix_and_baseline_is_a_median() -> None:
    runs = [result(1, 100.0), result(1, 120.0), result(1, 110.0), result(2, 220.0),
            result(2, 50.0, model="bert-base"), result(4, 150.0, model="bert-base")]
    rows = scaling_rows(runs)
    assert len({r.group for r in rows}) == 2
    tiny2 = next(r for r in rows if r.ranks == 2 and "tiny" in r.group)
    assert tiny2.speedup == pytest.approx(2.0)  # against the median of the three 1-rank runs
    bert4 = next(r for r in rows if "bert-base" in r.group and r.ranks == 4)
    assert bert4.speedup == pytest.approx(3.0) and bert4.efficiency == pytest.approx(1.5)


def test_cost_per_run() -> None:
    rows = scaling_rows([result(1, 100.0, usd_per_hour=3.6, wall_time_s=100.0), result(2, 190.0)])
    assert rows[0].cost_usd == pytest.approx(0.1) and rows[1].cost_usd is None
    cost = COLUMNS.index("$/run")
    assert rows[0].cells()[cost] == "0.1000" and rows[1].cells()[cost] == "-"


def test_renderers() -> None:
    rows = scaling_rows([result(1, 100.0), result(2, 190.0)])
    md = render_markdown(rows)
    assert "| speedup | efficiency |" in md.splitlines()[2]
    assert "1.90x" in md and "95%" in md
    assert render_csv(rows).splitlines()[0].startswith("group,task,model,sync,nodes,ranks")
    assert json.loads(render_json(rows))[1]["speedup"] == pytest.approx(1.9)


def test_ledger_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "a" / "results.jsonl"
    append(path, result(1, 100.0))
    append(path, result(2, 190.0))
    assert [r.world_size for r in read_ledger(path)] == [1, 2]
    assert read_ledger(path)[0] == result(1, 100.0)


def _append_many(path: str, world: int) -> None:
    for _ in range(50):
        append(Path(path),
               result(world, 100.0,
                      metrics={"accuracy": 0.5, "pad": "x" * 5000}))  # type: ignore[dict-item]


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    procs = [multiprocessing.Process(target=_append_many, args=(str(path), w))
             for w in (1, 2, 3, 4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sorted(r.world_size for r in read_ledger(path)) == sorted([1, 2, 3, 4] * 50)


def test_bad_ledger_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    append(path, result(1, 100.0))
    with path.open("a") as f:
        f.write("{not json\n")
    with pytest.raises(BadInput, match=r"results.jsonl:2"):
        read_ledger(path)


def test_sources_from_run_folders(tmp_path: Path) -> None:
    for w in (1, 2):
        (tmp_path / f"run{w}").mkdir()
        (tmp_path / f"run{w}" / "result.json").write_text(
            json.dumps(result(w, 100.0 * w).to_dict()))
    assert len(load_sources([tmp_path])) == 2
    assert len(load_sources([tmp_path / "run1"])) == 1
    with pytest.raises(BadInput, match="no such ledger"):
        load_sources([tmp_path / "missing"])
