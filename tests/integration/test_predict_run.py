"""The model a `cpudist run` saves, used as a user would: `cpudist predict` on the dev rows
reproduces the metric the run reported, exactly; transformers' pipeline() loads the folder and
agrees with predict; and a GLUE run's test split becomes GLUE's submission file, one row per test
row, in the run folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from cpudist.train.data import load_custom, load_glue_tsv
from cpudist.train.metrics import compute_metrics
from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow


def reviews(path: Path, rows: int, seed: int) -> Path:
    """A task `tiny` learns in 60 steps (one word decides), so its calls are mixed and sure: a row
    scored out of order moves the metric, and precision cannot tip a call."""
    rng = random.Random(seed)
    words = {"pos": ["wonderful", "great", "excellent", "superb", "lovely"],
             "neg": ["awful", "terrible", "horrible", "dreadful", "poor"]}
    filler = ["the", "a", "movie", "film", "plot", "actor", "scene", "story", "music", "ending",
              "was", "is", "and", "very", "quite", "really", "it", "this"]
    with path.open("w") as f:
        for _ in range(rows):
            label = rng.choice(["pos", "neg"])
            text = [rng.choice(filler) for _ in range(rng.randrange(4, 12))]
            text.insert(rng.randrange(len(text)), rng.choice(words[label]))
            f.write(json.dumps({"text": " ".join(text), "label": label}) + "\n")
    return path


@pytest.mark.timeout(900)
def test_a_runs_model_predicts_its_dev_metric_exactly_and_pipeline_agrees(tmp_path: Path) -> None:
    train, dev, run = reviews(tmp_path / "train.jsonl", 600, 0), reviews(tmp_path / "dev.jsonl",
                                                                         120, 1), tmp_path / "r"
    r = cpudist("run", "custom", "--np", "1", "--train-file", train, "--validation-file", dev,
                "--model", "tiny", "--max-steps", "60", "--batch-size", "32", "--lr", "5e-3",
                "--dropout", "0", "--output-dir", run, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads((run / "result.json").read_text())

    p = cpudist("predict", run, "--file", dev, "--label-column", "label", "-o",
                tmp_path / "dev.jsonl.out", "--format", "jsonl")
    assert p.returncode == 0, p.stderr
    said = {k: float(v) for k,
            v in (kv.split("=") for kv in p.stderr.split(", ")[-1].split(" -> ")[0].split())}
    # scored as the run scored, and said
    assert said == {k: round(v, 4) for k, v in result["metrics"].items()}
    assert ", fp32, 1 process(es)" in p.stderr  # fp32 unless asked, whatever the run computed in
    records = [json.loads(line) for line in (tmp_path / "dev.jsonl.out").read_text().splitlines()]
    task = load_custom(train, dev, ("text",), "label")
    called = np.array([float(task.label_names.index(r["label"])) for r in records])
    assert len(records) == 120 and 0.2 < called.mean() < 0.8  # both classes called
    assert compute_metrics(task.metrics, called,
                           np.array(task.validation.labels)) == result["metrics"]

    from transformers import pipeline

    # fp32, its own batches
    classify = pipeline("text-classification", model=str(run / "model"), device="cpu")
    theirs = classify(list(task.validation.texts[0]), truncation=True,
                      max_length=result["max_seq_len"])
    agree = sum(t["label"] == r["label"] for t,
                r in zip(theirs, records, strict=True)) / len(records)
    assert agree >= 0.99, agree


@pytest.mark.timeout(900)
def test_a_glue_runs_dev_metric_and_its_test_split_as_glues_submission_file(
        shared_data: Path, tmp_path: Path) -> None:
    mrpc, run = shared_data / "glue" / "MRPC", tmp_path / "run"
    r = cpudist("run", "mrpc", "--np", "1", "--data-dir", mrpc, "--model", "tiny", "--max-steps",
                "3", "--max-train-samples", "48", "--max-eval-samples", "64", "--output-dir", run,
                timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads((run / "result.json").read_text())
    # task and data folder: the run's
    p = cpudist("predict", run, "--split", "dev", "-o", tmp_path / "dev.csv",
                # its calls at the boundary, as the run computed them
                "--precision", result["precision"])
    assert p.returncode == 0, p.stderr
    rows = (tmp_path / "dev.csv").read_text().splitlines()[1:]
    assert len(rows) == 64  # the rows the run scored
    called = np.array([float(row.split(",")[0] == "equivalent") for row in rows])
    labels = np.array(load_glue_tsv("mrpc", mrpc).validation.labels[:64])
    assert compute_metrics(("accuracy", "f1"), called, labels) == result["metrics"]
    assert "accuracy=" in p.stderr and "f1=" in p.stderr  # and says them

    t = cpudist("predict", run, "--split", "test", "--np", "2")
    assert t.returncode == 0, t.stderr
    # run_glue.py's name, in the run folder
    lines = (run / "predict_results_mrpc.txt").read_text().splitlines()
    test_ids = [line.split("\t")[0] for line in (mrpc / "test.tsv").read_text().splitlines()[1:]]
    assert lines[0] == "index\tprediction" and [line.split("\t")[0]
                                                for line in lines[1:]] == test_ids
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
