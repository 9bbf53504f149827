"""ddp's word-embedding gradient averaged over the rows a step touched (--embedding-sync rows, the
default)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpudist.strategies import SyncSpec
from cpudist.train.exchange import CommClock, mean_, wire_dtype


class EmbeddingRows:
    """The word embedding's gradient averaged over the rows a step touched (ddp, --embedding-sync
    rows).

    A step's word-embedding gradient is zero but on the rows of the tokens its batches held: 1,725
    of MiniLM's 30,522 rows (6%) for 4 ranks x 32 MRPC pairs, 738 for SST-2. DDP all-reduces all of
    it, and last, since backward reaches the embedding last: half of MiniLM's parameters (a fifth of
    bert-base's, 69% of XLM-R's), in the one bucket no backward compute hides. Here DDP leaves the
    weight out; after backward the ranks take the max of their touched-row masks (one all-reduce of
    V bytes), then average those rows only (exchange.mean_, in the wire's dtype). A row no rank
    touched is zero on every rank, so this is DDP's mean. The rows are read off the gradient, not
    the token ids, so whatever else uses the weight counts; a weight shared with another module
    stays with DDP (two names: DDP would still reduce it under the other).
    """

    def __init__(self, weight: torch.Tensor, name: str, index: int, world: int,
                 wire: torch.dtype | None):
        self.weight, self.name, self.index, self.world, self.wire = weight, name, index, world, wire
        self.rows_synced, self.syncs = 0, 0
        # DDP broadcasts rank 0's parameters at construction, but not the ones it ignores.
        with torch.no_grad():
            dist.broadcast(weight.data, src=0)

    @classmethod
    def of(cls, model: torch.nn.Module, spec: SyncSpec, world: int) -> EmbeddingRows | None:
        """Rows sync of the model's trained, unshared word embedding (None: none, frozen, shared,
        one rank, PowerSGD, or --embedding-sync dense)."""
        found = word_embedding(model) if world > 1 and rows_wanted(spec) else None
        if found is None:
            return None
        weight, name, index = found
        return cls(weight, name, index, world, wire_dtype(spec.grad_compression))

    def mean(self, clock: CommClock) -> None:
        """Make the weight's gradient the mean over ranks, exchanging only the rows some rank
        touched."""
        # a rank whose step never reached the embedding still takes part
        if self.weight.grad is None:
            self.weight.grad = torch.zeros_like(self.weight)
        grad = self.weight.grad
        touched = grad.ne(0).any(dim=1).to(torch.uint8)
        start = clock.started()
        dist.all_reduce(touched, op=dist.ReduceOp.MAX)
        clock.blocking(start)
        rows = touched.nonzero().squeeze(1)
        values = grad.index_select(0, rows)
        mean_([values], self.world, clock, wire=self.wire)  # the buckets' own mean, one bucket
        grad.index_copy_(0, rows, values)
        self.rows_synced += rows.numel()
        self.syncs += 1

    def rows_per_step(self) -> float | None:
        return self.rows_synced / self.syncs if self.syncs else None

    def wire_shapes(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        """The trained shapes as they cross the wire: the embedding as its mean synced rows."""
        rows = round(self.rows_per_step() or 0)
        return tuple((rows, *s[1:]) if i == self.index else s for i, s in enumerate(shapes))


def rows_wanted(spec: SyncSpec) -> bool:
    """Whether the sync sends the word embedding's touched rows: --embedding-sync rows, but not
    with PowerSGD, whose rank-r factors of the embedding are smaller still."""
    return spec.embedding_sync == "rows" and spec.grad_compression != "powersgd"


def word_embedding(model: torch.nn.Module) -> tuple[torch.Tensor, str, int] | None:
    """The model's trained word embedding: its weight, its name and its index among the trained
    parameters (None: none, frozen, or shared with another module, which would still exchange it
    under its other name)."""
    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    if not isinstance(embedding, torch.nn.Embedding) or not embedding.weight.requires_grad:
        return None
    weight = embedding.weight
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is weight]
    if len(names) != 1:
        return None
    trained = [p for p in model.parameters() if p.requires_grad]
    return weight, names[0], next(i for i, p in enumerate(trained) if p is weight)
