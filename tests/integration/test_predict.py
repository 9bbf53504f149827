"""`cpudist predict` as a user runs it: real processes (--np 2 workers), real files, one-line
errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cpudist.cli.main import cli
from tests.integration.helpers import cpudist
from tests.unit.test_predict_batches import save_tiny


def in_process(*args: str | Path) -> Result:
    """`cpudist predict ...` in this process, for what is decided before any worker starts (a
    subprocess would import the CLI once more for each; the workers' own bad input, and the exit
    codes of the real command, are checked with subprocesses below)."""
    r = CliRunner().invoke(cli, [str(a) for a in args], terminal_width=200)
    # a Traceback otherwise
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exc_info
    return r


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    folder = tmp_path_factory.mktemp("model")
    save_tiny(folder, shared_data)
    return folder


@pytest.mark.slow
def test_np_2_gives_np_1s_predictions_and_a_submission_row_per_test_row(
        model: Path, shared_data: Path, tmp_path: Path) -> None:
    mrpc = shared_data / "glue" / "MRPC"
    split = ["--split", "test", "--task", "mrpc", "--data-dir", mrpc]
    two = cpudist("predict", model, *split, "--np", "2", "-o", tmp_path / "two.txt")
    assert two.returncode == 0, two.stderr
    assert "predicted 1725 rows" in two.stderr and "2 process(es)" in two.stderr
    lines = (tmp_path / "two.txt").read_text().splitlines()
    test_ids = [line.split("\t")[0] for line in (mrpc / "test.tsv").read_text().splitlines()[1:]]
    assert lines[0] == "index\tprediction" and [line.split("\t")[0]
                                                for line in lines[1:]] == test_ids
    # GLUE's names for MRPC, both used
    assert {line.split("\t")[1] for line in lines[1:]} == {"0", "1"}
    one = cpudist("predict", model, *split, "--np", "1", "--format", "jsonl", "-o",
                  tmp_path / "one.jsonl")
    assert one.returncode == 0 and "1 process(es) x" in one.stderr, one.stderr
    records = [json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert len(records) == 1725 and all(set(r) == {"label", "score", "scores"} for r in records)
    # Gathered in input order: rows out of order would disagree on about half of them. Other batches
    # and thread counts round fp32 differently in the last bits, which may tip a row at the
    # boundary; nothing more.
    calls = [line.endswith("\t1") for line in lines[1:]]
    assert sum((r["label"] == "equivalent") != c for r, c in zip(records, calls, strict=True)) <= 2


def test_a_file_to_csv_or_stdout_and_a_dry_run_that_writes_nothing(model: Path,
                                                                   tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"a": f"the cat sat {i}", "b": "on the mat"}) + "\n"
                            for i in range(5)))
    dry = in_process("predict", model, "--file", rows, "--text-columns", "a,b", "-o",
                     tmp_path / "p.csv", "--dry-run")
    assert dry.exit_code == 0 and "rows:      5 from" in dry.stdout and "(csv)" in dry.stdout, \
        dry.stderr
    assert not (tmp_path / "p.csv").exists()
    r = cpudist("predict", model, "--file", rows, "--text-columns", "a,b", "-o", tmp_path / "p.csv")
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "label,score,score:not_equivalent,score:equivalent" and len(lines) == 6
    out = cpudist("predict", model, "--file", rows, "--text-columns", "a,b")
    assert out.returncode == 0, out.stderr
    records = [json.loads(x) for x in out.stdout.splitlines()]
    assert [r["label"] for r in records] == [line.split(",")[0] for line in lines[1:]]


def test_bad_input_is_one_line_exit_2_also_from_a_worker(model: Path, shared_data: Path,
                                                         tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text("{}")
    r = in_process("predict", run, "--split", "test", "--task", "mrpc", "--data-dir",
                   shared_data / "glue" / "MRPC")
    assert r.exit_code == 2 and "--save-model" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # before any model loads: nothing else said
    rows = tmp_path / "rows.csv"
    rows.write_text("text\nhello\nworld\n")
    broken = tmp_path / "truncated"
    broken.mkdir()
    for f in model.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a copy cut short
    # the workers load it, and say why they cannot
    w = cpudist("predict", broken, "--file", rows, "--np", "2")
    assert w.returncode == 2 and "predict process 0 of 2 failed" in w.stderr, w.stderr
    assert "cannot load the model" in w.stderr and "Traceback" not in w.stderr
    assert len(w.stderr.strip().splitlines()) == 2  # the start line, then the error
