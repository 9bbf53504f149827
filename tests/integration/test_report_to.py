"""--report-to tensorboard,mlflow on 2 real ranks: the event files and the MLflow store hold what
steps.jsonl and result.json say, read back with tensorboard's own reader and MLflow's own client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow


def test_tensorboard_and_mlflow_hold_every_step_and_evaluation(
        tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 alone writes one event file: train/* at steps 1..6 (--log-every 4 flushes twice: steps
    1-4 and 5-6), eval/* at the evaluations of --eval-every 2 and the final one, equal to
    steps.jsonl and result.json."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "RUN"
    r = cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
                "--np", "2", "--ppn", "2", "--max-steps", "6", "--eval-every", "2", "--log-every",
                "4", "--lr", "1e-3", "--max-train-samples", "256", "--max-eval-samples", "64",
                "--save-model", "none", "--report-to", "tensorboard,mlflow", "--output-dir", run,
                "--ledger", tmp_path / "ledger.jsonl")
    assert r.returncode == 0, r.stderr
    files = sorted((run / "tensorboard").iterdir())
    # one writer: rank 0
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents."), files
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()

    def scalars(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in events.Scalars(tag)]

    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    for tag, key in (("train/loss", "loss"), ("train/learning_rate", "lr"),
                     ("train/grad_norm", "grad_norm")):
        got = scalars(tag)
        assert [step for step, _ in got] == [1, 2, 3, 4, 5, 6], (tag, got)
        # float32 in the file
        assert [v for _, v in got] == pytest.approx([s[key] for s in steps], rel=1e-6), tag
    assert [v for _, v in scalars("train/samples_per_s")] == pytest.approx(
        [s["samples"] / s["step_time_s"] for s in steps], rel=1e-6)
    shares = [v for _, v in scalars("train/comm_share")]
    assert len(shares) == 6 and all(0.0 <= v <= 1.0 for v in shares) \
        and any(v > 0 for v in shares), shares

    evaluations = json.loads((run / "result.json").read_text())["evaluations"]
    assert [e["step"] for e in evaluations] == [2, 4, 6]
    for name in ("accuracy", "f1"):
        assert scalars(f"eval/{name}") == [(e["step"], pytest.approx(e["metrics"][name], rel=1e-6))
                                           for e in evaluations], name
    # the run's settings, as HF's callback writes its args
    assert "config" in " ".join(events.Tags()["tensors"])

    # One MLflow run in <run>/mlruns, tagged and named with the run's id, its hyperparameters as
    # params, the same values at the same steps (MLflow keeps float64: exact), read with MLflow's
    # own client
    from mlflow.tracking import MlflowClient

    # MLflow 3 reads its file store only when told to
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("cpudist")
    assert experiment is not None
    [found] = client.search_runs([experiment.experiment_id])
    run_id = json.loads((run / "result.json").read_text())["run_id"]
    assert found.data.tags["cpudist.run_id"] == run_id and found.info.run_name == run_id
    assert found.info.status == "FINISHED"
    params = found.data.params
    assert (params["task"], params["model"], params["lr"], params["max_steps"]) == ("mrpc", "tiny",
                                                                                    "0.001", "6")

    def history(name: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, name))

    assert history("train/loss") == [(s["step"], pytest.approx(s["loss"])) for s in steps]
    assert [step for step, _ in history("train/comm_share")] == [1, 2, 3, 4, 5, 6]
    for name in ("accuracy", "f1"):
        assert history(f"eval/{name}") == [(e["step"], pytest.approx(e["metrics"][name]))
                                           for e in evaluations]
