"""--report-to mlflow: rank 0's step metrics and evaluations through MLflow's own client, as HF
Trainer's MLflowCallback writes them.

    # runs/<run>/mlruns
    cpudist run mrpc --data-dir glue/MRPC --model tiny --eval-every 50 --report-to mlflow
    # a tracking server
    cpudist run ... --report-to mlflow --mlflow-uri http://mlflow.internal:5000
    MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri runs/<run>/mlruns

One MLflow run per cpudist run in the experiment `cpudist`: named and tagged (`cpudist.run_id`) with
the run's id, its hyperparameters as params, `train/*` at every optimizer step and `eval/*` at every
evaluation (the names of the TensorBoard reporter). A resumed part continues the MLflow run its run
id tags (params stay the first part's: MLflow's params cannot change), so the steps it trains again
after its checkpoint appear twice in the history. The client is mlflow-skinny's (no server, no UI);
without --mlflow-uri it writes MLflow's file store.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

EXPERIMENT = "cpudist"
RUN_TAG = "cpudist.run_id"
# MLflow's limit of a param's value was 500 characters before 2.x raised it: safe everywhere
_PARAM_MAX = 500
_BATCH = 100  # params per log_batch call (MLflow's limit)


def _opt_in() -> None:
    """MLflow reads these only from the environment, so this rank 0 (our own process) sets them
    before the import: 3.x refuses its file store unless MLFLOW_ALLOW_FILE_STORE says yes (a run
    folder's store is what HF's callback writes by default, and Slurm's shared filesystems want
    files, not SQLite), and its usage telemetry would try the internet from nodes that mostly have
    none. A value the user set wins."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def params_of(config: dict[str, Any]) -> dict[str, str]:
    """The run's hyperparameters as MLflow params: every set field, as text, cut to a length any
    MLflow takes; a nested one's fields under its name (sync.strategy, sync.sync_every ...)."""
    flat = {f"{k}.{n}" if isinstance(v, dict) else k: x for k, v in config.items()
            for n, x in (v.items() if isinstance(v, dict) else [("", v)])}
    return {k: str(v)[:_PARAM_MAX] for k, v in sorted(flat.items()) if v is not None and v != ()
            and v != ""}


class MLflow:
    """One MLflow run through MlflowClient (no global active run: nothing else in the process is
    touched)."""

    def __init__(self, uri: str, config: dict[str, Any], resumed_at: int) -> None:
        _opt_in()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(EXPERIMENT)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(
            EXPERIMENT)
        cpudist_id = str(config.get("run_id") or "")
        earlier = (self.client.search_runs([experiment], f"tags.`{RUN_TAG}` = '{cpudist_id}'",
                                           max_results=1)
                   if resumed_at and cpudist_id else [])
        if earlier:
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(experiment, tags={RUN_TAG: cpudist_id}, run_name=cpudist_id
                                     or None)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in params_of(config).items()]
        for i in range(0, len(params), _BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + _BATCH])

    def _log(self, prefix: str, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(f"{prefix}/{k}", float(v), now, step)
                                                    for k, v in values.items()])

    def log_step(self, step: int, values: dict[str, float]) -> None:
        self._log("train", step, values)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        self._log("eval", step, metrics)

    def close(self) -> None:
        # Called from the rank's `finally` (train/main.py): an exception on its way out is how the
        # run ended
        failed = sys.exc_info()[0]
        status = ("FINISHED" if failed is None
                  else "KILLED" if issubclass(failed, KeyboardInterrupt) else "FAILED")
        self.client.set_terminated(self.run_id, status)
