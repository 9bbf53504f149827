"""`cpudist logs RUN [-f]`: a run's output so far, or followed until the run ends, from any
shell."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cpudist import state
from cpudist.errors import BadInput
from cpudist.results.ledger import read_ledger
from cpudist.wire import exits, names

if TYPE_CHECKING:
    from cpudist.run.life.identity import RunInfo
    from cpudist.run.life.listing import RunRow


def run_arg(text: str) -> RunRow:
    """RUN (an id, a unique prefix of one, or a run folder) as `cpudist runs` lists it (./runs and
    the ledger)."""
    from cpudist.run.life.control import find_run

    ledger_path = state.ledger_path()
    return find_run(text, (Path("runs"),), read_ledger(ledger_path) if ledger_path.is_file()
                    else [])


def _emit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _attach(ctx: click.Context, info: RunInfo) -> None:
    """`logs -f` of a detached run: its head's log until it ends, then its files home and the run
    recorded."""
    from cpudist.errors import CpudistError
    from cpudist.run.life.attach import attach
    from cpudist.run.life.identity import read_run
    from cpudist.run.life.runlog import event_text
    from cpudist.run.request import Callbacks

    def on_event(event: dict[str, Any]) -> None:
        text = event_text(event)
        if text is not None:
            _emit(f"[cpudist] {text}\n")

    try:
        attach(info,
               Callbacks(on_event, lambda line: _emit(line + "\n"),
                         lambda line: _emit(f"[cpudist] {line}\n")))
    except KeyboardInterrupt:
        ctx.exit(exits.INTERRUPTED)  # following stopped, the run goes on
    except CpudistError as e:
        now = read_run(Path(info.run_dir))
        if now is None or now.state == "running":
            raise  # not the run's end: following it failed
        click.echo(f"[cpudist] run {info.id} is {now.state}: {e.what}", err=True)
        return
    click.echo(f"[cpudist] run {info.id} is finished: {Path(info.run_dir) / names.RESULT}",
               err=True)


@click.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True,
              help="Go on printing until the run ends (Ctrl-C stops following).")
@click.option("--head", "from_head", is_flag=True,
              help="Read the ranks' output on the run's head over SSH (runs with --cluster or "
                   "--head).")
@click.option("--user",
              help="With --head for a run started with --head HOST: the login there, as run took "
                   "it.")
@click.option("--identity",
              help="With --head for a run started with --head HOST: the private key, as run took "
                   "it.")
@click.pass_context
def logs(ctx: click.Context, run: str, follow: bool, from_head: bool, user: str | None,
         identity: str | None) -> None:
    """Print a run's output: rank lines and cpudist's progress (its folder's cpudist.log, or
    ranks.log).

    RUN is a run id (or a unique prefix of one, as `cpudist runs` lists them) or a run folder. A run
    on a cluster from this machine logs here what it streamed; --head reads the head's ranks.log
    instead.

    Example: cpudist logs -f 20261126-101502
    """
    from cpudist.run.life.identity import read_run
    from cpudist.run.life.runlog import show

    row = run_arg(run)
    run_dir = Path(row.run_dir)
    if not row.run_dir or not run_dir.is_dir():
        raise BadInput(f"run {row.id}'s folder {row.run_dir or '(none recorded)'} is not on this "
                       "machine",
                       "Give the run's folder where it is")
    attached = read_run(run_dir) if follow and not from_head else None
    if attached is not None and attached.detached and attached.state == "running":
        _attach(ctx, attached)
        return
    info = read_run(run_dir) if from_head else None
    if from_head and info is None:
        raise BadInput(f"run {row.id} has no run.json in {run_dir}",
                       "`cpudist logs` without --head shows its log")
    try:
        if info is not None:
            from cpudist.run.life.headlog import show_head  # paramiko: only on this path

            ended = show_head(info, user, identity, _emit, follow)
        else:
            ended = show(run_dir, _emit, follow)
    except KeyboardInterrupt:
        ctx.exit(exits.INTERRUPTED)  # following stopped, the run goes on
    if follow and ended:
        click.echo(f"[cpudist] run {row.id} is {ended}", err=True)
