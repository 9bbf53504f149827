"""predict's batches: the run's evaluation's own (rows r::N, shortest first, inference mode, the
training precision), so a saved model scores its dev rows exactly as the run reported; every row
once, in input order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from cpudist.errors import JobFailed
from cpudist.predict.infer import encode_rows, predict_rows, run_shard
from cpudist.predict.job import _gather
from cpudist.predict.source import Settings
from cpudist.train.data import load_glue_tsv
from cpudist.train.evaluate import evaluate
from cpudist.train.features import encode
from cpudist.train.metrics import compute_metrics
from cpudist.train.models import build_model, load_tokenizer


def save_tiny(folder: Path, shared_data: Path,
              labels: tuple[str, ...] = ("not_equivalent", "equivalent")) -> Any:
    """A random-init `tiny` classifier saved as save_pretrained writes it, with its tokenizer; the
    model.

    Its bias is set so that it calls half of MRPC's dev rows each way: a random head calls them all
    one way, and a metric of constant predictions would not notice rows scored out of order.
    """
    torch.manual_seed(3)
    model = build_model("tiny", 2, False, None).eval()
    model.config.id2label = dict(enumerate(labels))
    model.config.label2id = {name: i for i, name in enumerate(labels)}
    tokenizer = load_tokenizer("tiny", None)
    dev = load_glue_tsv("mrpc", shared_data / "glue" / "MRPC").validation
    with torch.inference_mode():
        logits = model(**tokenizer(*dev.texts, truncation=True, max_length=128, padding=True,
                                   return_tensors="pt")).logits
        model.classifier.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> tuple[Path, Any, Any]:
    folder = tmp_path_factory.mktemp("tiny")
    return folder, save_tiny(folder, shared_data), load_tokenizer("tiny", None)


class Recorder(torch.nn.Module):
    """Stands in for a classifier to see the batches: their lengths, inference mode and autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                **_: Any) -> SimpleNamespace:
        self.seen.append({"width": input_ids.shape[1], "lengths": attention_mask.sum(1).tolist(),
                          "inference": torch.is_inference_mode_enabled(),
                          "bf16": torch.is_autocast_enabled("cpu")
                          and torch.get_autocast_dtype("cpu") == torch.bfloat16})
        return SimpleNamespace(logits=attention_mask.sum(1, keepdim=True).float().repeat(1, 2))


def test_batches_are_sorted_by_length_padded_to_their_own_longest_in_inference_mode(
        tiny: tuple[Path, Any, Any], shared_data: Path) -> None:
    folder, _, tokenizer = tiny
    dev = load_glue_tsv("mrpc", shared_data / "glue" / "MRPC").validation.head(150)
    data = encode_rows(dev.texts, tokenizer, 128)
    rows = list(range(1, 300, 2))  # these rows' numbers in a larger input (rank 1 of 2)
    model = Recorder()
    pairs = predict_rows(model, data, rows, Settings(str(folder), "bf16", 128, 16, 1))
    lengths = [n for b in model.seen for n in b["lengths"]]
    assert lengths == sorted(len(ids) for ids in data.input_ids)  # shortest first, every row once
    # each batch pads to its own longest
    assert all(b["width"] == max(b["lengths"]) for b in model.seen)
    assert all(b["inference"] and b["bf16"] for b in model.seen) and len(model.seen) == 10
    assert sorted(i for i, _ in pairs) == rows  # numbered as in the input
    assert all(logits[0] == len(data.input_ids[rows.index(i)]) for i, logits in pairs)
    model = Recorder()
    predict_rows(model, data, rows, Settings(str(folder), "fp32", 128, 16, 1))
    assert not any(b["bf16"] for b in model.seen)


def test_the_saved_model_scores_the_dev_rows_exactly_as_the_runs_evaluation(
        tiny: tuple[Path, Any, Any], shared_data: Path) -> None:
    folder, model, tokenizer = tiny
    dev = load_glue_tsv("mrpc", shared_data / "glue" / "MRPC").validation
    threads = torch.get_num_threads()
    reported, _ = evaluate(model, encode(dev, tokenizer, 128), ("accuracy", "f1"), False, 64, True,
                           0, 1)
    pairs = run_shard(dev.texts, 0, 1, Settings(str(folder), "bf16", 128, 64, threads))
    logits = _gather([pairs], len(dev))
    predicted = np.array([float(np.argmax(row)) for row in logits])
    # both classes predicted: a misordered row would show in the metric
    assert 0 < predicted.mean() < 1
    assert compute_metrics(("accuracy", "f1"), predicted, np.array(dev.labels)) == reported


def test_shards_cover_every_row_once_and_gather_in_input_order(tiny: tuple[Path, Any, Any],
                                                               shared_data: Path) -> None:
    folder, _, _ = tiny
    dev = load_glue_tsv("mrpc", shared_data / "glue" / "MRPC").validation.head(40)
    settings = Settings(str(folder), "fp32", 128, 8, 1)
    whole = _gather([run_shard(dev.texts, 0, 1, settings)], 40)
    parts = [run_shard(dev.texts, r, 3, settings) for r in range(3)]
    assert [len(p) for p in parts] == [14, 13, 13] and {i for i,
                                                        _ in parts[1]} == set(range(1, 40, 3))
    np.testing.assert_allclose(np.array(_gather(parts, 40)), np.array(whole), atol=1e-5)
    assert run_shard(dev.head(2).texts, 2, 3, settings) == []  # more processes than rows
    with pytest.raises(JobFailed, match="returned 39 predictions for 39 of 40 rows"):
        _gather([parts[0], parts[1], parts[2][1:]], 40)
    with pytest.raises(JobFailed, match="returned 41 predictions for 40 of 40 rows"):
        _gather([parts[0], parts[1], parts[2] + parts[2][:1]], 40)
