"""What a run asks a scheduler for (launch/kind.Batch kinds), besides nodes and ranks per node, and
the flags that fill it: each scheduler kind lists its own (`Batch.flags`), and the CLI offers them
as they are."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True, frozen=True)
class BatchOptions:
    """What a run asks a scheduler for, besides nodes and ranks per node (Slurm's words)."""

    partition: str | None = None
    time: str | None = None  # Slurm's time format: minutes, MM:SS, HH:MM:SS, D-HH:MM
    account: str | None = None
    exclusive: bool = False
    sbatch_args: tuple[str, ...] = ()  # passed as they are, one `#SBATCH` line each
    # USR1 `signal_s` before the time limit: the ranks checkpoint, the job is requeued
    requeue: bool = False
    signal_s: int = 120  # Slurm sends it within about a minute of this (its timer's resolution)


@dataclass(frozen=True, kw_only=True)
class Flag:
    """One command-line flag of a scheduler kind: it fills the BatchOptions field `field`."""

    name: str  # as typed: --partition
    field: str
    help: str
    shape: str = "text"  # text | switch | repeated | seconds (an integer of at least 60)
    # only a run of the trainer takes it (its ranks checkpoint and resume)
    trainer_only: bool = False

    @property
    def dest(self) -> str:
        """The flag's parameter name, apart from every other option's."""
        return dest_of(self.field)


def dest_of(field: str) -> str:
    return f"batch_{field}"


def from_values(values: dict[str, Any]) -> BatchOptions:
    """The BatchOptions of a command's parameters (the `dest` of each flag it offers; others keep
    their default)."""
    given: dict[str, Any] = {f.name: values[dest_of(f.name)]
                             for f in dataclasses.fields(BatchOptions)
                             if dest_of(f.name) in values}
    return BatchOptions(**given)


SLURM_FLAGS = (
    Flag(name="--partition", field="partition", help="the Slurm partition."),
    Flag(name="--time", field="time",
         help="the job's time limit (minutes, MM:SS, HH:MM:SS, D-HH:MM; Slurm counts "
         "whole minutes)."),
    Flag(name="--account", field="account", help="the account charged."),
    Flag(name="--exclusive", field="exclusive", shape="switch",
         help="whole nodes (else Slurm grants a CPU per "
         "rank, and each rank runs one thread)."),
    Flag(name="--sbatch-arg", field="sbatch_args", shape="repeated",
         help="one more sbatch option, as written "
         "after #SBATCH, e.g. --sbatch-arg=--mem=0 (repeatable)."),
    Flag(name="--requeue", field="requeue", shape="switch", trainer_only=True,
         help="shortly before the time "
         "limit the ranks checkpoint, the job is requeued, and its next start resumes from that "
         "checkpoint."),
    Flag(name="--requeue-signal", field="signal_s", shape="seconds", trainer_only=True,
         help="with --requeue: "
         "seconds before the time limit that Slurm signals the job (--signal=B:USR1@SECONDS; "
         "Slurm sends it within a minute of that)."),
)
