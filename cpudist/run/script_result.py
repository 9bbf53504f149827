"""The record of a user's script run (`cpudist launch`): what the launching side measured, and what
the script handed back in its metric file, as the RunResult that result.json, the ledger and
`cpudist report` read.

    {"train_samples": 4096, "train_loss": 0.41, "eval_accuracy": 0.83}     a --metric-file

Keys naming a RunResult field (or HF Trainer's name for one: its `all_results.json` works as it is)
fill that field; every other number is a metric. The report's speedup is the ratio of
`train_samples_per_s`, so a script that scales should hand back its samples (or its samples/s); its
train time is then the script's own if it says (`train_runtime`), else the wall time of its ranks.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpudist import __version__
from cpudist.errors import BadInput
from cpudist.results.schema import RunResult

# the task of every script run: `report` groups them by their command (the model field)
TASK = "script"
# HF Trainer's names (trainer.save_metrics: all_results.json, train_results.json) for RunResult's
# fields
ALIASES = {"train_runtime": "train_time_s", "train_samples_per_second": "train_samples_per_s",
           "train_loss": "final_loss", "epoch": "epochs", "loss": "final_loss",
           "samples": "train_samples",
           "samples_per_s": "train_samples_per_s", "global_step": "steps"}
# The fields a metric file may fill, and their types
FIELDS: dict[str, type] = {"train_time_s": float, "train_samples": int,
                           "train_samples_per_s": float, "steady_samples_per_s": float,
                           "train_tokens_per_s": float, "steps": int, "final_loss": float,
                           "epochs": float, "max_steps": int, "per_rank_batch_size": int,
                           "global_batch_size": int, "grad_accum": int, "max_seq_len": int,
                           "eval_time_s": float, "precision": str, "backend": str}


@dataclass(kw_only=True, frozen=True)
class Ranks:
    """What the launching side knows of a finished script run."""

    command: tuple[str, ...]  # the script's command, as given
    world_size: int
    ppn: int
    rank_hosts: tuple[str, ...]  # every rank's host, in rank order (their event lines)
    rank_threads: tuple[int, ...]
    wall_time_s: float
    started_at: str
    run_id: str
    run_dir: str


def read_metrics(path: Path) -> dict[str, Any]:
    """The metric file as JSON: one object of numbers (and strings for precision/backend)."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise BadInput(f"--metric-file {path} cannot be read ({e.strerror})",
                       "Have rank 0 of the script write it (the run folder is $CPUDIST_RUN_DIR), "
                       "or drop --metric-file") from None
    except ValueError as e:
        raise BadInput(f"--metric-file {path} is not JSON ({e})",
                       'Write one object: {"train_samples": 4096}') from None
    if not isinstance(data, dict):
        raise BadInput(f"--metric-file {path} holds a {type(data).__name__}, not an object",
                       'Write one object: {"train_samples": 4096, "eval_accuracy": 0.83}')
    return data


def split_metrics(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """(RunResult fields, metrics) of a metric file; entries that are neither numbers nor known
    fields are left."""
    fields: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    for key, value in data.items():
        name = ALIASES.get(key, key)
        kind = FIELDS.get(name)
        if kind is str and isinstance(value, str):
            fields[name] = value
        elif isinstance(value, bool) or not isinstance(value, int | float):
            continue
        elif kind is not None and kind is not str:
            fields[name] = kind(value)
        else:
            metrics[key] = float(value)
    return fields, metrics


def script_label(command: tuple[str, ...]) -> str:
    """A short name of the script for its run folder: `train` of `python train.py ...`, else the
    program's."""
    for word in command:
        if word.endswith(".py"):
            return Path(word).stem
    if len(command) >= 3 and command[1] == "-m":
        return command[2].rsplit(".", 1)[-1]
    return Path(command[0]).name


def build(ranks: Ranks, given: dict[str, Any], cpu: dict[str, Any],
          updates: dict[str, Any]) -> RunResult:
    """The RunResult of a script run: measured by the launching side, then what the metric file
    gave."""
    fields, metrics = split_metrics(given)
    train_time = float(fields.pop("train_time_s", ranks.wall_time_s))
    samples = int(fields.pop("train_samples", 0))
    per_s = float(fields.pop("train_samples_per_s", samples / train_time if samples and train_time
                             else 0.0))
    nodes = tuple(dict.fromkeys(ranks.rank_hosts))
    result = RunResult(
        task=TASK, model=shlex.join(ranks.command), world_size=ranks.world_size, nodes=nodes,
        ppn=ranks.ppn,
        precision=str(fields.pop("precision", "")), backend=str(fields.pop("backend", "")),
        sync=TASK,
        per_rank_batch_size=int(fields.pop("per_rank_batch_size", 0)),
        grad_accum=int(fields.pop("grad_accum", 1)),
        global_batch_size=int(fields.pop("global_batch_size", 0)),
        max_seq_len=int(fields.pop("max_seq_len", 0)),
        steps=int(fields.pop("steps", 0)), train_samples=samples, train_time_s=train_time,
        eval_time_s=float(fields.pop("eval_time_s", 0.0)), wall_time_s=ranks.wall_time_s,
        train_samples_per_s=per_s,
        steady_samples_per_s=float(fields.pop("steady_samples_per_s", per_s)),
        train_tokens_per_s=float(fields.pop("train_tokens_per_s", 0.0)), metrics=metrics,
        comm_bytes_per_step=0,
        versions={"cpudist": __version__, "python": sys.version.split()[0]}, cpu=cpu,
        run_id=ranks.run_id,
        started_at=ranks.started_at, rank_hosts=ranks.rank_hosts,
        epochs=float(fields.pop("epochs", 0.0)), max_steps=fields.pop("max_steps", None),
        threads_per_rank=ranks.rank_threads[0] if ranks.rank_threads else 0,
        rank_threads=ranks.rank_threads,
        final_loss=fields.pop("final_loss", None), run_dir=ranks.run_dir, save_model="none")
    return result.with_updates(**updates)
