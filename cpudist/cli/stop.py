"""`cpudist stop RUN`: interrupt a run from another shell; it checkpoints first when it
checkpoints."""

from __future__ import annotations

import click

from cpudist.cli.logs import run_arg


@click.command()
@click.argument("run")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=120, show_default=True,
              help="Seconds to wait for the run to record that it stopped.")
def stop(run: str, wait_s: float) -> None:
    """Stop a running run: its `cpudist run` gets SIGINT, as from Ctrl-C in its terminal.

    RUN is a run id (or a unique prefix of one) or a run folder. The ranks save a checkpoint first
    when the run checkpoints (--checkpoint-every); the resume command is printed. Only a run started
    on this machine.

    Example: cpudist stop 20261126-101502
    """
    from cpudist.run.life.control import stop as stop_run

    stopped = stop_run(run_arg(run), wait_s)
    info, checkpoint = stopped.info, stopped.checkpoint
    said = info.message or (checkpoint.said() if checkpoint is not None else "")
    click.echo(f"run {info.id} stopped, run.json says {info.state}" + (f": {said}" if said else ""))
    if resume := stopped.resume_command():
        click.echo(f"resume: {resume}")
    # `cpudist launch`: the script's own checkpoints, if any, are its business
    elif info.task == "script":
        click.echo("[cpudist] run the command again to start over", err=True)
    else:
        click.echo("[cpudist] it left no checkpoint: run it again to start over "
                   "(--checkpoint-every N saves one)",
                   err=True)
