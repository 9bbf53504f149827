"""`cpudist report` of `cpudist launch` runs: a script run's group names its command and only what
its metric file handed back (not the trainer's empty batch, sequence and length), and runs of one
command on 1 and 2 nodes compare."""

from __future__ import annotations

from cpudist.results.report import group_key, scaling_rows
from cpudist.results.schema import RunResult
from cpudist.run.script_result import Ranks, build


def _run(nodes: int, per_s: float, given: dict[str, object]) -> RunResult:
    hosts = tuple(f"n{i}" for i in range(nodes))
    ranks = Ranks(command=("python", "train.py"), world_size=nodes, ppn=1, rank_hosts=hosts,
                  rank_threads=(2,) * nodes, wall_time_s=10.0,
                  started_at="2026-11-26T10:00:00", run_id=f"r{nodes}", run_dir=f"/runs/{nodes}")
    return build(ranks, {**given, "train_samples_per_s": per_s}, {}, {"launcher": "mpich"})


def test_a_script_runs_group_says_what_the_script_said_and_nothing_empty() -> None:
    bare = _run(1, 10.0, {})
    assert group_key(bare) == "script python train.py"
    told = _run(1, 10.0,
                {"per_rank_batch_size": 8, "max_seq_len": 128, "epoch": 1.0, "precision": "bf16"})
    assert group_key(told) == "script python train.py bf16 batch/rank=8x1 seq=128"


def test_one_commands_runs_on_1_and_2_nodes_give_a_speedup() -> None:
    """HF Trainer's all_results.json of --max_steps 4 says epoch 0.5 on 1 rank and 1.0 on 2 (the
    global batch grew): still one group (a sweep of a Trainer script on 4 namespace hosts gave three
    one-row tables)."""
    rows = scaling_rows([_run(1, 10.0, {"epoch": 0.5}), _run(2, 18.0, {"epoch": 1.0})])
    assert [(r.nodes, round(r.speedup, 2)) for r in rows] == [(1, 1.0), (2, 1.8)]
    assert {r.group for r in rows} == {"script python train.py"}
