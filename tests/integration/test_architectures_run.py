"""Beyond BERT: a ModernBERT-style encoder and a Llama-style decoder classifier (grouped-query
heads, last-token pooling) train on 2 ranks with --fast-dropout's attention, save a model
transformers loads back, and resume from a checkpoint to the straight run's losses.
tests/unit/test_architectures.py covers every family in-process.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow

STEPS = 16


def _data(folder: Path) -> tuple[Path, Path]:
    """Rows of 'alpha' are pos, of 'beta' neg, 2 to 12 words long (padding in every batch): learnt
    in a few steps."""
    rng = random.Random(0)

    def rows(n: int) -> str:
        pairs = [("alpha", "pos") if i % 2 == 0 else ("beta", "neg") for i in range(n)]
        return "text,label\n" + "".join(f"{' '.join([w] * rng.randint(2, 12))},{label}\n" for w,
                                        label in pairs)

    train, validation = folder / "train.csv", folder / "validation.csv"
    train.write_text(rows(128))
    validation.write_text(rows(32))
    return train, validation


def _losses(run: Path) -> dict[int, float]:
    return {s["step"]: s["loss"]
            for s in map(json.loads, (run / "steps.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("model", ["tiny-modernbert", "tiny-llama"])
def test_family_trains_on_two_ranks_saves_and_resumes(model: str, tmp_path: Path) -> None:
    train, validation = _data(tmp_path)
    args = ["custom", "--train-file", train, "--validation-file", validation, "--text-columns",
            "text",
            "--label-column", "label", "--np", "2", "--model", model, "--max-steps", str(STEPS),
            "--batch-size", "8",
            # 5e-4 x 2 ranks (--lr-scaling auto): the 1e-3 these checks were set at
            "--lr", "5e-4", "--precision", "fp32", "--log-every", "1", "--checkpoint-every",
            str(STEPS // 2),
            "--quiet"]
    straight = cpudist("run", *args, "--output-dir", tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    result = json.loads((tmp_path / "straight" / "result.json").read_text())
    assert result["attention"] == "cpudist-fast-dropout" and result["fast_dropout"]
    # mean or last-token pooling reads every token of the last layer
    assert result["last_layer"] == "full"
    losses = _losses(tmp_path / "straight")
    assert sorted(losses) == list(range(1, STEPS + 1)) and losses[STEPS] < losses[1]
    assert result["metrics"]["accuracy"] >= 0.9  # it learnt the task, through the ranks' exchange

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    saved = tmp_path / "straight" / "model"
    loaded = AutoModelForSequenceClassification.from_pretrained(saved).eval()
    assert loaded.config.model_type == model.removeprefix(
        "tiny-") and loaded.config.pad_token_id == 0
    rows = [line.rsplit(",", 1) for line in validation.read_text().splitlines()[1:]]
    enc = AutoTokenizer.from_pretrained(saved)([text for text, _ in rows], padding=True,
                                               return_tensors="pt")
    with torch.no_grad():
        predicted = loaded(**enc).logits.argmax(-1).tolist()
    right = sum(loaded.config.id2label[p] == label for p,
                (_, label) in zip(predicted, rows, strict=True))
    # the saved weights are the evaluated ones
    assert right / len(rows) == pytest.approx(result["metrics"]["accuracy"])

    half = tmp_path / "straight" / "checkpoints" / f"step-{STEPS // 2:06d}"
    resumed = cpudist("run", *args, "--output-dir", tmp_path / "resumed", "--resume", half,
                      "--no-eval", "--save-model", "none")
    assert resumed.returncode == 0, resumed.stderr
    again = _losses(tmp_path / "resumed")
    assert sorted(again) == list(range(STEPS // 2 + 1, STEPS + 1))
    # weights, AdamW moments, data position and dropout RNG all came back
    for step, loss in again.items():
        assert loss == pytest.approx(losses[step], rel=1e-5), step
