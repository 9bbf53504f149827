"""--report-to: rank 0 writes step metrics and evaluations through an experiment tracker's own
writer.

    cpudist run mrpc --np 2 --data-dir glue/MRPC --model tiny --eval-every 50 \\
        --report-to tensorboard,mlflow
    tensorboard --logdir runs/
    MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri runs/<run>/mlruns

As HF Trainer's `report_to`: `train/loss`, `train/learning_rate`, `train/grad_norm`,
`train/samples_per_s` and `train/comm_share` (the share of rank 0's step spent waiting for the
gradient exchange) at every optimizer step, `eval/<metric>` at every evaluation; event files in
`<run folder>/tensorboard/`, MLflow runs in `--mlflow-uri` or a file store in `<run folder>/mlruns/`
(train/mlflow_report.py). No torch here at import: the CLI checks the option with this module.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Protocol

from cpudist.errors import BadInput

REPORTERS = ("tensorboard", "mlflow")
TENSORBOARD_DIR = "tensorboard"  # in the run folder
MLFLOW_DIR = "mlruns"  # in the run folder: --report-to mlflow's store without --mlflow-uri
RUN_FOLDERS = (TENSORBOARD_DIR, MLFLOW_DIR)  # what a remote run brings home with it
_INSTALL = {"tensorboard": "pip install 'cpudist[tensorboard]'",
            "mlflow": "pip install 'cpudist[mlflow]'"}
_PACKAGE = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny"}


def parse_report_to(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """'tensorboard' / 'none' / a comma-separated list -> the reporters' names; unknown names are
    BadInput."""
    words = value if isinstance(value, tuple) else tuple((value or "none").split(","))
    names = tuple(dict.fromkeys(w.strip().lower() for w in words if w.strip()
                                and w.strip().lower() != "none"))
    for name in names:
        if name not in REPORTERS:
            raise BadInput(f"--report-to {name}: unknown",
                           f"Use one of: {', '.join(REPORTERS)}, or none")
    return names


def check_installed(names: tuple[str, ...], mlflow_uri: str | None = None) -> None:
    """Fail before training, in one line, when a reporter's library is missing here (or --mlflow-uri
    goes nowhere)."""
    if mlflow_uri and "mlflow" not in names:
        raise BadInput("--mlflow-uri is where --report-to mlflow writes, and --report-to does not "
                       "name mlflow",
                       "Add --report-to mlflow, or drop --mlflow-uri")
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise BadInput(f"--report-to {name} needs the {_PACKAGE[name]} package, which is not "
                           "installed",
                           f"Install it ({_INSTALL[name]}, on every node that runs rank 0), or "
                           "drop --report-to")


class Reporter(Protocol):
    """One tracker: step metrics, evaluations, and a close that flushes everything to disk."""

    def log_step(self, step: int, values: dict[str, float]) -> None: ...

    def log_eval(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """Event files through torch.utils.tensorboard's SummaryWriter (tensorboard's own format and
    writer)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resumed_at: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run rewrites the steps after its checkpoint: purge_step hides the abandoned
        # ones' events.
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR),
                                    purge_step=resumed_at + 1 if resumed_at else None)
        if not resumed_at:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str)
                                 + "\n```")

    def log_step(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"train/{name}", value, step)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(f"eval/{name}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Reporters:
    """Every reporter --report-to names (none on ranks other than 0); each call goes to all of
    them."""

    def __init__(self, reporters: list[Reporter]) -> None:
        self.reporters = reporters

    @classmethod
    def open(cls, names: tuple[str, ...], rank: int, run_dir: Path, config: dict[str, Any],
             resumed_at: int = 0) -> Reporters:
        if rank != 0:
            return cls([])
        check_installed(names)
        reporters: list[Reporter] = []
        for name in names:
            if name == "tensorboard":
                reporters.append(TensorBoard(run_dir, config, resumed_at))
            elif name == "mlflow":
                from cpudist.train.mlflow_report import MLflow

                reporters.append(MLflow(config.get("mlflow_uri")
                                        or (run_dir / MLFLOW_DIR).resolve().as_uri(),
                                        config, resumed_at))
        return cls(reporters)

    def log_step(self, step: int, values: dict[str, float]) -> None:
        for r in self.reporters:
            r.log_step(step, values)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        for r in self.reporters:
            r.log_eval(step, metrics)

    def close(self) -> None:
        for r in self.reporters:
            r.close()
