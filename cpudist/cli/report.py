"""`cpudist report`: speedup and efficiency of comparable runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cpudist import state
from cpudist.cli.options import output_options
from cpudist.errors import BadInput
from cpudist.results import anatomy as steps
from cpudist.results.ledger import load_sources
from cpudist.results.render import notes, render_csv, render_json, render_markdown
from cpudist.results.report import (
    COLUMNS,
    FLAG_NOTE,
    TRAFFIC_COLUMNS,
    ScalingRow,
    groups_of,
    scaling_rows,
)
from cpudist.results.schema import RunResult
from cpudist.results.select import RunFilter, find_run, parse_since, select
from cpudist.wire import events

FORMATS = ("table", "md", "csv", "json")


format_option = output_options(FORMATS, "table")


def plot_option(f: click.decorators.FC) -> click.decorators.FC:
    return click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
                        help="Also draw speedup and efficiency against what varied (ranks on one "
                             "node, else nodes), "
                        "one line per group with the ideal, to this file (.png, .svg, .pdf).")(f)


def _tasks(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(t.strip() for v in value for t in v.split(",") if t.strip())


@click.command()
@click.argument("sources", nargs=-1, type=click.Path(path_type=Path))
@click.option("--task", "tasks", multiple=True, callback=_tasks,
              help="Only runs of this task (repeat, or a,b).")
@click.option("--since",
              help="Only runs started at or after this UTC date or time (2026-11-24, "
                   "2026-11-24T10:00), "
              "or within this age (7d, 12h, 30m).")
@click.option("--last", type=click.IntRange(min=1),
              help="Only the N newest runs (after the other filters).")
@click.option("--run", "run_ids", multiple=True,
              help="Only this run: an id or a unique prefix of one (repeat).")
@click.option("--baseline",
              help="Speedups of its group against this run (an id or a unique prefix) "
              "[default: the fewest nodes, then ranks, of each group; the median of its repeats].")
@click.option("--anatomy", is_flag=True,
              help="Also say where a step went on rank 0: compute, the sync's CPU work, wire time "
              "not hidden, waiting for the slowest rank, evaluation (seconds per step).")
@format_option
@plot_option
def report(sources: tuple[Path, ...], tasks: tuple[str, ...], since: str | None, last: int | None,
           run_ids: tuple[str, ...], baseline: str | None, anatomy: bool, fmt: str,
           plot: Path | None) -> None:
    """Speedup and efficiency of each configuration against its group's baseline, from ledgers or
    run folders.

    SOURCES default to the ledger (~/.cpudist/results.jsonl). Runs that differ only in their nodes
    and ranks form a group; repeats of one configuration are one row (median, n, the range of their
    speedups). Speedup is the ratio of training throughput (samples/s) to the group's baseline,
    which every group names with the reason; a speedup beyond what the added ranks allow is flagged
    (!) with its likely cause. Runs that timed their gradient sync get a second table: the bytes
    expected between nodes per step and those the interfaces counted (! when they differ by more
    than 10%), the share of training spent waiting for communication, and the bus bandwidth.
    """
    loaded = load_sources(sources or (state.ledger_path(),))
    if not loaded:
        raise BadInput("no runs to report", "Run `cpudist run` first")
    chosen = find_run(loaded, baseline) if baseline is not None else None
    wanted = RunFilter(tasks, parse_since(since) if since else None, last, run_ids)
    results = select(loaded, wanted)
    if chosen is not None and not any(chosen == r for r in results):
        results.append(chosen)  # the baseline named is reported with the runs it is the baseline of
    show_report(results, fmt, plot, chosen, anatomy)


def show_report(results: Sequence[RunResult], fmt: str, plot: Path | None,
                baseline: RunResult | None = None, anatomy: bool = False) -> None:
    """Print the report of these runs in `fmt` to stdout (with each step's anatomy when asked),
    and draw it to `plot` when given."""
    rows = scaling_rows(results, baseline)
    parts = steps.anatomy_of(rows, results) if anatomy else None
    extra = (lambda r: steps.record(parts.get(r.run_id))) if parts is not None else _nothing
    if fmt == "md":
        click.echo(render_markdown(rows))
        if parts is not None:
            click.echo(_anatomy_markdown(rows, parts))
    elif fmt == "csv":
        click.echo(render_csv(rows, extra), nl=False)
    elif fmt == "json":
        click.echo(render_json(rows, extra))
    else:
        _print_tables(rows, parts)
    if fmt in ("md", "table") and (changes := membership(results)):
        click.echo("\n".join(["", "Elastic runs, the nodes that trained from each step:", "",
                               *changes]))
    if plot is not None:
        from cpudist.results.plot import write_plot  # matplotlib is slow to import: only when asked

        write_plot(rows, plot)
        click.echo(f"[cpudist] plot -> {plot}", err=True)


def membership(results: Sequence[RunResult]) -> list[str]:
    """One line per --elastic run: how many nodes trained from which step, and when (result.json's
    membership)."""
    def change(c: dict[str, Any]) -> str:
        who = events.who_text(c.get("left", ()), c.get("joined", ()))
        return f"{c['replicas']} from step {c['step']} ({c['at_s']:.0f} s{': ' * bool(who)}{who})"

    return [f"- {r.run_id}: " + "; ".join(change(c) for c in r.membership)
            for r in results if r.membership]


def _nothing(r: ScalingRow) -> dict[str, Any]:
    return {}


def _anatomy_markdown(rows: Sequence[ScalingRow], parts: dict[str, dict[str, float]]) -> str:
    out = []
    for group in groups_of(rows):
        body = [steps.cells(r, parts.get(r.run_id)) for r in rows if r.group == group]
        out += [f"### {group}: {steps.TITLE}", "", "| " + " | ".join(steps.COLUMNS) + " |",
                "|" + "---|" * len(steps.COLUMNS), *("| " + " | ".join(c) + " |" for c in body),
                "", steps.NOTE, ""]
    return "\n".join(out)


def _print_tables(rows: Sequence[ScalingRow],
                  parts: dict[str, dict[str, float]] | None = None) -> None:
    console = Console()
    if not console.is_terminal:  # piped or captured: never squeeze the table to 80 columns
        console = Console(width=220)
    for group in groups_of(rows):
        mine = [r for r in rows if r.group == group]
        table = Table(*COLUMNS, title=group, title_justify="left")
        for r in mine:
            table.add_row(*r.cells(), style="bold red" if r.flagged else None)
        console.print(table)
        for line in notes(mine):
            console.print(line, markup=False, highlight=False)
        if any(r.has_traffic for r in mine):
            traffic = Table(*TRAFFIC_COLUMNS, title="gradient sync and traffic",
                            title_justify="left")
            for r in mine:
                traffic.add_row(*r.traffic_cells(), style="bold red" if r.traffic_flagged else None)
            console.print(traffic)
            if any(r.traffic_flagged for r in mine):
                console.print(FLAG_NOTE, markup=False, highlight=False)
        if parts is not None:
            table = Table(*steps.COLUMNS, title=steps.TITLE, title_justify="left")
            for r in mine:
                table.add_row(*steps.cells(r, parts.get(r.run_id)))
            console.print(table)
            console.print(steps.NOTE, markup=False, highlight=False)
