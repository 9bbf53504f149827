"""The planner's model, recommendation and validation, on hand-computed cases."""

from __future__ import annotations

import dataclasses

import pytest

from cpudist.errors import BadInput
from cpudist.results.catalogue import recommend, strategies
from cpudist.results.planner import (
    Baseline,
    Link,
    baseline_of,
    comm_time,
    pick_baseline,
    plan,
    predict,
    sync_of,
)
from cpudist.results.schema import RunResult
from cpudist.results.validation import GOAL, measured_overlap, measured_sync_cpu, validate
from cpudist.strategies import SyncSpec, parse_label

MB100 = ((5000, 5000),)  # 25e6 fp32 values: 100 MB of gradients
GBIT = Link(1.0, latency_s=0.0)


def base(compute_s: float = 2.0, ppn: int = 1, shapes: tuple[tuple[int, ...], ...] = MB100,
         price: float | None = None) -> Baseline:
    return Baseline(run_id="b", compute_s=compute_s, ppn=ppn, samples_per_step=32, samples=3200,
                    steps=100, shapes=shapes, shapes_known=True, usd_per_node_hour=price,
                    dataset_samples=None)


def run(nodes: int = 1, ppn: int = 1, step_s: float = 2.0, steps: int = 100,
        **kw: object) -> RunResult:
    """A result.json with realistic fields: per-rank batch 32, `steps` steps of `step_s` seconds."""
    world = nodes * ppn
    fields: dict[str, object] = dict(
        task="mrpc", model="minilm-l6", world_size=world,
        nodes=tuple(f"n{i}" for i in range(nodes)), ppn=ppn,
        precision="bf16", backend="gloo", sync="ddp", per_rank_batch_size=32, grad_accum=1,
        global_batch_size=32 * world, max_seq_len=128, steps=steps, train_samples=32 * world
        * steps,
        train_time_s=step_s * steps, eval_time_s=1.0, wall_time_s=step_s * steps + 5,
        train_samples_per_s=32 * world / step_s, steady_samples_per_s=32 * world / step_s,
        train_tokens_per_s=0.0, metrics={}, comm_bytes_per_step=0, versions={},
        cpu={"model": "Xeon"},
        run_id=f"r{nodes}x{ppn}", started_at=f"2026-01-0{nodes}T00:00:00", param_shapes=MB100,
        grad_bytes=10**8,
        max_steps=steps)
    fields.update(kw)
    return RunResult(**fields)  # type: ignore[arg-type]


def test_the_briefs_case_four_nodes_100mb_one_gbit() -> None:
    # ring: 2(N-1)/N x 100 MB = 150 MB per link = 1.2 s at 1 Gbit/s; f = 0.5 hides 0.6 s of it
    assert comm_time(SyncSpec(), MB100, 4, 1, 100, GBIT) == pytest.approx(1.2)
    p = predict(base(), SyncSpec(), 4, GBIT, overlap=0.5, steps=25)
    assert p.step_s == pytest.approx(2.6)
    assert p.speedup == pytest.approx(4 * 2 / 2.6)
    assert p.efficiency == pytest.approx(2 / 2.6)
    assert p.time_s == pytest.approx(25 * 2.6)


def test_each_strategy_prices_its_own_bytes_and_overlap() -> None:
    b = base()
    step = {s.label: predict(b, s, 4, GBIT, overlap=0.5, steps=80).step_s for s in strategies(2, 8)}
    assert step["ddp+bf16"] == pytest.approx(2 + 0.5 * 0.6)  # half the bytes, half of it hidden
    assert step["allreduce"] == pytest.approx(3.2)  # the same bytes as DDP, none hidden
    # 3 copies in, then 3 out of the head's link
    assert step["gather-scatter"] == pytest.approx(2 + 2 * 3 * 0.8)
    assert step["local-sgd:8"] == pytest.approx(2 + 1.2 / 8)  # one average every 8 steps
    # PowerSGD rank 2 of a 5000 x 5000 matrix: (5000 + 5000) x 2 values; fp32 during its 2 start
    # steps
    compressed = 2 * 3 / 4 * 4 * 20000 * 8 / 1e9
    assert step["ddp+powersgd:2"] == pytest.approx(2 + 0.5 * (2 * 1.2 + 78 * compressed) / 80)


