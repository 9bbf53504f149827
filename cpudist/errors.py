"""One error family: each message says what failed and what to do next."""

from __future__ import annotations

import click

from cpudist.wire import exits


class CpudistError(click.ClickException):
    """Base of every error cpudist reports to a user (exit code 1: the job failed)."""

    exit_code = exits.FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        text = message if hint is None else f"{message}. {hint}"
        super().__init__(text)
        # without the hint: for callers that act on the error instead of printing it
        self.what = message


class BadInput(CpudistError):
    """The user's input (options, hostfile, data, model) cannot work: exit code 2."""

    exit_code = exits.BAD_INPUT


class JobFailed(CpudistError):
    """A launched job ended badly: exit code 1."""

    exit_code = exits.FAILED


class Interrupted(JobFailed):
    """The user stopped the job (Ctrl-C, SIGTERM, a hang-up) and every rank was stopped: exit code
    130, as a shell reports a command ended by SIGINT."""

    exit_code = exits.INTERRUPTED


class Preempted(JobFailed):
    """The ranks stopped on purpose (SIGTERM, spot notice) after saving a checkpoint: exit code
    75."""

    exit_code = exits.PREEMPTED
