"""--elastic's pure parts: what it refuses to combine with, the planned node count, and the global
batch of every step, the non-elastic plan's at the same node count whoever takes part."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from types import SimpleNamespace
from typing import Any

import pytest

from cpudist.config import TrainConfig
from cpudist.elastic_flags import check
from cpudist.errors import BadInput
from cpudist.strategies import SyncSpec
from cpudist.train import elastic
from cpudist.train.dist import RankInfo
from cpudist.train.sampling import batch_plan
from cpudist.train.setup import noise_seed
from cpudist.train.steps_log import StepsLog
from cpudist.wire import events
from cpudist.wire.elastic import REPLICA_ID, REPLICAS, node_index, node_name

BASE = TrainConfig(task="mrpc", output_dir="o", batch_size=4, elastic=True)


def data(rows: int) -> Any:
    rng = random.Random(0)
    return SimpleNamespace(input_ids=[[1] * rng.randint(3, 40) for _ in range(rows)])


@pytest.mark.parametrize(("change", "said"), [
    ({"sampler": "random"}, "--elastic trains with --sampler grouped"),
    ({"grad_accum": 2}, "--grad-accum 1"),
    ({"sync": SyncSpec(strategy="local-sgd")}, "--sync ddp (given: grouped, 1, local-sgd)"),
    ({"checkpoint_every_min": 10}, "--checkpoint-every-min with --elastic: the nodes' clocks"),
    ({"checkpoint_dir": "/ckpt"}, "--checkpoint-dir with --elastic: each node keeps"),
    ({"checkpoint_s3": "s3://b/p"}, "--checkpoint-s3 with --elastic: every node would copy"),
    ({"model_s3": "s3://b/p"}, "--model-s3 with --elastic: every node would copy its model"),
    ({"sync": SyncSpec(grad_compression="powersgd")},
     "--grad-compression powersgd with --elastic: the average sends the gradients whole"),
])
def test_what_the_slice_does_not_take_is_refused_in_one_line(change: dict[str, Any],
                                                             said: str) -> None:
    with pytest.raises(BadInput) as e:
        check(dataclasses.replace(BASE, **change))
    assert said in e.value.message and "\n" not in e.value.message
    check(BASE)  # the rest passes
    check(dataclasses.replace(BASE, elastic=False, **change))  # not elastic: not its to say


def test_the_planned_node_count_comes_from_the_launch() -> None:
    assert elastic.planned_nodes({REPLICAS: "4"}) == 4
    for bad in ({}, {REPLICAS: "0"}, {REPLICAS: "four"}):
        with pytest.raises(BadInput, match=f"{REPLICAS} is not a node count"):
            elastic.planned_nodes(bad)


@pytest.mark.parametrize("rows", [200, 203])  # whole global batches; a short last one
def test_a_steps_global_batch_is_the_plans_at_the_planned_node_count(rows: int) -> None:
    """Rows r::n of step s's global batch, over every r, are step s's rows of the non-elastic plan
    at N nodes, for any n participants: nothing twice, nothing left out, epoch after epoch."""
    nodes, encoded = 3, data(rows)
    schedule = elastic.Schedule(BASE, encoded, nodes)
    per_epoch, plans = zip(*(batch_plan(BASE, encoded, r, nodes) for r in range(nodes)),
                           strict=True)
    assert set(per_epoch) == {schedule.per_epoch}
    for step in range(2 * schedule.per_epoch + 1):
        epoch, index, batch = schedule.at(step)
        planned = [next(plan) for plan in plans]
        assert {(p.epoch, p.index) for p, _, _ in planned} == {(epoch, index)}
        assert sorted(batch) == sorted(i for _, idx, _ in planned for i in idx)
        for n in (1, 2, 3):
            shares = [batch[r::n] for r in range(n)]
            assert sorted(i for share in shares for i in share) == sorted(batch)


def _rows(path: Any) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_node_started_again_keeps_its_steps_and_takes_the_ones_it_missed(tmp_path: Any) -> None:
    """The head's rank killed at step 3 (mid-write of step 4's line), started again, heals at
    step 7 from a peer: its steps.jsonl is the run's, each step once, in order."""
    path = tmp_path / "steps.jsonl"
    first = StepsLog(path, keep_through=None)
    first.file.write("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3)))
    first.file.write('{"step": 4, "lo')  # killed mid-line
    first.file.flush()
    again = StepsLog(path, keep_through=None)  # the new process, on the same folder
    assert _rows(path) == [1, 2, 3]
    peer = StepsLog(tmp_path / "peer.jsonl", keep_through=None)
    peer.file.write("".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(1, 7)))
    again.fill(peer.tail())
    again.file.write(json.dumps({"step": 7, "loss": 1.0}) + "\n")
    again.close()
    assert _rows(path) == list(range(1, 8))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["loss"] for r in lines] == [1.0] * 3 + [2.0] * 3 + [1.0]  # its own where it had them


def test_a_resumed_run_keeps_the_steps_through_its_checkpoint_and_a_fresh_one_none(
        tmp_path: Any) -> None:
    """The same writer for every run: resumed from step 2's checkpoint after a kill mid-write of
    step 4's line, steps.jsonl keeps steps 1-2 (3 is trained again); a new run in the folder starts
    it empty."""
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "l')
    resumed = StepsLog(path, keep_through=2)
    resumed.add({"step": 3})
    resumed.close()
    assert _rows(path) == [1, 2, 3]
    StepsLog(path, keep_through=0).close()
    assert path.read_text() == ""