def test_latency_per_collective_and_ranks_per_node() -> None:
    slow = Link(1.0, latency_s=0.001)
    # 100 MB in DDP buckets: a 1 MiB first bucket, then 25 MB ones: 5 collectives
    assert comm_time(SyncSpec(), MB100, 4, 1, 10, slow) == pytest.approx(1.2 + 0.005)
    # 2 nodes x 2 ranks: a ring of 4 ranks, one edge leaves each node: 2 x 3/4 x 100 MB on each link
    assert comm_time(SyncSpec(), MB100, 2, 2, 10, GBIT) == pytest.approx(1.2)
    assert comm_time(SyncSpec(), MB100, 1, 2, 10, GBIT) == 0


def test_plan_covers_the_same_samples_with_prices() -> None:
    rows = plan(base(price=2.0), [2, 4], strategies(), GBIT, 0.0, samples=3200)
    one = rows[0]
    assert (one.nodes, one.sync, one.steps, one.time_s, one.speedup) == (
        1, "measured", 100, 200.0, 1.0)
    assert one.cost_usd == pytest.approx(2.0 * 200 / 3600)
    ddp4 = next(r for r in rows if r.nodes == 4 and r.sync == "ddp")
    assert ddp4.steps == 25 and ddp4.time_s == pytest.approx(25 * 3.2)
    assert ddp4.cost_usd == pytest.approx(4 * 2.0 * 25 * 3.2 / 3600)
    assert len(rows) == 1 + 2 * 6


def test_powersgd_is_left_out_without_real_shapes() -> None:
    flat = dataclasses.replace(base(), shapes=((25_000_000,),), shapes_known=False)
    labels = {r.sync for r in plan(flat, [2], strategies(), GBIT, 0.0, 3200)}
    assert not any("powersgd" in s for s in labels) and "ddp" in labels


def test_recommendation_exact_when_the_link_is_fast() -> None:
    rows = plan(base(), [2, 4, 8], strategies(), Link(100.0, 0.0), 0.0, 3200)
    rec = recommend(rows)
    # ties within 2%: exact gradients first
    assert rec.choice.nodes == 8 and rec.choice.sync == "ddp"
    assert "exact gradient averaging" in rec.line and "global batch grows 8x" in rec.line


def test_recommendation_states_the_risk_of_local_sgd() -> None:
    short = recommend(plan(base(), [2, 4, 8], strategies(2, 8), Link(0.5, 0.0), 0.0, 3200))
    # 13 steps at 8 nodes: PowerSGD's 2 fp32 start steps weigh most
    assert short.choice.sync == "local-sgd:8"
    rows = plan(base(), [2, 4, 8], strategies(2, 8), Link(0.5, 0.0), 0.0, 320_000)
    rec = recommend(rows)
    assert rec.choice.sync == "ddp+powersgd:2"  # the fewest bytes over a long run on a slow link
    assert "accuracy risk: PowerSGD" in rec.line and "changes the optimization" in rec.line
    assert f"fastest exact choice is {rec.fastest_exact.nodes}" in rec.line
    no_psgd = [r for r in rows if "powersgd" not in r.sync]
    rec = recommend(no_psgd)
    assert rec.choice.sync == "local-sgd:8" and "8 steps on its own" in rec.line


def test_recommendation_stays_on_one_node_when_nothing_beats_it() -> None:
    only = [SyncSpec(), SyncSpec(strategy="gather-scatter")]
    rows = plan(base(compute_s=0.1), [2, 4], only, Link(0.1, 0.0), 0.0, 3200)
    rec = recommend(rows)
    assert rec.choice.nodes == 1 and rec.line.startswith("recommend: stay on 1 node")


