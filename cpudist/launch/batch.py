"""What a run asks a scheduler for (launch/kind.Batch kinds), besides nodes and ranks per node."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchOptions:
    """What a run asks a scheduler for, besides nodes and ranks per node (Slurm's words)."""

    partition: str | None = None
    time: str | None = None  # Slurm's time format: minutes, MM:SS, HH:MM:SS, D-HH:MM
    account: str | None = None
    exclusive: bool = False
    sbatch_args: tuple[str, ...] = ()  # passed as they are, one `#SBATCH` line each
    requeue: bool = False  # USR1 `signal_s` before the time limit: the ranks checkpoint, the job is requeued
    signal_s: int = 120  # Slurm sends it within about a minute of this (its timer's resolution)
