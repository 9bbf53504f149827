"""`cpudist report`: speedup and efficiency of comparable runs."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from cpudist.errors import BadInput
from cpudist.results.ledger import default_ledger, load_sources
from cpudist.results.report import COLUMNS, render_csv, render_json, render_markdown, scaling_rows


@click.command()
@click.argument("sources", nargs=-1, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv", "json"]), default="table",
              show_default=True)
def report(sources: tuple[Path, ...], fmt: str) -> None:
    """Speedup and efficiency vs the smallest run, from ledgers or run folders.

    SOURCES default to the ledger (~/.cpudist/results.jsonl). Speedup is the ratio of training
    throughput (samples/s) to the smallest run of the same group.
    """
    results = load_sources(sources or (default_ledger(),))
    if not results:
        raise BadInput("no runs to report", "Run `cpudist run` first")
    rows = scaling_rows(results)
    if fmt == "md":
        click.echo(render_markdown(rows))
    elif fmt == "csv":
        click.echo(render_csv(rows), nl=False)
    elif fmt == "json":
        click.echo(render_json(rows))
    else:
        console = Console()
        if not console.is_terminal:  # piped or captured: never squeeze the table to 80 columns
            console = Console(width=200)
        for group in dict.fromkeys(r.group for r in rows):
            table = Table(*COLUMNS, title=group, title_justify="left")
            for r in rows:
                if r.group == group:
                    table.add_row(*r.cells())
            console.print(table)
