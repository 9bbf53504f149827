"""cpudist predict's parts: finding the model and its run's record, reading rows, writing
predictions, the plan, and the batches (the run's evaluation's own, so its metric comes back
exactly)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cpudist.errors import BadInput
from cpudist.predict import outputs
from cpudist.predict.inputs import metric_names, read_file, read_split
from cpudist.predict.job import PredictRequest, describe, plan
from cpudist.predict.outputs import Prediction, pick_format, predictions, render
from cpudist.predict.source import find_source, read_facts
from tests.unit.test_cli_front_door import _imported_after

COMMAND = ("/usr/bin/mpiexec.hydra -np 2 -ppn 2 -genv OMP_NUM_THREADS 1 /usr/bin/python3.11 -m "
           "cpudist.rank "
           "--task=mrpc --output-dir=/x/run --model=tiny --data-dir=/data/glue/MRPC "
           "--max-seq-len=96 "
           "--eval-batch-size=32 --max-eval-samples=100 --max-steps=3\n")


def model_folder(path: Path, id2label: dict[str, str] | None = None,
                 regression: bool = False) -> Path:
    """A folder with the config.json a saved classifier has (enough for everything but loading
    weights)."""
    path.mkdir(parents=True)
    config: dict[str, object] = {"architectures": ["BertForSequenceClassification"],
                                 "model_type": "bert"}
    if regression:
        config.update(num_labels=1, problem_type="regression", id2label={"0": "LABEL_0"})
    else:
        config["id2label"] = id2label or {"0": "not_equivalent", "1": "equivalent"}
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer_config.json").write_text("{}")
    return path


def run_folder(path: Path, precision: str = "bf16", with_model: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "result.json").write_text(json.dumps({"task": "mrpc", "precision": precision,
                                                  "max_seq_len": 96,
                                                  "world_size": 2, "metrics": {"accuracy": 0.5}}))
    (path / "command.txt").write_text(COMMAND)
    if with_model:
        model_folder(path / "model")
    return path


def test_a_run_folder_gives_its_model_and_what_the_run_recorded(tmp_path: Path) -> None:
    run = run_folder(tmp_path / "run")
    for given in (run, run / "model"):  # the run, or its model folder: the same record either way
        source = find_source(given)
        assert source.model_dir == run / "model" and source.run_dir == run
        assert source.label_names == ("not_equivalent", "equivalent")
        facts = source.facts
        assert (facts.task, facts.precision, facts.max_seq_len, facts.world_size) == (
            "mrpc", "bf16", 96, 2)
        # from command.txt
        assert facts.data_dir == "/data/glue/MRPC" and facts.eval_batch_size == 32
    bare = find_source(model_folder(tmp_path / "bare"))
    assert bare.run_dir is None and bare.facts.precision is None


def test_a_laptop_runs_data_folder_is_the_one_the_user_gave_not_the_heads_copy(
    tmp_path: Path) -> None:
    """From a laptop command.txt names the head's stage folder; result.json's data names the user's
    own, and `predict --split dev` must read that one on the laptop."""
    run = run_folder(tmp_path / "run")
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**result,
                                                 "data": {"dir": "../shared/data/glue/MRPC"}}))
    assert find_source(run).facts.data_dir == "../shared/data/glue/MRPC"
    assert find_source(model_folder(tmp_path / "reg", regression=True)).is_regression


def test_facts_survive_a_command_of_another_shape(tmp_path: Path) -> None:
    run = run_folder(tmp_path / "run")
    (run / "command.txt").write_text("#!/bin/bash\n#SBATCH -N 2\nsrun python -m cpudist.rank "
                                     "--bogus-option=1\n")
    facts = read_facts(run)
    assert facts.precision == "bf16" and facts.eval_batch_size is None  # result.json alone


@pytest.mark.parametrize(("make", "says", "hint"), [
    (lambda p: run_folder(p, with_model=False), "has no model/", "--save-model last"),
    (lambda p: p.mkdir(), "holds no model", "save_pretrained()"),
    (lambda p: None, "not found", "run folder"),
    (lambda p: (model_folder(p) / "tokenizer_config.json").unlink(), "no tokenizer",
     "tokenizer.save_pretrained"),
])
def test_no_model_is_one_bad_input_saying_how_to_get_one(tmp_path: Path, make: object, says: str,
                                                          hint: str) -> None:
    target = tmp_path / "x"
    make(target)  # type: ignore[operator]
    with pytest.raises(BadInput) as e:
        find_source(target)
    assert says in e.value.what and hint in e.value.format_message()


def test_glue_splits_read_as_glue_lays_them_out(shared_data: Path, tmp_path: Path) -> None:
    mrpc = shared_data / "glue" / "MRPC"
    test = read_split("mrpc", "test", mrpc)
    assert len(test) == 1725 and test.ids[:3] == ("0", "1", "2") and test.labels is None
    assert test.texts[0][0].startswith("PCCW 's chief operating officer")
    dev = read_split("mrpc", "dev", mrpc)
    assert len(dev) == 408 and dev.labels is not None and set(dev.labels) == {0.0, 1.0}
    assert dev.metrics == ("accuracy", "f1") and dev.texts[1][0].startswith('" The foodservice pie')
    qqp = tmp_path / "QQP"
    qqp.mkdir()
    (qqp / "test.tsv").write_text("id\tquestion1\tquestion2\n7\tWhy?\tHow?\n3\tA\tB\n")
    # QQP numbers by `id`, found under glue/QQP
    assert read_split("qqp", "test", tmp_path).ids == ("7", "3")
    (qqp / "test.tsv").write_text("question1\tquestion2\nWhy?\tHow?\n")
    with pytest.raises(BadInput, match="no 'id' column"):
        read_split("qqp", "test", qqp)
    with pytest.raises(BadInput, match=r"no test\.tsv"):
        read_split("rte", "test", tmp_path)


def test_files_read_as_run_reads_custom_data(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text('text,other\n"hello, world",1\nbye,2\n')
    (tmp_path / "a.jsonl").write_text('{"q": "x", "p": "y"}\n{"q": "z", "p": "w"}\n')
    assert read_file(tmp_path / "a.csv", ("text",)).texts == (("hello, world", "bye"),)
    pair = read_file(tmp_path / "a.jsonl", ("q", "p"))
    assert pair.texts == (("x", "z"), ("y", "w")) and pair.ids == ("0", "1")
    with pytest.raises(BadInput) as e:
        read_file(tmp_path / "a.csv", ("sentence",))
    assert "--text-columns" in e.value.format_message() and "text, other" in e.value.what


def test_a_files_label_column_is_scored_by_class_name_or_id(tmp_path: Path) -> None:
    names = ("neg", "pos")
    (tmp_path / "a.csv").write_text("text,label,stars\ngood,pos,4.5\nbad,0,1.0\nmeh,neg,2.5\n")
    rows = read_file(tmp_path / "a.csv", ("text",), "label", names, "custom")
    assert rows.labels == (1.0, 0.0, 0.0) and rows.metrics == ("accuracy", "f1")
    # GLUE's own
    assert read_file(tmp_path / "a.csv", ("text",), "label", names, "sst2").metrics == ("accuracy",)
    assert read_file(tmp_path / "a.csv", ("text",), "stars", (), None).labels == (4.5, 1.0, 2.5)
    assert metric_names(("a", "b", "c"), None) == ("accuracy", "f1_macro")
    with pytest.raises(BadInput) as e:
        read_file(tmp_path / "a.csv", ("text",), "label", ("negative", "positive"), None)
    assert ("unknown label 'pos'" in e.value.what
            and "negative, positive" in e.value.format_message())
    assert read_file(tmp_path / "a.csv", ("text",)).labels is None


def test_predictions_take_the_argmax_of_the_logits_and_softmax_scores() -> None:
    names = ("not_equivalent", "equivalent")
    got = predictions([[0.0, 2.0], [1.0, -1.0], [0.5, 0.5]], names)
    # a tie: the first
    assert [p.label for p in got] == ["equivalent", "not_equivalent", "not_equivalent"]
    assert got[0].scores["equivalent"] == pytest.approx(0.880797, abs=1e-6)
    assert sum(got[1].scores.values()) == pytest.approx(1.0)
    assert predictions([[3.25]], ())[0].value == 3.25
    assert outputs.class_ids([[0.0, 2.0], [1.0, -1.0]], False) == [1.0, 0.0]


def test_glue_submission_uses_glues_label_names_and_the_files_ids() -> None:
    names = ("not_equivalent", "equivalent")
    preds = predictions([[0.0, 2.0], [1.0, -1.0]], names)
    assert render(preds, ("0", "1"), "glue", names, "mrpc") == "index\tprediction\n0\t1\n1\t0\n"
    entail = ("entailment", "not_entailment")
    rte = predictions([[0.0, 2.0]], entail)
    assert render(rte, ("5",), "glue", entail, "rte") == "index\tprediction\n5\tnot_entailment\n"
    stsb = predictions([[3.14159]], ())
    assert render(stsb, ("0",), "glue", (), "stsb") == "index\tprediction\n0\t3.142\n"
    with pytest.raises(BadInput, match="GLUE's mnli has 3"):
        render(preds, ("0", "1"), "glue", names, "mnli")


def test_jsonl_csv_and_json_hold_label_and_every_score_in_input_order() -> None:
    names = ("neg", "pos")
    preds = predictions([[0.0, 1.0], [2.0, 0.0]], names)
    lines = [json.loads(line)
             for line in render(preds, ("0", "1"), "jsonl", names, None).splitlines()]
    assert [r["label"] for r in lines] == ["pos", "neg"]
    assert set(lines[0]["scores"]) == {"neg", "pos"}
    assert json.loads(render(preds, ("0", "1"), "json", names, None)) == lines
    rows = list(csv.reader(io.StringIO(render(preds, ("0", "1"), "csv", names, None))))
    assert rows[0] == ["label", "score", "score:neg", "score:pos"]
    assert [r[0] for r in rows[1:]] == ["pos", "neg"]
    assert float(rows[1][1]) == float(rows[1][3])
    assert render([Prediction(None, {}, 0.5)], ("0",), "csv", (), None) == "value\n0.5\n"


def test_the_format_comes_from_the_option_the_suffix_or_the_input() -> None:
    assert (pick_format("p.csv", None, False) == "csv"
            and pick_format("p.jsonl", None, True) == "jsonl")
    assert pick_format("p.txt", None, False) == "glue" and pick_format(None, None, True) == "glue"
    assert (pick_format(None, None, False) == "jsonl"
            and pick_format("p.csv", "json", False) == "json")
    with pytest.raises(BadInput, match="--format"):
        pick_format("p.parquet", None, False)


def test_the_plan_takes_the_runs_lengths_and_batches_fp32_unless_asked_and_the_option_wins(
        shared_data: Path, tmp_path: Path) -> None:
    run = run_folder(tmp_path / "run")
    (run / "command.txt").write_text(COMMAND.replace("/data/glue/MRPC",
                                                     str(shared_data / "glue" / "MRPC")))
    p = plan(PredictRequest(model_or_run=run, split="test", np=2))
    s = p.settings
    # the bf16 run's scores, not rounded
    assert (s.precision, s.max_seq_len, s.batch_size) == ("fp32", 96, 32)
    assert p.precision_from == ("the default; the run computed in bf16: --precision bf16 gives "
                                "its own numbers")
    assert (p.output == run / "predict_results_mrpc.txt" and p.fmt == "glue"
            and len(p.inputs) == 1725)
    assert s.threads >= 1 and p.np == 2
    text = describe(p)
    assert "1725 from" in text and "fp32 (the default; the run computed in bf16" in text
    assert "predict_results_mrpc.txt" in text
    p = plan(PredictRequest(model_or_run=run, split="dev", precision="bf16", batch_size=8,
                            output="-"))
    assert (p.settings.precision, p.settings.batch_size, p.output, p.fmt) == (
        "bf16", 8, None, "glue")
    # the rows the run scored
    assert p.inputs.labels is not None and len(p.inputs.labels) == len(p.inputs) == 100
    assert len(plan(PredictRequest(model_or_run=run, split="dev", max_rows=7)).inputs.texts[1]) == 7
    bare = model_folder(tmp_path / "bare")
    (tmp_path / "rows.csv").write_text("text\nhello\n")
    p = plan(PredictRequest(model_or_run=bare, file=tmp_path / "rows.csv"))
    assert (p.settings.precision, p.settings.max_seq_len, p.settings.batch_size) == (
        "fp32", 128, 64)
    assert p.output is None and p.fmt == "jsonl"
    # a card, away from its run
    (bare / "README.md").write_text("## Training\n\n- seed 42, precision bf16, sync ddp\n")
    p = plan(PredictRequest(model_or_run=bare, file=tmp_path / "rows.csv"))
    assert p.settings.precision == "fp32" and "the run computed in bf16" in p.precision_from


@pytest.mark.parametrize(("request_", "says"), [
    ({}, "nothing to predict"),
    ({"file": Path("rows.csv"), "split": "dev"}, "either --file or --split"),
    # a bare model: no run's data folder
    ({"split": "test", "task": "mrpc"}, "needs the task and its data folder"),
])
def test_what_to_predict_is_checked_before_any_model_loads(tmp_path: Path,
                                                           request_: dict[str, object],
                                                           says: str) -> None:
    bare = model_folder(tmp_path / "bare")
    with pytest.raises(BadInput) as e:
        plan(PredictRequest(model_or_run=bare, **request_))  # type: ignore[arg-type]
    assert says in e.value.what


def test_a_model_of_another_task_is_refused_for_its_glue_split(shared_data: Path,
                                                               tmp_path: Path) -> None:
    three = model_folder(tmp_path / "m", {"0": "a", "1": "b", "2": "c"})
    with pytest.raises(BadInput,
                       match="predicts classes a, b, c; MRPC's rows have classes not_equivalent"):
        plan(PredictRequest(model_or_run=three, split="test", task="mrpc",
                            data_dir=shared_data / "glue" / "MRPC"))


def test_predict_help_and_dry_run_import_no_torch(tmp_path: Path) -> None:
    out, heavy = _imported_after("predict", "--help")
    assert heavy == set() and "--text-columns" in out
    (tmp_path / "rows.csv").write_text("text\nhello\n")
    out, heavy = _imported_after("predict", str(model_folder(tmp_path / "m")), "--file",
                                 str(tmp_path / "rows.csv"), "--dry-run")
    assert heavy == set() and "rows:      1 from" in out and "output:    stdout (jsonl)" in out
