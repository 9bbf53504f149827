"""Which models ddp sends the word embedding of by its touched rows (sync.EmbeddingRows), and under
what name.

The rows' exchange itself runs over real gloo in tests/integration/test_sync_exchange.py (the mean
to the wire rounding, the union of touched rows, the bytes) and between two namespace hosts in
test_sync_traffic.py; here, the choice: DDP must ignore exactly the parameter the rows sync, or it
is reduced twice or never.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cpudist.strategies import SyncSpec
from cpudist.train import embedding_rows
from cpudist.train.embedding_rows import EmbeddingRows
from cpudist.train.models import build_model


@pytest.fixture
def broadcasts(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """What EmbeddingRows broadcast from rank 0 (DDP does not broadcast the parameters it ignores);
    no group."""
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(embedding_rows.dist, "broadcast", lambda t, src: sent.append(t))
    return sent


@pytest.mark.parametrize(("preset", "name"), [("tiny", "bert.embeddings.word_embeddings.weight"),
                                              ("tiny-albert",
                                               "albert.embeddings.word_embeddings.weight"),
                                              ("tiny-modernbert",
                                               "model.embeddings.tok_embeddings.weight"),
                                              ("tiny-llama", "model.embed_tokens.weight")])
def test_the_trained_word_embedding_is_taken_by_its_one_name(
        preset: str, name: str, broadcasts: list[torch.Tensor]) -> None:
    model = build_model(preset, 2, False, None, pad_token_id=0)
    rows = EmbeddingRows.of(model, SyncSpec(), 2)
    assert rows is not None and rows.name == name
    weight = dict(model.named_parameters())[name]
    assert rows.weight is weight and [t.data_ptr() for t in broadcasts] == [weight.data_ptr()]
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained[rows.index] is weight
    shapes = tuple(tuple(p.shape) for p in trained)
    rows.rows_synced, rows.syncs = 30, 2
    assert rows.wire_shapes(shapes) == tuple((15, weight.shape[1]) if i == rows.index else s
                                             for i, s in enumerate(shapes))


def shared(model: Any) -> Any:
    model.echo = torch.nn.Embedding(*model.get_input_embeddings().weight.shape)
    model.echo.weight = model.get_input_embeddings().weight  # one Parameter under two names
    return model


def frozen(model: Any) -> Any:
    model.get_input_embeddings().weight.requires_grad_(False)
    return model


@pytest.mark.parametrize(("case", "spec", "world", "change"), [
    ("one rank", SyncSpec(), 1, None),
    ("--embedding-sync dense", SyncSpec(embedding_sync="dense"), 2, None),
    ("PowerSGD keeps it (its factors are smaller)", SyncSpec(grad_compression="powersgd"), 2, None),
    ("frozen (--freeze-embeddings, LoRA)", SyncSpec(), 2, frozen),
    ("shared: DDP would still reduce it under the other name", SyncSpec(), 2, shared),
    ("no get_input_embeddings", SyncSpec(), 2,
     lambda m: torch.nn.Sequential(torch.nn.Linear(2, 2))),
])
def test_ddp_keeps_the_embedding_when_rows_would_not_be_its_mean_or_help(
        case: str, spec: SyncSpec, world: int, change: Any,
        broadcasts: list[torch.Tensor]) -> None:
    model = build_model("tiny", 2, False, None, pad_token_id=0)
    assert EmbeddingRows.of(change(model) if change else model, spec, world) is None, case
    assert broadcasts == []
