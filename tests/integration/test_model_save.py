"""The model a run leaves in <run folder>/model/: real runs, loaded back with transformers and
huggingface_hub."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow


def mrpc(shared_data: Path) -> list[str]:
    return ["mrpc", "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny"]


def _inverted_data(folder: Path) -> tuple[Path, Path]:
    """A task a tiny model learns in a few steps (rows of 'alpha' are pos, of 'beta' neg) whose
    validation rows say the opposite: the better the model learns, the worse it scores, so the best
    evaluation is an early one."""
    rng = random.Random(0)

    def rows(n: int, flip: bool) -> str:
        lines = ["text,label"]
        for i in range(n):
            word, label = ("alpha", "pos") if i % 2 == 0 else ("beta", "neg")
            if flip:
                label = "neg" if label == "pos" else "pos"
            lines.append(f"{' '.join([word] * rng.randint(2, 6))},{label}")
        return "\n".join(lines) + "\n"

    train, validation = folder / "train.csv", folder / "validation.csv"
    train.write_text(rows(256, flip=False))
    validation.write_text(rows(64, flip=True))
    return train, validation


def _result(run: Path) -> dict[str, Any]:
    return json.loads((run / "result.json").read_text())


def _reevaluate(model_dir: Path, train: Path, validation: Path,
                label: str = "label") -> dict[str, float]:
    """Score the saved folder on the run's validation rows with cpudist's own evaluation (1 rank,
    fp32)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from cpudist.train.data import load_custom
    from cpudist.train.evaluate import evaluate
    from cpudist.train.features import encode

    task = load_custom(train, validation, ("text",), label)
    data = encode(task.validation, AutoTokenizer.from_pretrained(model_dir), 128)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    metrics, _ = evaluate(model, data, task.metrics, task.is_regression, 64, False, 0, 1)
    return metrics


def test_two_rank_run_saves_a_model_pipeline_loads_with_its_card(shared_data: Path,
                                                                 tmp_path: Path) -> None:
    """Rank 0 alone writes model/ once, complete; pipeline() loads it with MRPC's class names; the
    card names it."""
    from huggingface_hub import ModelCard
    from safetensors.torch import load_file
    from transformers import AutoConfig, pipeline

    run = tmp_path / "RUN"
    r = cpudist("run", *mrpc(shared_data), "--np", "2", "--ppn", "2", "--max-steps", "4",
                "--max-eval-samples", "64",
                # 4 steps of 32 rows: tokenizing no more
                "--max-train-samples", "128", "--output-dir", run)
    assert r.returncode == 0, r.stderr
    model, result = run / "model", _result(run)
    # the closing line says where it is
    assert r.stdout.rstrip().endswith(f"model {model.resolve()}")
    assert r.stderr.count("model saved: ") == 1  # one writer: rank 0
    assert not (run / "model.tmp").exists()
    assert result["save_model"] == "last" and result["model_dir"] == str(
        model.resolve()) and result["model_step"] == 4
    assert result["model_bytes"] == sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert result["model_save_s"] > 0
    assert [e["step"] for e in result["evaluations"]] == [4]
    assert result["evaluations"][0]["metrics"] == result["metrics"]

    # complete: safetensors checks every tensor's bytes
    weights = load_file(str(model / "model.safetensors"))
    config = AutoConfig.from_pretrained(model)
    assert config.id2label == {0: "not_equivalent", 1: "equivalent"}
    assert config.label2id["equivalent"] == 1
    assert "classifier.weight" in weights
    assert weights["classifier.weight"].shape == (2, config.hidden_size)
    classify = pipeline("text-classification", model=str(model))
    out = classify({"text": "The cat sat on the mat.",
                    "text_pair": "A cat was sitting on the mat."})
    assert out["label"] in ("not_equivalent", "equivalent") and 0 < out["score"] <= 1

    card = ModelCard.load(model / "README.md")
    assert (card.data.library_name == "transformers"
            and card.data.pipeline_tag == "text-classification")
    assert card.data.datasets == ["nyu-mll/glue"] and card.data.metrics == ["accuracy", "f1"]
    scored = {e.metric_type: e.metric_value for e in card.data.eval_results}
    assert scored == {k: round(v, 4) for k, v in result["metrics"].items()}
    # the command as typed
    assert f"--output-dir {run}" in card.text and "cpudist run mrpc --data-dir" in card.text
    assert ("2 x 1 (2 per node, launched with mpich)" in card.text
            and "0: not_equivalent, 1: equivalent" in card.text)
    assert result["cpu"]["kind"] in card.text and "step 4 of 4" in card.text


