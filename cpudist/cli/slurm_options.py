"""The options of a Slurm submission, shared by every command that can run with `--launcher slurm`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from cpudist.launch.slurm import SlurmOptions

F = TypeVar("F", bound=Callable[..., Any])


def slurm_options(command: F) -> F:
    """Add --partition --time --account --exclusive --sbatch-arg to a command (see `to_slurm_options`)."""
    options = [
        click.option("--partition", help="--launcher slurm: the Slurm partition."),
        click.option("--time", "time_limit", help="--launcher slurm: the job's time limit (minutes, MM:SS, "
                     "HH:MM:SS, D-HH:MM; Slurm counts whole minutes)."),
        click.option("--account", help="--launcher slurm: the account charged."),
        click.option("--exclusive", is_flag=True, help="--launcher slurm: whole nodes (else Slurm grants a CPU "
                     "per rank, and each rank runs one thread)."),
        click.option("--sbatch-arg", "sbatch_args", multiple=True, help="--launcher slurm: one more sbatch "
                     "option, as written after #SBATCH, e.g. --sbatch-arg=--mem=0 (repeatable)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def to_slurm_options(partition: str | None, time_limit: str | None, account: str | None, exclusive: bool,
                     sbatch_args: tuple[str, ...]) -> SlurmOptions:
    """The SlurmOptions of the values `slurm_options` added to a command."""
    return SlurmOptions(partition, time_limit, account, exclusive, sbatch_args)
