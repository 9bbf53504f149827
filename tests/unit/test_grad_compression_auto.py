"""--grad-compression auto (the default): bf16 for ddp when the ranks span nodes, said by rank 0;
none otherwise.

A 2-host run's bytes and its note are checked between namespace hosts (test_sync_traffic); here, the
choice on every kind of layout and strategy, and that the options an explicit value asks for stay
refused or allowed.
"""

from __future__ import annotations

import dataclasses

import pytest

from cpudist.config import TrainConfig, resolved_compression, spec_of
from cpudist.errors import BadInput
from cpudist.sync_flags import asked, check_sync
from cpudist.train.dist import RankInfo
from cpudist.train.main import _wire


def cfg(**flags: object) -> TrainConfig:
    """The config `cpudist run` builds from these sync flags."""
    return TrainConfig(task="mrpc", output_dir="o", sync=asked(flags))


def info(rank: int, world: int, local_world: int) -> RankInfo:
    return RankInfo(rank, world, rank % local_world, local_world, "RANK")


@pytest.mark.parametrize(("given", "sync", "world", "per_node", "wire"), [
    ("auto", "ddp", 4, 1, "bf16"),  # 4 nodes
    ("auto", "ddp", 4, 2, "bf16"),  # 2 nodes of 2 ranks
    ("auto", "ddp", 2, 2, "none"),  # one node: the bytes cost little there
    ("auto", "ddp", 1, 1, "none"),
    ("auto", "local-sgd", 4, 1, "none"),  # local SGD's own wire is asked for by name
    ("auto", "allreduce", 4, 1, "none"),
    ("none", "ddp", 4, 1, "none"),  # an explicit value is kept
    ("powersgd:2", "ddp", 4, 1, "powersgd:2"),
])
def test_auto_is_bf16_for_ddp_across_nodes_only(given: str, sync: str, world: int, per_node: int,
                                                wire: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert resolved_compression(given, sync, per_node < world) == wire
    ranks = [_wire(cfg(grad_compression=given, sync=sync), info(r, world, per_node))
             for r in range(world)]
    # every rank alike: they must exchange the same (powersgd:2 is powersgd of rank 2)
    assert {(c.sync.grad_compression, c.sync.powersgd_rank) for c in ranks} == {
        (wire.partition(":")[0], int(wire.partition(":")[2] or 1))}
    spec_of(ranks[0], 100)  # a value the strategies take
    said = capsys.readouterr().out
    if given == "auto" and wire == "bf16":  # once, from rank 0, with the way back
        assert said.count(
            "[cpudist] gradients cross the network in bf16 (--grad-compression auto") == 1
        assert "--grad-compression none keeps fp32" in said
    else:
        assert said == ""


@pytest.mark.parametrize(("knobs", "ok"), [
    ({"sync": "allreduce"}, True), ({"sync": "allreduce", "grad_compression": "none"}, True),
    ({"sync": "gather-scatter", "grad_compression": "bf16"}, False),
    ({"sync": "local-sgd"}, True), ({"sync": "local-sgd", "grad_compression": "bf16"}, True),
    ({"sync": "local-sgd", "grad_compression": "fp16"}, False),
])
def test_auto_and_none_ask_nothing_of_strategies_without_a_wire_choice(knobs: dict[str, object],
                                                                       ok: bool) -> None:
    if ok:
        check_sync(cfg(**knobs).sync)
    else:
        with pytest.raises(BadInput):
            check_sync(cfg(**knobs).sync)


def test_an_elastic_node_sends_bf16_though_its_own_world_is_one_rank(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each elastic node trains in a world of its own (1 rank), and its average always crosses the
    network: auto is bf16 there, as for ddp across nodes; an explicit none is kept."""
    node = dataclasses.replace(cfg(grad_compression="auto"), elastic=True)
    assert _wire(node, info(0, 1, 1)).sync.grad_compression == "bf16"
    assert "gradients cross the network in bf16" in capsys.readouterr().out
    kept = dataclasses.replace(cfg(grad_compression="none"), elastic=True)
    assert _wire(kept, info(0, 1, 1)).sync.grad_compression == "none"
