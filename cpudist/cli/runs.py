"""`cpudist runs`: every run this machine knows of, in whatever state, from the run folders and the
ledger."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from cpudist import state
from cpudist.cli.options import output_options
from cpudist.results.ledger import read_ledger
from cpudist.run.life.listing import RunRow, duration_text, list_runs, metric_text

COLUMNS = ("id", "task", "model", "where", "state", "start", "duration", "metric")


def cells(row: RunRow) -> tuple[str, ...]:
    return (row.id or "-", row.task, row.model, row.where, row.state, row.started_at or "-",
            duration_text(row.duration_s), metric_text(row.metrics))


@click.command()
@click.argument("folders", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path),
              help="The ledger of finished runs (default: ~/.cpudist/results.jsonl).")
@output_options()
def runs(folders: tuple[Path, ...], ledger: Path | None, fmt: str) -> None:
    """List runs: id, task, model, where, state, start, duration and metric.

    FOLDERS (default: ./runs) hold run folders; each one's run.json says its state (running,
    finished, failed, interrupted, preempted). Finished runs of the ledger without a run folder here
    are listed too.

    Example: cpudist runs --json
    """
    ledger_path = ledger or state.ledger_path()
    results = read_ledger(ledger_path) if ledger_path.is_file() else []
    rows = list_runs(folders or (Path("runs"),), results)
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo("no runs yet: `cpudist run` starts one", err=True)
        return
    table = Table(*COLUMNS, box=None, pad_edge=False)
    for row in rows:
        table.add_row(*cells(row))
    Console(width=200).print(table)
