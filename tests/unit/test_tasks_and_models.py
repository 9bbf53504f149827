from __future__ import annotations

import pytest

from cpudist.errors import BadInput
from cpudist.train.models import PRESETS, is_local_model, resolve_model
from cpudist.train.tasks import GLUE_TASKS, normalize_task


@pytest.mark.parametrize(("given", "expected"),
                         [("SST-2", "sst2"), ("sts-b", "stsb"), ("MRPC", "mrpc"),
                          ("synthetic", "synthetic"), ("custom", "custom")])
def test_task_aliases(given: str, expected: str) -> None:
    assert normalize_task(given) == expected


def test_all_nine_glue_tasks() -> None:
    assert set(GLUE_TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
    assert GLUE_TASKS["stsb"].is_regression and GLUE_TASKS["mnli"].num_labels == 3


def test_unknown_task_is_bad_input() -> None:
    with pytest.raises(BadInput, match="unknown task 'squad'") as e:
        normalize_task("squad")
    assert e.value.exit_code == 2


def test_presets_and_hub_ids() -> None:
    for name in PRESETS:
        assert resolve_model(name) == name and is_local_model(name)
    assert resolve_model("bert-base-uncased") == "bert-base-uncased"  # a Hub id, not a typo
    assert not is_local_model("roberta-base")


@pytest.mark.parametrize("typo", ["tiy", "bert-bse", "minilm-l5", "distilbert-bas"])
def test_mistyped_preset(typo: str) -> None:
    with pytest.raises(BadInput, match="unknown model preset"):
        resolve_model(typo)


def test_missing_model_folder() -> None:
    with pytest.raises(BadInput, match="model folder not found"):
        resolve_model("./no/such/model")
