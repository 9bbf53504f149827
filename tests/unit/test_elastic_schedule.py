"""--elastic's pure parts: what it refuses to combine with, the planned node count, and the global
batch of every step, the non-elastic plan's at the same node count whoever takes part."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace
from typing import Any

import pytest

from cpudist.config import TrainConfig
from cpudist.elastic_flags import check
from cpudist.errors import BadInput
from cpudist.strategies import SyncSpec
from cpudist.train import elastic
from cpudist.train.sampling import batch_plan
from cpudist.wire.elastic import REPLICAS

BASE = TrainConfig(task="mrpc", output_dir="o", batch_size=4, elastic=True)


def data(rows: int) -> Any:
    rng = random.Random(0)
    return SimpleNamespace(input_ids=[[1] * rng.randint(3, 40) for _ in range(rows)])


@pytest.mark.parametrize(("change", "said"), [
    ({"sampler": "random"}, "--elastic trains with --sampler grouped"),
    ({"grad_accum": 2}, "--grad-accum 1"),
    ({"sync": SyncSpec(strategy="local-sgd")}, "--sync ddp (given: grouped, 1, local-sgd)"),
    ({"checkpoint_every": 10}, "--checkpoint-every with --elastic"),
    ({"resume": "auto"}, "--resume with --elastic"),
    ({"model_s3": "s3://b/p"}, "--model-s3 with --elastic: every node would copy its model"),
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