def test_overlap_from_measured_ddp_runs_only() -> None:
    ddp = run(2, comm_time_s=10.0, exposed_comm_s=4.0)
    other = run(2, comm_time_s=10.0, exposed_comm_s=10.0, sync="allreduce", run_id="ar")
    assert measured_overlap([run(1), ddp, other]) == (pytest.approx(0.6), ("r2x1",))
    assert measured_overlap([run(1), other]) == (0.0, ())


def test_validate_flags_points_off_by_more_than_the_goal() -> None:
    # 1 Gbit/s, 100 MB, t_c 2 s: 2 nodes predict 2 + 0.8 = 2.8 s per step with f = 0
    good = run(2, step_s=2.8 * 1.05, run_id="good")
    bad = run(2, step_s=2.8 * 1.4, run_id="bad", started_at="2026-02-01")
    elsewhere = run(2, step_s=3.0, model="bert-base", run_id="no-base")
    rows = validate([run(1), good, bad, elsewhere], 1.0, 0.0, cpu_s_per_byte=0.0)
    assert [r.run_id for r in rows] == ["good", "bad"]
    g, b = rows
    assert (g.predicted_step_s == pytest.approx(2.8)
            and g.measured_speedup == pytest.approx(2 * 2 / 2.94))
    assert g.error == pytest.approx(1.05 - 1) and not g.flagged
    assert b.error == pytest.approx(1.4 - 1) and b.flagged and abs(b.error) > GOAL


def test_validate_takes_overlap_from_the_other_runs() -> None:
    a = run(2, step_s=2.4, comm_time_s=80.0, exposed_comm_s=40.0, run_id="a")
    b = run(4, step_s=2.6, comm_time_s=100.0, exposed_comm_s=50.0, run_id="b")
    rows = {r.run_id: r for r in validate([run(1), a, b], 1.0, 0.0)}
    assert rows["a"].overlap == pytest.approx(0.5) and rows["a"].predicted_step_s == pytest.approx(
        2.4)
    assert rows["b"].predicted_step_s == pytest.approx(2.6)  # 2 + (1 - 0.5) x 1.2
    assert validate([run(1), a], 1.0, 0.0)[0].overlap == 0.0  # its own f is never used for itself


def test_sync_cpu_cost_per_byte_from_the_other_runs() -> None:
    # 1 Gbit/s, 100 MB, t_c 2 s, f = 0: 2 nodes 2.8 s and 4 nodes 3.2 s of wire-bound step; each ran
    # 0.1 s per 100 MB on its busiest link slower (2 nodes: 100 MB, 4 nodes: 150 MB), i.e. c = 1e-9
    # s per byte
    two = run(2, step_s=2.9, run_id="two", started_at="2026-02-01")
    four = run(4, step_s=3.2 + 0.15, run_id="four", started_at="2026-02-02")
    c, ids = measured_sync_cpu([run(1), two, four], GBIT)
    assert c == pytest.approx(1e-9) and ids == ("two", "four")
    # other nodes
    assert measured_sync_cpu([run(1), two], GBIT, like=run(2, cpu={"model": "Epyc"}))[0] == 0.0
    assert measured_sync_cpu([run(1)], GBIT) == (0.0, ())
    # faster than the wire: never below 0
    assert measured_sync_cpu([run(1), run(2, step_s=2.5)], GBIT)[0] == 0.0
    # c of the other run, never its own
    rows = {r.run_id: r for r in validate([run(1), two, four], 1.0, 0.0)}
    assert (rows["four"].cpu_s_per_byte == pytest.approx(1e-9)
            and rows["four"].predicted_step_s == pytest.approx(3.35))
    assert (rows["two"].predicted_step_s == pytest.approx(2.9)
            and rows["two"].error == pytest.approx(0.0))
    # with a strategy named, the runs of its own kind where there are any (a gather does not sum
    # what it moves)
    gather = run(2, step_s=2 + 1.6 + 0.4, sync="gather-scatter", run_id="gs",
                 started_at="2026-02-03")
    assert measured_sync_cpu([run(1), two, four, gather], GBIT,
                             sync=SyncSpec(strategy="gather-scatter")) == (
        pytest.approx(0.4 / 200e6), ("gs",))
    assert measured_sync_cpu([run(1), two, four, gather], GBIT, sync=SyncSpec())[1] == (
        "two", "four")
    # none of its kind
    assert measured_sync_cpu([run(1), two], GBIT, sync=SyncSpec(strategy="allreduce"))[1] == ("two",
                                                                                              )
    p = predict(base(), SyncSpec(strategy="local-sgd", sync_every=8), 4, GBIT, overlap=0.0,
                steps=80, cpu_s_per_byte=1e-9)
    assert p.sync_cpu_s == pytest.approx(150e6 / 8 * 1e-9)  # the bytes of one average in 8 steps


