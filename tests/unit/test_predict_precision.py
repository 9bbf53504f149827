"""predict computes in fp32 unless --precision says otherwise, also for a model its bf16 run saved
in bf16: the scores are as many and as exact as an fp32 forward's, not bf16's few rounded values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cpudist.predict.job import PredictRequest, execute, plan
from cpudist.train.models import build_model, load_tokenizer

ROWS = 300


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An STS-B run folder that computed in bf16, its random-init `tiny` regression model saved in
    bf16."""
    run = tmp_path_factory.mktemp("stsb")
    (run / "result.json").write_text(json.dumps({"task": "stsb", "precision": "bf16",
                                                 "max_seq_len": 64}))
    torch.manual_seed(5)
    model = build_model("tiny", 1, True, None).bfloat16()
    model.save_pretrained(run / "model")
    load_tokenizer("tiny", None).save_pretrained(run / "model")
    return run


def rows(path: Path) -> Path:
    words = ["a", "man", "woman", "plays", "the", "guitar", "dog", "runs", "in", "park", "child",
             "reads", "book"]
    with path.open("w") as f:
        f.write("sentence1\tsentence2\n")
        for i in range(ROWS):
            first = " ".join(words[(i * k) % len(words)] for k in range(1, 4 + i % 7))
            f.write(f"{first} {i}\t{' '.join(reversed(first.split()))}\n")
    return path


def fp32_reference(model_dir: Path, texts: tuple[tuple[str, ...], ...]) -> list[float]:
    """One row at a time (no padding), fp32 weights, no autocast."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, local_files_only=True).float().eval()
    tokenizer = load_tokenizer("tiny", None)
    with torch.inference_mode():
        return [float(model(**tokenizer(a, b, truncation=True, max_length=64,
                                        return_tensors="pt")).logits[0, 0])
                for a, b in zip(*texts, strict=True)]


def test_a_bf16_regression_model_predicts_fp32_scores_unless_asked(bf16_run: Path,
                                                                   tmp_path: Path) -> None:
    file = rows(tmp_path / "rows.tsv")
    p = plan(PredictRequest(model_or_run=bf16_run, file=file, fmt="jsonl"))
    assert p.settings.precision == "fp32"
    got = [json.loads(line)["value"] for line in (execute(p).text or "").splitlines()]
    want = fp32_reference(bf16_run / "model", p.inputs.texts)
    assert len(set(want)) == ROWS  # every row its own score
    assert len(set(got)) == len(set(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    asked = plan(PredictRequest(model_or_run=bf16_run, file=file, fmt="jsonl", precision="bf16"))
    rounded = [json.loads(line)["value"] for line in (execute(asked).text or "").splitlines()]
    # bf16 autocast, as the run computed: asked for, and so given
    assert len(set(rounded)) < ROWS // 2
