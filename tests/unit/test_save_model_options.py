"""--save-model and --eval-every at the front door, the result's new fields in old ledgers, and the
card's text."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from huggingface_hub import ModelCard

from cpudist.cli.main import cli
from cpudist.results.card import render_card
from cpudist.results.schema import RunResult
from tests.unit.test_results import result


def test_help_says_where_the_model_goes() -> None:
    out = CliRunner().invoke(cli, ["run", "--help"], terminal_width=200)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert ("--save-model [last|best|none]" in text and "<run folder>/model/" in text
            and "pipeline(" in text)
    assert "--eval-every" in text


def test_refusals_name_the_fix(tmp_path: object) -> None:
    runner = CliRunner()
    base = ["run", "mrpc", "--model", "tiny", "--dry-run"]
    no_eval = runner.invoke(cli, [*base, "--save-model", "best", "--no-eval"])
    assert no_eval.exit_code == 2 and "--save-model best needs evaluations" in no_eval.output
    assert "Drop --no-eval" in no_eval.output
    local = runner.invoke(cli,
                          [*base, "--np", "2", "--sync", "local-sgd", "--sync-every", "4",
                           "--eval-every", "6"])
    assert local.exit_code == 2 and "multiple of --sync-every 4" in local.output
    warm = runner.invoke(cli,
                         [*base, "--np", "2", "--sync", "local-sgd", "--sync-every", "4",
                          "--eval-every", "8", "--local-sgd-warmup", "2"])
    assert warm.exit_code == 2 and "--local-sgd-warmup" in warm.output


def test_old_results_read_without_model_fields_and_new_ones_round_trip() -> None:
    old = result(1, 10.0).to_dict()
    for key in ("save_model", "model_dir", "model_step", "model_bytes", "model_save_s",
                "evaluations", "data", "command"):
        old.pop(key)
    r = RunResult.from_dict(old)
    assert r.save_model == "" and r.model_dir is None and r.evaluations == ()
    new = result(1, 10.0, save_model="best", model_dir="/r/model", model_step=4, model_bytes=10,
                 model_save_s=0.5,
                 evaluations=({"step": 4, "metrics": {"accuracy": 0.7}, "seconds": 0.1},))
    assert RunResult.from_dict(json.loads(json.dumps(new.to_dict()))) == new


def test_card_front_matter_and_body_from_a_result() -> None:
    r = result(4, 10.0, nodes=("a", "b"), ppn=2, model="sentence-transformers/all-MiniLM-L6-v2",
               epochs=3.0,
               base_model="sentence-transformers/all-MiniLM-L6-v2",
               usd_per_hour=2.0, wall_time_s=1800.0, save_model="best", model_step=40,
               command="cpudist run mrpc --np 4",
               data={"source": "glue-tsv", "dir": "/d/MRPC", "train_rows": 3668, "eval_rows": 408,
                     "labels": ["not_equivalent", "equivalent"]},
               evaluations=({"step": 40, "metrics": {"accuracy": 0.7, "f1": 0.8}, "seconds": 1.0},
                            {"step": 80, "metrics": {"accuracy": 0.6, "f1": 0.7}, "seconds": 1.0}))
    card = ModelCard(render_card(r))
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.datasets == [
        "nyu-mll/glue"] and card.data.model_name == "all-MiniLM-L6-v2-mrpc"
    assert {e.metric_type: e.metric_value for e in card.data.eval_results} == {
        "accuracy": 0.7, "f1": 0.8}
    assert "- cost: $1.0000 ($2.000/h for the nodes)" in card.text
    assert ("- ranks x nodes: 4 x 2 (2 per node" in card.text
            and "3 epochs: 10 optimizer steps" in card.text)
    assert "step 40 of 10, the best of 2 evaluations by accuracy" in card.text
    assert "| 80 | 0.6000 | 0.7000 |" in card.text and "cpudist run mrpc --np 4" in card.text
    preset = ModelCard(render_card(result(1, 10.0)))
    assert (preset.data.base_model is None
            and "`tiny` (random initial weights of a preset" in preset.text)


def test_base_model_is_a_hub_id_only(tmp_path: Path) -> None:
    from cpudist.train.export import hub_base

    assert hub_base(
        "sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_base("tiny") is None and hub_base(str(tmp_path)) is None and hub_base(
        "./my-model") is None
