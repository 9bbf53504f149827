"""--elastic's average across nodes: what crosses the wire (the word embedding's touched rows, in
the wire's dtype) and the mean every node gets back.

Two nodes' Replicas average in two threads here, their managers standing in for torchft's: each
allreduce waits for the other node's and both get the reduction, as gloo's gives. torchft's own
Manager and Lighthouse average between processes in tests/integration/test_elastic.py, whose
weights must equal one rank's.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.distributed import ReduceOp

from cpudist.strategies import SyncSpec
from cpudist.train import elastic
from cpudist.train.models import build_model


class _Done:
    def wait(self) -> None:
        pass


class _Pair:
    """Two nodes' allreduces, met: each call waits for the other node's, then both hold the
    reduction; what crossed is kept."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=30)
        self.slots: list[torch.Tensor | None] = [None, None]
        self.crossed: list[tuple[torch.dtype, int, Any]] = []

    def manager(self, i: int) -> Any:
        pair = self

        class Manager:
            def allreduce(self, tensor: torch.Tensor, reduce_op: Any) -> _Done:
                pair.slots[i] = tensor.clone()
                pair.barrier.wait()
                a, b = pair.slots
                assert a is not None and b is not None and a.shape == b.shape
                if i == 0:
                    pair.crossed.append((tensor.dtype, tensor.numel(), reduce_op))
                out = torch.maximum(a, b) if reduce_op == ReduceOp.MAX else a + b
                pair.barrier.wait()
                tensor.copy_(out)
                return _Done()

        return Manager()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3))


def _average(grads: list[list[torch.Tensor]], wire: torch.dtype | None,
             rows_at: int | None) -> tuple[list[list[torch.Tensor]], _Pair, list[float]]:
    """Each node's gradients after the average (node i's .grad start as grads[i])."""
    pair = _Pair()
    models = [_model(), _model()]
    waited = [0.0, 0.0]

    def node(i: int) -> None:
        replica = object.__new__(elastic.Replica)
        replica.manager = pair.manager(i)
        params = list(models[i].parameters())
        for p, g in zip(params, grads[i], strict=True):
            p.grad = g.clone()
        waited[i] = replica.average(params, 2, wire, rows_at)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return [[p.grad for p in m.parameters()] for m in models], pair, waited  # type: ignore[misc]


def _grads(touched: list[int], seed: int) -> list[torch.Tensor]:
    """A node's gradients: its embedding's rows `touched` nonzero, the rest zero."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.zeros(10, 4)
    table[touched] = torch.randn(len(touched), 4, generator=gen)
    return [table, torch.randn(3, 4, generator=gen), torch.randn(3, generator=gen)]


@pytest.mark.parametrize("wire", [None, torch.bfloat16])
def test_two_nodes_get_the_mean_and_send_only_the_touched_rows(wire: torch.dtype | None) -> None:
    """Node 0 touched rows 1 and 2, node 1 rows 2 and 5: the rows' union crosses (3 of 10), in the
    wire's dtype, and every node gets the mean of every gradient; untouched rows stay zero."""
    grads = [_grads([1, 2], 0), _grads([2, 5], 1)]
    after, pair, waited = _average(grads, wire, rows_at=0)
    mask, sent = pair.crossed
    assert mask[2] == ReduceOp.MAX and mask[1] == 10  # a byte per row of the table
    assert sent[0] == (wire or torch.float32) and sent[2] == ReduceOp.SUM
    assert sent[1] == 3 * 4 + 3 * 4 + 3  # the union's rows, then the rest whole
    # bf16 rounds each value and their sum by at most 2^-8 of it: (|a| + |b|) 2^-8 once halved
    unit = 0.0 if wire is None else 2.0**-8
    for node in after:
        for mine, a, b in zip(node, *grads, strict=True):
            assert mine.dtype == torch.float32
            assert ((mine - (a + b) / 2).abs() <= (a.abs() + b.abs()) * unit).all(), (mine, a, b)
    assert after[0][0][[0, 3, 4, 6, 7, 8, 9]].eq(0).all()
    assert all(w >= 0 for w in waited)


def test_without_rows_every_gradient_crosses_whole() -> None:
    grads = [_grads([1, 2], 0), _grads([2, 5], 1)]
    after, pair, _ = _average(grads, None, rows_at=None)
    assert [(c[0], c[1]) for c in pair.crossed] == [(torch.float32, 10 * 4 + 3 * 4 + 3)]
    for mine, a, b in zip(after[1], *grads, strict=True):
        torch.testing.assert_close(mine, (a + b) / 2, rtol=0, atol=0)


def test_the_wire_is_what_a_ddp_run_across_nodes_sends() -> None:
    """auto is bf16 and the word embedding goes by rows, as for ddp across nodes; dense and none
    send every gradient whole in fp32."""
    model = build_model("tiny", 2, False, 0.0)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    wire, rows_at = elastic.wire_of(model, SyncSpec(grad_compression="auto"))
    assert wire == torch.bfloat16 and rows_at is not None
    assert trained[rows_at] == "bert.embeddings.word_embeddings.weight"
    assert elastic.wire_of(model, SyncSpec(grad_compression="none", embedding_sync="dense")) == (
        None, None)
    model.get_input_embeddings().weight.requires_grad_(False)  # --freeze-embeddings
    assert elastic.wire_of(model, SyncSpec(grad_compression="fp16"))[1] is None
