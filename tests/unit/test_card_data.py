"""The card's task and data: GLUE's own spelling of each task, and the data as the user gave it (the
ranks read a staged copy), which the launching side hands rank 0 before the card is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from cpudist.config import TrainConfig
from cpudist.results.card import render_card
from cpudist.results.launched import Launched, write_report
from cpudist.run.outcome import given_data, record
from cpudist.train.setup import data_source
from tests.unit.test_results import result

SPELLED = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
           "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


@pytest.mark.parametrize(("task", "spelled"), SPELLED.items())
def test_each_glue_task_is_spelled_as_glue_spells_it(task: str, spelled: str) -> None:
    for data_dir in ("glue/x", None):  # GLUE's files, or the Hub's dataset (named by its id)
        data = data_source(TrainConfig(task=task, output_dir="r", data_dir=data_dir))
        card = ModelCard(render_card(result(1, 10.0, task=task, data=data)))
        assert f"on GLUE {spelled} by data-parallel" in card.text
        evaluated = card.data.eval_results  # type: ignore[attr-defined]
        assert {e.dataset_name for e in evaluated} == {f"GLUE {spelled}"}
    assert f"- Data: GLUE {spelled} in GLUE's TSV layout from `glue/x`" in render_card(
        result(1, 10.0, task=task,
               data=data_source(TrainConfig(task=task, output_dir="r", data_dir="glue/x"))))
    assert "- Data: the Hub's `nyu-mll/glue` dataset, config" in card.text


def test_the_record_names_the_users_data_not_the_staged_copy(tmp_path: Path) -> None:
    staged = {"source": "glue-tsv", "dir": "/root/.cpudist/stage/data-1a2b", "name": "STS-B",
              "train_rows": 7}
    r = result(1, 10.0, task="stsb", data=staged)
    write_report(tmp_path, r)
    launched = Launched(data=given_data(TrainConfig(task="stsb", output_dir="r",
                                                    data_dir="glue/STS-B")))
    done = record(tmp_path, None, launched)
    assert done.data == {**staged, "dir": "glue/STS-B"}
    # what rank 0 renders, the launch's part in hand
    card = render_card(launched.card_part().apply(r))
    assert "- Data: GLUE STS-B in GLUE's TSV layout from `glue/STS-B`" in card
    custom = TrainConfig(task="custom", output_dir="r", train_file="mine/train.csv",
                         validation_file="mine/dev.csv")
    assert given_data(custom) == {"train": "mine/train.csv", "validation": "mine/dev.csv"}
    # the Hub's: nothing of the user's to name
    assert given_data(TrainConfig(task="mrpc", output_dir="r")) == {}