def test_save_model_none_writes_nothing(shared_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "RUN"
    r = cpudist("run", *mrpc(shared_data), "--max-steps", "2", "--max-eval-samples", "32",
                "--save-model", "none", "--max-train-samples", "64", "--output-dir", run)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("model")) == []
    result = _result(run)
    assert (result["save_model"] == "none" and result["model_dir"] is None
            and result["model_bytes"] is None)
    assert "model saved" not in r.stderr and ", model " not in r.stdout


def test_best_keeps_the_best_evaluation_diloco(tmp_path: Path) -> None:
    """--save-model best over several evaluations of a DiLoCo run on 2 ranks: the saved weights
    score the best evaluation's metric (an early one here), not the last's, when scored again from
    the folder."""
    from transformers import AutoConfig

    train, validation = _inverted_data(tmp_path)
    run = tmp_path / "RUN"
    r = cpudist("run", "custom", "--train-file", train, "--validation-file", validation, "--model",
                "tiny",
                "--np", "2", "--ppn", "2", "--sync", "local-sgd", "--sync-every", "2",
                "--outer-optimizer", "nesterov",
                # 5e-3 x 2 ranks (--lr-scaling auto): the 1e-2 that makes the inverted data undo the
                # early model
                "--max-steps", "24", "--eval-every", "4", "--lr", "5e-3", "--warmup-ratio", "0",
                "--batch-size", "8",
                "--precision", "fp32", "--dropout", "0", "--save-model", "best", "--output-dir",
                run)
    assert r.returncode == 0, r.stderr
    result = _result(run)
    # evaluated so; the saved model is transformers' stock one
    assert result["last_layer"] == "first-token"
    evals = result["evaluations"]
    assert [e["step"] for e in evals] == [4, 8, 12, 16, 20, 24]
    accuracy = [e["metrics"]["accuracy"] for e in evals]
    # the first of equals, as HF's load_best_model_at_end keeps
    best = accuracy.index(max(accuracy))
    assert accuracy[best] > accuracy[-1], f"the data should make the last evaluation worse: {evals}"
    assert (result["model_step"] == evals[best]["step"]
            and result["metrics"] == evals[best]["metrics"])
    assert f"step {evals[best]['step']} of 24, the best of 6 evaluations by accuracy" in (
        run / "model" / "README.md").read_text()
    again = _reevaluate(run / "model", train, validation)
    # Every metric, f1 too: at 0.5 accuracy on these balanced rows, all-pos and all-neg models
    # differ in f1 only.
    assert again == pytest.approx(evals[best]["metrics"], abs=1e-9), evals
    # custom classes, id order
    assert AutoConfig.from_pretrained(run / "model").id2label == {0: "neg", 1: "pos"}


def test_regression_model_is_marked_as_hf_marks_it_frozen_embeddings_saved(tmp_path: Path) -> None:
    """Scores with fractions (as STS-B's) train a regression: one output, problem_type regression,
    pipeline loads. With --freeze-embeddings the folder holds the untouched word embeddings beside
    the trained rest, and scores what the run's evaluation scored."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, pipeline

    from cpudist.train.models import build_model

    lines = ["text,score", *(f"{'good ' * (i % 5 + 1)}day,{(i % 5) / 2:.1f}" for i in range(40))]
    scores = tmp_path / "scores.csv"
    scores.write_text("\n".join(lines) + "\n")
    run = tmp_path / "RUN"
    r = cpudist("run", "custom", "--train-file", scores, "--validation-file", scores,
                "--label-column", "score", "--model", "tiny", "--max-steps", "3", "--lr", "1e-3",
                "--precision", "fp32", "--freeze-embeddings", "--output-dir", run)
    assert r.returncode == 0, r.stderr
    config = AutoConfig.from_pretrained(run / "model")
    assert config.problem_type == "regression" and config.num_labels == 1
    result = _result(run)
    assert set(result["metrics"]) == {"pearson", "spearmanr"}
    assert (_reevaluate(run / "model", scores, scores, "score")
            == pytest.approx(result["metrics"], abs=1e-6))
    torch.manual_seed(42)  # the run's seed: its initial model (cpudist/train/setup.py)
    initial = build_model("tiny", 1, True, None).state_dict()
    saved = load_file(str(run / "model" / "model.safetensors"))
    table = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(saved[table], initial[table])  # frozen: saved as it was used
    # trained: saved as trained
    assert not torch.equal(saved["classifier.weight"], initial["classifier.weight"])
    out = pipeline("text-classification", model=str(run / "model"),
                   function_to_apply="none")("good good day")
    assert isinstance(out[0]["score"], float)
