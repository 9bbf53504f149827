"""Tokenize once, pad per batch: rows become token-id lists, batches become tensors."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cpudist.train.data import Split


@dataclass(frozen=True)
class Encoded:
    """A tokenized split: token ids per row (unpadded), token types if the model uses them."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    labels: list[float]
    pad_id: int

    def __len__(self) -> int:
        return len(self.labels)

    def real_tokens(self, indices: Sequence[int]) -> int:
        return sum(len(self.input_ids[i]) for i in indices)


def encode(split: Split, tokenizer: object, max_len: int) -> Encoded:
    """Tokenize every row once, truncated to `max_len`, without padding."""
    enc = tokenizer(*split.texts, truncation=True, max_length=max_len)  # type: ignore[operator]
    types = enc.get("token_type_ids")
    pad = tokenizer.pad_token_id or 0  # type: ignore[attr-defined]
    return Encoded(enc["input_ids"], types, list(split.labels), pad)


def synthetic(n: int, seq_len: int, vocab_size: int, num_labels: int, seed: int) -> Encoded:
    """Random token sequences of one length: meaningful throughput, meaningless accuracy."""
    rng = random.Random(seed)
    ids = [[101] + [rng.randrange(1000, vocab_size) for _ in range(seq_len - 2)] + [102]
           for _ in range(n)]
    labels = [float(rng.randrange(num_labels)) for _ in range(n)]
    return Encoded(ids, None, labels, 0)


def collate(data: Encoded, indices: Sequence[int], regression: bool,
            multiple: int = 1) -> dict[str, torch.Tensor]:
    """Pad a batch to its own longest row (dynamic padding), rounded up to `multiple`, and build its
    tensors.

    A `multiple` above 1 gives a few static shapes (what a compiled model wants) instead of one per
    length.
    """
    longest = max(len(data.input_ids[i]) for i in indices)
    longest = -(-longest // multiple) * multiple
    ids = torch.full((len(indices), longest), data.pad_id, dtype=torch.long)
    mask = torch.zeros((len(indices), longest), dtype=torch.long)
    types = torch.zeros((len(indices), longest), dtype=torch.long) if data.token_type_ids else None
    for row, i in enumerate(indices):
        n = len(data.input_ids[i])
        ids[row, :n] = torch.tensor(data.input_ids[i])
        mask[row, :n] = 1
        if types is not None and data.token_type_ids is not None:
            types[row, :n] = torch.tensor(data.token_type_ids[i])
    label_dtype = torch.float if regression else torch.long
    batch = {"input_ids": ids, "attention_mask": mask,
             "labels": torch.tensor([data.labels[i] for i in indices], dtype=label_dtype)}
    if types is not None:
        batch["token_type_ids"] = types
    return batch
