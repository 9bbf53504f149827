"""`--overwrite-output-dir` of `cpudist run`, `sweep` and `launch`: HF Trainer's word, and its
spelling (`--overwrite_output_dir`) as a second name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def overwrite_option(command: F) -> F:
    """Add --overwrite-output-dir (and --overwrite_output_dir) to a command, into the parameter
    `overwrite_output_dir` (run/claim.py)."""
    return click.option(
        "--overwrite-output-dir", "--overwrite_output_dir", "overwrite_output_dir", is_flag=True,
        help="Write this run into a --output-dir that holds an earlier run: that run's files "
        "make way; its checkpoints and every file no run made stay, and a file at a name this "
        "run writes that no run made is refused. Without it a --output-dir that is not empty is "
        "refused, unless it is the folder of the run that --resume goes on with.",
    )(command)