def test_baseline_choice_and_errors() -> None:
    old, new = (run(1, run_id="old", started_at="2026-01-01"),
                run(1, run_id="new", started_at="2026-03-01"))
    chosen, why = pick_baseline([new, run(2), old])
    assert chosen.run_id == "new" and why == ("of 2 1-node runs of mrpc minilm-l6 bf16 in the "
                                              "sources, the newest of 2 "
                                              "with the fewest ranks (1 rank)")
    assert pick_baseline([new, old], "old") == (old, "named by --baseline")
    assert pick_baseline([new, old], "ol")[0].run_id == "old"  # a unique prefix
    with pytest.raises(BadInput, match="no 1-node run"):
        pick_baseline([run(2)])
    with pytest.raises(BadInput, match="ran on 2 nodes"):
        baseline_of(run(2))
    with pytest.raises(BadInput, match="no parameter shapes"):
        baseline_of(run(1, param_shapes=(), grad_bytes=0))
    # an older 2-rank result: its ring bytes, 2(2-1)/2 of the gradient, give the gradient's size
    older = baseline_of(run(1, ppn=2, param_shapes=(), grad_bytes=0, comm_bytes_per_step=4000))
    assert older.shapes == ((1000,),) and not older.shapes_known
    b = baseline_of(run(1, usd_per_hour=3.0, epochs=2.0, max_steps=None))
    assert b.compute_s == 2.0 and b.usd_per_node_hour == 3.0 and b.dataset_samples == 1600


def test_default_baseline_is_the_fewest_ranks_of_the_newest_job_not_the_newest_run() -> None:
    """plan took the newest 1-node run, a 2-rank gather-scatter one, as its base: the 1-rank run is
    the compute."""
    one = run(1, run_id="one", started_at="2026-01-01")
    gather = run(1, ppn=2, sync="gather-scatter", run_id="gs", started_at="2026-01-05")
    assert pick_baseline([one, gather])[0] is one
    ddp2 = run(1, ppn=2, run_id="ddp2", started_at="2026-01-02")
    # both 2 ranks: plain DDP over the newer gather-scatter
    chosen, why = pick_baseline([ddp2, gather])
    assert chosen is ddp2 and why.endswith("the one with the fewest ranks (2 ranks, sync=ddp), "
                                           "plain DDP first")
    other_job = run(1, model="bert-base", ppn=2, run_id="bert", started_at="2026-02-01")
    # the newest run's job, then its fewest ranks
    assert pick_baseline([one, gather, other_job])[0] is other_job


def test_sync_from_options_or_label() -> None:
    assert sync_of(run(2,
                       sync_options={"strategy": "local-sgd", "sync_every": 4,
                                     "extra": 1})).sync_every == 4
    assert parse_label("ddp+powersgd:4") == SyncSpec(grad_compression="powersgd", powersgd_rank=4)
    assert parse_label("diloco:16").outer_optimizer == "nesterov"
    assert parse_label("gather-scatter").strategy == "gather-scatter"
    assert parse_label("ddp") == SyncSpec()
