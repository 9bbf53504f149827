"""The options of a Slurm submission, shared by every command that can run with `--launcher slurm`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from cpudist.launch.batch import BatchOptions

F = TypeVar("F", bound=Callable[..., Any])


def slurm_options(command: F) -> F:
    """Add --partition --time --account --exclusive --sbatch-arg to a command (see `from_opts`)."""
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


def requeue_options(command: F) -> F:
    """Add --requeue --requeue-signal (`cpudist run`: its ranks checkpoint and resume; a script's would not)."""
    options = [
        click.option("--requeue", is_flag=True, help="--launcher slurm: shortly before the time limit the ranks "
                     "checkpoint, the job is requeued, and its next start resumes from that checkpoint."),
        click.option("--requeue-signal", "requeue_signal_s", type=click.IntRange(min=60), default=120,
                     show_default=True, help="--launcher slurm --requeue: seconds before the time limit that Slurm "
                     "signals the job (--signal=B:USR1@SECONDS; Slurm sends it within a minute of that)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def from_opts(opts: dict[str, Any]) -> BatchOptions:
    """The BatchOptions in a command's options (what `slurm_options` and, if given, `requeue_options` added)."""
    return BatchOptions(partition=opts["partition"], time=opts["time_limit"], account=opts["account"],
                        exclusive=opts["exclusive"], sbatch_args=opts["sbatch_args"],
                        requeue=opts.get("requeue", False), signal_s=opts.get("requeue_signal_s", 120))