def test_a_joiner_takes_the_runs_membership_history_and_origin() -> None:
    """A node that joins late or comes back holds the changes of the time it was away, timed from
    the run's first start (what result.json and `cpudist report` show of an elastic run)."""
    peer = object.__new__(elastic.Replica)
    peer.origin, peer.ids = 1000.0, ("node0:a", "node1:b")
    everyone = ("node0", "node1", "node2")
    peer.changes = [elastic.Change(step=0, replicas=3, at_s=0.5, nodes=everyone, joined=everyone),
                    elastic.Change(step=40, replicas=2, at_s=31.0, nodes=("node0", "node1"),
                                   left=("node2",))]
    joiner = object.__new__(elastic.Replica)
    joiner.origin, joiner.started, joiner.changes, joiner.ids = 1100.0, 0.0, [], ()
    joiner.adopt(peer.record())
    assert joiner.changes == peer.changes and joiner.origin == 1000.0
    assert joiner.ids == peer.ids  # its next change is told against the same last quorum
    # a record as result.json keeps it (JSON lists), or from before the names were kept
    assert elastic.Change.of(json.loads(json.dumps(dataclasses.asdict(peer.changes[1])))) \
        == peer.changes[1]
    assert elastic.Change.of({"step": 4, "replicas": 2, "at_s": 1.0}).joined == ()
    # its next change is timed on the same clock: seconds since the run's first start
    assert abs((time.monotonic() - joiner.started) - (time.time() - 1000.0)) < 1.0


class _Quorum:
    """What Replica.quorum reads of torchft's Manager and its client, quorum by quorum."""

    def __init__(self, quorums: list[tuple[str, ...]]) -> None:
        self.quorums, self.ids, self.step = list(quorums), tuple[str, ...](), 0

    def start_quorum(self) -> None:
        self.ids, self.step = self.quorums.pop(0), self.step + 10

    def num_participants(self) -> int:
        return len(self.ids)

    def participating_rank(self) -> int:
        return 0

    def current_step(self) -> int:
        return self.step

    def report_error(self, e: Exception) -> None:
        self.errored = e

    def should_commit(self) -> bool:
        return getattr(self, "errored", None) is None


def test_the_membership_names_who_left_and_who_joined_even_at_the_same_count() -> None:
    """A node lost and back is in the record, also when it came back before the others went on
    without it (the count never changed: torchft gives each process a new replica id)."""
    fake = _Quorum([("node0:a", "node1:b", "node2:c"), ("node0:a", "node1:b", "node2:c"),
                    ("node0:a", "node1:b"), ("node0:a", "node1:b", "node2:d"),
                    ("node0:a", "node1:b", "node2:e")])
    replica = object.__new__(elastic.Replica)
    replica.manager, replica.quorums = fake, fake  # type: ignore[assignment]
    replica.started, replica.changes, replica.ids = time.monotonic(), [], ()
    for _ in range(5):
        assert replica.quorum() == (0, len(fake.ids))
        replica.note()
    said = [(c.step, c.replicas, c.left, c.joined) for c in replica.changes]
    assert said == [(10, 3, (), ("node0", "node1", "node2")), (30, 2, ("node2",), ()),
                    (40, 3, (), ("node2",)), (50, 3, ("node2",), ("node2",))]
    assert events.who_text(("node2",), ("node2",)) == "node2 started again"
    line = events.nodes_text({"step": 30, "nodes": 2, "planned": 3, "left": ["node2"],
                              "joined": []})
    assert line == "from step 30: training on 2 of 3 node(s) (node2 left)"


def test_the_first_step_waits_for_the_planned_nodes_and_holds_nobody_after() -> None:
    """At the run's start a quorum of fewer than the planned nodes trains nothing until they are
    in or the wait is over; a node that joins a run under way, or that trained, holds nobody."""
    fake = _Quorum([])
    replica = object.__new__(elastic.Replica)
    replica.manager, replica.quorums = fake, fake  # type: ignore[assignment]
    replica.began, replica.first, replica.trained = time.monotonic(), 0, False
    assert replica.waits(1, 3, 60) and replica.waits(2, 3, 60)
    assert not replica.waits(3, 3, 60)
    assert not replica.commit(hold=True)  # the step does not count, for any participant
    assert replica.waits(2, 3, 60)
    replica.began -= 61  # the wait is over: go on with whoever is in
    assert not replica.waits(2, 3, 60)
    replica.began = time.monotonic()
    fake.step = 10  # healed from a peer that trained: a run under way is not held
    assert not replica.waits(2, 3, 60)
    replica.first = 10  # resumed at that step, as every node is after losing them all
    assert replica.waits(2, 3, 60)
    del fake.errored
    assert replica.commit()
    assert not replica.waits(2, 3, 60)  # trained once: a later loss is the run's membership


def test_each_node_draws_its_own_dropout_noise() -> None:
    """Every elastic node is the rank 0 of a world of its own: seeded by its rank alone, all would
    draw the same dropout masks for their shares of a step. Other runs seed by rank, as before."""
    info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, source="test")
    assert [node_index({REPLICA_ID: node_name(i)}) for i in range(12)] == list(range(12))
    assert node_index({}) == node_index({REPLICA_ID: "head"}) == 0
    assert len({noise_seed(BASE, info, {REPLICA_ID: node_name(i)}) for i in range(4)}) == 4
    ddp = dataclasses.replace(BASE, elastic=False)
    assert [noise_seed(ddp, dataclasses.replace(info, rank=r, world_size=2), {REPLICA_ID: "node3"})
            for r in range(2)] == [ddp.seed, ddp.seed + 1]
