"""Expected bytes on the wire per strategy: the arithmetic the report and the planner rely on."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

from cpudist.strategies import SyncSpec
from cpudist.traffic import buckets, expected_traffic, payload_bytes, powersgd_values

SHAPES = [(1000, 64), (64,), (64, 64)]  # 64000 + 64 + 4096 = 68160 values
NUMEL = 68160


def test_payload_fp32_and_halved_by_16_bit_compression() -> None:
    assert payload_bytes(SHAPES) == 4 * NUMEL
    assert payload_bytes(SHAPES, "bf16") == payload_bytes(SHAPES, "fp16") == 2 * NUMEL


@pytest.mark.parametrize("shape",
                         [(1000, 64), (64,), (64, 64), (3, 3), (30522, 384), (8, 4, 4), (2, 1000)])
@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_follows_torchs_rule(shape: tuple[int, ...], rank: int) -> None:
    n = shape[0]
    m = torch.Size(shape).numel() // n
    compress, full, small = _should_compress(n, m, min(n, m, rank), 2)
    assert powersgd_values(shape, rank) == (small if compress else full)


def test_ring_all_reduce_sends_two_n_minus_one_over_n_per_rank_and_node() -> None:
    t = expected_traffic(SyncSpec(), SHAPES, world=4, ppn=1, steps=10)
    assert t.rank_send == pytest.approx(2 * 3 / 4 * 4 * NUMEL)
    assert t.node_tx == pytest.approx((2 * 3 / 4 * 4 * NUMEL,) * 4)
    assert t.exchanges == 1
    # Two ranks per node: one ring edge leaves each node, so a node still sends 2(N-1)/N of the
    # payload.
    two = expected_traffic(SyncSpec(), SHAPES, world=4, ppn=2, steps=10)
    assert two.node_tx == pytest.approx((2 * 3 / 4 * 4 * NUMEL,) * 2)


def test_one_node_puts_nothing_on_the_network() -> None:
    assert expected_traffic(SyncSpec(), SHAPES, world=2, ppn=2, steps=5).total_node_tx == 0
    assert expected_traffic(SyncSpec(), SHAPES, world=1, ppn=1, steps=5).rank_send == 0


def test_gather_scatter_concentrates_n_minus_one_copies_on_the_head() -> None:
    t = expected_traffic(SyncSpec(strategy="gather-scatter"), SHAPES, world=4, ppn=1, steps=3)
    g = 4 * NUMEL
    assert t.rank_send == 3 * g
    assert t.node_tx == (3 * g, g, g, g)


def test_local_sgd_moves_one_kth_after_its_warmup() -> None:
    ddp = expected_traffic(SyncSpec(), SHAPES, 4, 1, 80)
    k8 = expected_traffic(SyncSpec(strategy="local-sgd", sync_every=8), SHAPES, 4, 1, 80)
    assert k8.total_node_tx == pytest.approx(ddp.total_node_tx / 8)
    warm = expected_traffic(SyncSpec(strategy="local-sgd", sync_every=8, local_sgd_warmup=8),
                            SHAPES, 4, 1, 80)
    assert warm.exchanges == pytest.approx((8 + 72 // 8) / 80)
    # The steps after the last average are averaged once more when training ends.
    assert expected_traffic(SyncSpec(strategy="local-sgd", sync_every=8), SHAPES, 4, 1,
                            20).exchanges == pytest.approx(3 / 20)


def test_local_sgd_moments_add_a_model_each_and_a_16_bit_wire_halves_them_all() -> None:
    ddp = expected_traffic(SyncSpec(), SHAPES, 4, 1, 80).total_node_tx
    def k8(**knobs: Any) -> float:
        return expected_traffic(SyncSpec(strategy="local-sgd", sync_every=8, **knobs), SHAPES, 4, 1,
                                80).total_node_tx
    assert k8(average_moments="first") == k8(average_moments="second") == pytest.approx(2 * ddp / 8)
    assert k8(average_moments="both") == pytest.approx(3 * ddp / 8)
    # 5.3x fewer than ddp
    assert k8(average_moments="both", grad_compression="bf16") == pytest.approx(1.5 * ddp / 8)
    assert k8(average_moments="second", grad_compression="bf16") == pytest.approx(ddp / 8)
    # The second moment every other average: 2.5 models' bytes per average, on a bf16 wire 6.4x
    # fewer than ddp.
    assert k8(average_moments="both", grad_compression="bf16",
              second_moment_every=2) == pytest.approx(1.25 * ddp / 8)
    # 10 averages: 2 with v
    assert k8(average_moments="second", second_moment_every=5) == pytest.approx(1.2 * ddp / 8)
    # no second moment
    assert k8(average_moments="first", second_moment_every=2) == k8(average_moments="first")
    # The warm-up's synchronous steps average fp32 gradients whatever the wire of the averages.
    spec = SyncSpec(strategy="local-sgd", sync_every=8, local_sgd_warmup=8, grad_compression="bf16")
    warm = expected_traffic(spec, SHAPES, 4, 1, 80)
    assert warm.total_node_tx == pytest.approx(ddp * (8 + 9 / 2) / 80)


def test_powersgd_sends_plain_gradients_before_it_starts() -> None:
    sync = SyncSpec(grad_compression="powersgd", powersgd_rank=1, powersgd_start=5)
    t = expected_traffic(sync, SHAPES, 2, 1, 10)
    small = payload_bytes(SHAPES, "powersgd", 1)
    assert small < payload_bytes(SHAPES) / 10
    assert t.rank_send == pytest.approx((5 * payload_bytes(SHAPES) + 5 * small) / 10)


def test_labels_and_buckets() -> None:
    assert SyncSpec().label == "ddp"
    assert SyncSpec(grad_compression="powersgd", powersgd_rank=2).label == "ddp+powersgd:2"
    assert SyncSpec(strategy="local-sgd", sync_every=8,
                    outer_optimizer="nesterov").label == "diloco:8"
    both = SyncSpec(strategy="local-sgd", sync_every=8, average_moments="both",
                    grad_compression="bf16")
    assert both.label == "local-sgd:8+mv+bf16"
    assert SyncSpec(strategy="local-sgd", sync_every=8, average_moments="both",
                    grad_compression="bf16",
                    second_moment_every=2).label == "local-sgd:8+m+v/2+bf16"
    second = SyncSpec(strategy="local-sgd", sync_every=8, average_moments="second",
                      second_moment_every=3)
    assert second.label == "local-sgd:8+v/3"
    # 104 MiB: a 1 MiB first bucket, then 103 MiB in 25 MiB ones
    assert buckets([(1024, 1024)] * 26, 25) == 1 + 5
