"""The submission options of every scheduler kind (launch/kinds.batches()), as each kind declares
them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from cpudist.launch.batch import BatchOptions, Flag
from cpudist.launch.kinds import batches

F = TypeVar("F", bound=Callable[..., Any])


def _flags(trainer_only: bool) -> dict[Flag, str]:
    """Each flag offered once, with the first kind that declares it (--launcher NAME in its
    help)."""
    found: dict[Flag, str] = {}
    for kind in batches():
        for flag in kind.flags:
            if flag.trainer_only == trainer_only and all(f.name != flag.name for f in found):
                found[flag] = kind.name
    return found


def _option(flag: Flag, kind: str) -> Callable[[Any], Any]:
    text = f"--launcher {kind}: {flag.help}"
    if flag.shape == "switch":
        return click.option(flag.name, flag.dest, is_flag=True, help=text)
    if flag.shape == "repeated":
        return click.option(flag.name, flag.dest, multiple=True, help=text)
    if flag.shape == "seconds":
        default = getattr(BatchOptions(), flag.field)
        return click.option(flag.name, flag.dest, type=click.IntRange(min=60), default=default,
                            show_default=True, help=text)
    return click.option(flag.name, flag.dest, help=text)


def batch_options(trainer_only: bool = False) -> Callable[[F], F]:
    """Add the scheduler kinds' flags to a command: those of every run, or those only a trainer's
    run takes."""

    def add(command: F) -> F:
        for flag, kind in reversed(_flags(trainer_only).items()):
            command = _option(flag, kind)(command)
        return command

    return add


def batch_sections(trainer: bool) -> dict[str, tuple[str, ...]]:
    """--help's heading per scheduler kind and its flags' parameter names."""
    return {f"{kind.label} (--launcher {kind.name})": tuple(f.dest for f in kind.flags
                                                              if trainer or not f.trainer_only)
            for kind in batches()}
