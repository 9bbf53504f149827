"""Fixtures of the unit tests that train tiny models in this process (test_architectures,
test_last_layer, test_gradient_checkpointing)."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cpudist.train.models import load_tokenizer


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Models this small gain nothing from a second thread, and on a loaded machine OpenMP's
    spinning threads cost several times the CPU time of the work (measured: 2.1 s instead of 0.3 s
    for one family's training)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def batch(shared_data: Path) -> dict[str, torch.Tensor]:
    """8 MRPC pairs padded to the longest (rows of different lengths, so padding and the mask are
    exercised)."""
    with open(shared_data / "glue" / "MRPC" / "train.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:9]
    enc = load_tokenizer("tiny", None)([r[3] for r in rows], [r[4] for r in rows], padding=True,
                                       truncation=True, max_length=64, return_tensors="pt")
    assert bool((enc["attention_mask"] == 0).any())
    return {**enc, "labels": torch.tensor([int(r[0]) for r in rows])}
