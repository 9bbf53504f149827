"""predict refuses a model of another task or label set than the rows' (by the names, not only their
count), before any model loads, in one line; a model of the rows' own task, regression included,
goes through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.errors import BadInput
from cpudist.predict.job import PredictRequest, plan
from tests.unit.test_predict import model_folder, run_folder

UNNAMED = {"0": "LABEL_0", "1": "LABEL_1"}


def refused(req: PredictRequest) -> str:
    with pytest.raises(BadInput) as e:
        plan(req)
    return str(e.value.message)


def custom_run(path: Path, task: str = "custom", id2label: dict[str, str] | None = None) -> Path:
    model_folder(path / "model", id2label or {"0": "neg", "1": "pos"})
    (path / "result.json").write_text(json.dumps({"task": task, "precision": "fp32"}))
    return path


def stsb(path: Path) -> Path:
    path.mkdir()
    (path / "dev.tsv").write_text(
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\t"
        "score\n0\tmain\tx\t2012\t0\tnone\tnone\tA man plays.\tA man is "
        "playing.\t4.2\n")
    return path


def test_a_model_of_another_glue_task_is_refused_saying_what_it_was_trained_on(
        shared_data: Path, tmp_path: Path) -> None:
    run = run_folder(tmp_path / "mrpc")  # MRPC's run: RTE and SST-2 have two classes too
    rte, sst2 = shared_data / "glue" / "RTE", shared_data / "glue" / "SST-2"
    said = refused(PredictRequest(model_or_run=run, split="dev", task="rte", data_dir=rte))
    assert "was trained on MRPC (classes not_equivalent, equivalent); the rows are RTE's" in said
    assert "Give a model trained on RTE" in said
    assert "the rows are SST-2's" in refused(PredictRequest(model_or_run=run, split="test",
                                                            task="sst2", data_dir=sst2))
    away = run / "model"  # copied away from its run: its card says the task
    (run / "result.json").unlink()
    (run / "command.txt").unlink()
    (away / "README.md").write_text("## Task and data\n\n- Task: `mrpc` (2-class classification)\n")
    assert "was trained on MRPC" in refused(PredictRequest(model_or_run=away, split="dev",
                                                           task="rte", data_dir=rte))
    (away / "README.md").unlink()  # nothing says the task: its class names are not RTE's
    said = refused(PredictRequest(model_or_run=away, split="dev", task="rte", data_dir=rte))
    assert ("predicts classes not_equivalent, equivalent; RTE's rows have classes entailment, "
            "not_entailment") in said
    # RTE's very names
    qnli = custom_run(tmp_path / "qnli", "qnli", {"0": "entailment", "1": "not_entailment"})
    assert "trained on QNLI" in refused(PredictRequest(model_or_run=qnli, split="dev", task="rte",
                                                       data_dir=rte))


def test_custom_data_against_a_glue_task_and_a_glue_model_against_custom_data(
        shared_data: Path, tmp_path: Path) -> None:
    sst2 = shared_data / "glue" / "SST-2"
    mine = custom_run(tmp_path / "mine")
    said = refused(PredictRequest(model_or_run=mine, split="dev", task="sst2", data_dir=sst2))
    assert "was trained on custom data (classes neg, pos); the rows are SST-2's" in said
    mine_away = mine / "model"
    (mine / "result.json").unlink()
    assert "predicts classes neg, pos; SST-2's rows have classes negative, positive" in refused(
        PredictRequest(model_or_run=mine_away, split="dev", task="sst2", data_dir=sst2))
    rows = tmp_path / "rows.csv"
    rows.write_text("sentence,label\ngreat film,0\n")
    glue = run_folder(tmp_path / "mrpc")
    assert "trained on MRPC" in refused(PredictRequest(model_or_run=glue, file=rows,
                                                       text_columns=("sentence",), task="custom"))
    assert "the rows are SST-2's" in refused(PredictRequest(model_or_run=glue, file=rows,
                                                            task="sst2", label_column="label"))
    # a file's labels are the model's names or ids
    rows.write_text("sentence,label\ngreat film,positive\n")
    with pytest.raises(BadInput, match="unknown label 'positive'"):
        plan(PredictRequest(model_or_run=glue, file=rows, text_columns=("sentence",),
                            label_column="label"))


def test_the_matching_task_and_regression_go_through(shared_data: Path, tmp_path: Path) -> None:
    mrpc = shared_data / "glue" / "MRPC"
    assert len(plan(PredictRequest(model_or_run=run_folder(tmp_path / "run"), split="dev",
                                   data_dir=mrpc)).inputs) == 100
    # GLUE's files' names, no record: either kind
    glue_own = model_folder(tmp_path / "ids", {"0": "0", "1": "1"})
    assert plan(PredictRequest(model_or_run=glue_own, split="dev", task="mrpc",
                               data_dir=mrpc)).inputs.labels is not None
    sts, reg = stsb(tmp_path / "STS-B"), model_folder(tmp_path / "reg", regression=True)
    assert plan(PredictRequest(model_or_run=reg, split="dev", task="stsb",
                               data_dir=sts)).inputs.labels == (4.2,)
    said = refused(PredictRequest(model_or_run=reg, split="dev", task="mrpc", data_dir=mrpc))
    assert ("predicts a score (regression); MRPC's rows have classes not_equivalent, "
            "equivalent") in said
    said = refused(PredictRequest(model_or_run=glue_own, split="dev", task="stsb", data_dir=sts))
    assert "predicts classes 0, 1; STS-B's rows have a score (regression)" in said


def test_unnamed_classes_need_a_record_of_the_task_and_a_base_model_is_refused(
        shared_data: Path, tmp_path: Path) -> None:
    """LABEL_0, LABEL_1 say nothing: against a GLUE task they pass only where the model's run says
    its task; a folder whose architecture has no classifier head would get a random one, and is
    refused for any rows."""
    rte = shared_data / "glue" / "RTE"
    bare = model_folder(tmp_path / "bare", UNNAMED)
    said = refused(PredictRequest(model_or_run=bare, split="dev", task="rte", data_dir=rte))
    assert "names its classes LABEL_0, LABEL_1 and no run or card says its task" in said
    assert "never fine-tuned" in said and "(entailment, not_entailment) into id2label" in said
    recorded = custom_run(tmp_path / "run", "rte", UNNAMED)
    assert len(plan(PredictRequest(model_or_run=recorded, split="dev", data_dir=rte)).inputs) == 277
    rows = tmp_path / "rows.csv"
    rows.write_text("text\nhello\n")
    # no task to match
    assert plan(PredictRequest(model_or_run=bare, file=rows)).source.label_names == ("LABEL_0",
                                                                                     "LABEL_1")
    base = model_folder(tmp_path / "base", UNNAMED)
    (base / "config.json").write_text(json.dumps({"architectures": ["BertModel"],
                                                  "model_type": "bert"}))
    said = refused(PredictRequest(model_or_run=base, file=rows))
    assert ("holds a base model (BertModel) without a classification head" in said
            and "Fine-tune it first" in said)


def test_the_command_says_it_in_one_line_exit_2(shared_data: Path, tmp_path: Path) -> None:
    run = run_folder(tmp_path / "mrpc")
    r = CliRunner().invoke(cli,
                           ["predict", str(run), "--split", "dev", "--task", "RTE", "--data-dir",
                            str(shared_data / "glue" / "RTE")], terminal_width=200)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert "trained on MRPC" in r.stderr and "Traceback" not in r.stderr
