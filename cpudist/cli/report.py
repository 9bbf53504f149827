"""`cpudist report`: speedup and efficiency of comparable runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from cpudist import state
from cpudist.cli.options import output_options
from cpudist.errors import BadInput
from cpudist.results.ledger import load_sources
from cpudist.results.report import (
    COLUMNS,
    FLAG_NOTE,
    TRAFFIC_COLUMNS,
    ScalingRow,
    groups_of,
    render_csv,
    render_json,
    render_markdown,
    scaling_rows,
)
from cpudist.results.schema import RunResult

FORMATS = ("table", "md", "csv", "json")


format_option = output_options(FORMATS, "table")


def plot_option(f: click.decorators.FC) -> click.decorators.FC:
    return click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
                        help="Also draw speedup and efficiency against nodes, one line per group, to this "
                        "file (.png, .svg, .pdf).")(f)


@click.command()
@click.argument("sources", nargs=-1, type=click.Path(path_type=Path))
@format_option
@plot_option
def report(sources: tuple[Path, ...], fmt: str, plot: Path | None) -> None:
    """Speedup and efficiency vs the smallest run, from ledgers or run folders.

    SOURCES default to the ledger (~/.cpudist/results.jsonl). Speedup is the ratio of training
    throughput (samples/s) to the smallest run of the same group. Runs that timed their gradient
    sync get a second table: the bytes expected between nodes per step and those the interfaces
    counted (! when they differ by more than 10%), the share of training spent waiting for
    communication, and the bus bandwidth.
    """
    results = load_sources(sources or (state.ledger_path(),))
    if not results:
        raise BadInput("no runs to report", "Run `cpudist run` first")
    show_report(results, fmt, plot)


def show_report(results: Sequence[RunResult], fmt: str, plot: Path | None) -> None:
    """Print the report of these runs in `fmt` to stdout, and draw it to `plot` when given."""
    rows = scaling_rows(results)
    if fmt == "md":
        click.echo(render_markdown(rows))
    elif fmt == "csv":
        click.echo(render_csv(rows), nl=False)
    elif fmt == "json":
        click.echo(render_json(rows))
    else:
        _print_tables(rows)
    if plot is not None:
        from cpudist.results.plot import write_plot  # matplotlib is slow to import: only when asked

        write_plot(rows, plot)
        click.echo(f"[cpudist] plot -> {plot}", err=True)


def _print_tables(rows: Sequence[ScalingRow]) -> None:
    console = Console()
    if not console.is_terminal:  # piped or captured: never squeeze the table to 80 columns
        console = Console(width=200)
    for group in groups_of(rows):
        mine = [r for r in rows if r.group == group]
        table = Table(*COLUMNS, title=group, title_justify="left")
        for r in mine:
            table.add_row(*r.cells())
        console.print(table)
        if any(r.has_traffic for r in mine):
            traffic = Table(*TRAFFIC_COLUMNS, title="gradient sync and traffic", title_justify="left")
            for r in mine:
                traffic.add_row(*r.traffic_cells(), style="bold red" if r.traffic_flagged else None)
            console.print(traffic)
            if any(r.traffic_flagged for r in mine):
                console.print(FLAG_NOTE, markup=False, highlight=False)
