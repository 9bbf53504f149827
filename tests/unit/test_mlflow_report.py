"""--report-to mlflow's writer against a real MLflow file store, read back with MLflow's own client:
one run per cpudist run (its id as tag and name), params, metrics at their steps, and a resumed part
continuing that run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cpudist.errors import BadInput
from cpudist.train.report_to import MLFLOW_DIR, Reporters, check_installed

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

CONFIG = {"task": "mrpc", "model": "tiny", "lr": 1e-3, "run_id": "20261126-171500-ab12",
          "report_to": ("mlflow",), "mlflow_uri": None, "resume": None, "text_columns": (),
          "sync": {"strategy": "local-sgd", "sync_every": 8}}  # TrainConfig.sync, as asdict


@pytest.fixture(autouse=True)
def _no_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset here, so the writer's own opt-in (rank 0 sets it) is what opens the file store; undone
    after."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)


def _client(run_dir: Path) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(run_dir / MLFLOW_DIR).as_uri())


def test_a_run_and_its_resumed_part_are_one_mlflow_run(tmp_path: Path) -> None:
    first = Reporters.open(("mlflow",), 0, tmp_path, CONFIG)
    first.log_step(1, {"loss": 0.7, "learning_rate": 1e-3})
    first.log_step(2, {"loss": 0.6, "learning_rate": 5e-4})
    first.log_eval(2, {"accuracy": 0.5})
    first.close()
    # the second part resumes at step 2 with a changed setting: same MLflow run, params as the first
    # part wrote
    again = Reporters.open(("mlflow",), 0, tmp_path, {**CONFIG, "resume": "auto", "lr": 2e-3},
                           resumed_at=2)
    again.log_step(3, {"loss": 0.5, "learning_rate": 2e-4})
    again.log_eval(3, {"accuracy": 0.75})
    again.close()
    # other ranks write nothing
    assert Reporters.open(("mlflow",), 1, tmp_path, CONFIG).reporters == []

    client = _client(tmp_path)
    experiment = client.get_experiment_by_name("cpudist")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert (run.data.tags["cpudist.run_id"] == CONFIG["run_id"]
            and run.info.run_name == CONFIG["run_id"])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (params["task"], params["lr"], params["report_to"]) == ("mrpc", "0.001", "('mlflow',)")
    # a nested config's fields, each a param of its own, as MLflow users compare them
    assert (params["sync.strategy"], params["sync.sync_every"]) == ("local-sgd", "8")
    # unset: left out
    assert "resume" not in params and "mlflow_uri" not in params and "text_columns" not in params

    def history(name: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))

    assert history("train/loss") == [(1, 0.7), (2, 0.6), (3, 0.5)]
    assert history("train/learning_rate") == [(1, 1e-3), (2, 5e-4), (3, 2e-4)]
    assert history("eval/accuracy") == [(2, 0.5), (3, 0.75)]


def test_another_run_in_the_store_is_another_mlflow_run(tmp_path: Path) -> None:
    """A fresh run (not resumed) never continues an earlier run's MLflow run, even with the same
    id."""
    for config in (CONFIG, {**CONFIG, "run_id": "20261126-171600-cd34"}, CONFIG):
        r = Reporters.open(("mlflow",), 0, tmp_path, config)
        r.log_step(1, {"loss": 1.0})
        r.close()
    client = _client(tmp_path)
    experiment = client.get_experiment_by_name("cpudist")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    ids = sorted(str(r.data.tags["cpudist.run_id"]) for r in runs)
    assert ids == sorted([str(CONFIG["run_id"])] * 2 + ["20261126-171600-cd34"])


def test_a_run_that_raised_is_failed_one_interrupted_killed(tmp_path: Path) -> None:
    """The rank closes its reporters in a `finally`: the exception on its way out says how the
    MLflow run ended."""
    for run_id, error in (("failed", RuntimeError("boom")), ("killed", KeyboardInterrupt())):
        r = Reporters.open(("mlflow",), 0, tmp_path, {**CONFIG, "run_id": run_id})
        with pytest.raises(type(error)):
            try:
                raise error
            finally:
                r.close()
    client = _client(tmp_path)
    experiment = client.get_experiment_by_name("cpudist")
    assert experiment is not None
    ended = {r.data.tags["cpudist.run_id"]: r.info.status
             for r in client.search_runs([experiment.experiment_id])}
    assert ended == {"failed": "FAILED", "killed": "KILLED"}


def test_missing_mlflow_and_a_uri_without_it_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # Python's own "not importable": find_spec says None
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(BadInput,
                       match=r"needs the mlflow-skinny package.*pip install 'cpudist\[mlflow\]'"):
        check_installed(("tensorboard", "mlflow"))
    with pytest.raises(BadInput,
                       match=r"--mlflow-uri .* --report-to does not name mlflow\. Add --report-to "
                             r"mlflow"):
        check_installed(("tensorboard",), "http://mlflow:5000")
