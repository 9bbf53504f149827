"""`cpudist predict MODEL_OR_RUN`: options -> a request -> plan -> (dry run | execute) -> the
summary line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from cpudist.config import PRECISIONS
from cpudist.interrupts import signals_interrupt
from cpudist.predict.inputs import SPLITS
from cpudist.predict.job import Outcome, Plan, PredictRequest, describe, execute, plan
from cpudist.predict.outputs import FORMATS


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A bar on a terminal's stderr; elsewhere one line at the start (rows and processes are in the
    summary)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:
        click.echo(f"[cpudist] predicting {total} rows", err=True)
        yield lambda n: None
        return
    with Progress(TextColumn("predict"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as bar:
        task = bar.add_task("predict", total=total)
        yield lambda n: bar.advance(task, n)


def summary(p: Plan, done: Outcome) -> str:
    scored = " ".join(f"{k}={v:.4f}" for k, v in done.metrics.items())
    rate = done.rows / done.seconds if done.seconds else 0.0
    return (f"predicted {done.rows} rows in {done.seconds:.1f}s ({rate:.1f} rows/s, "
            f"{p.settings.precision}, {p.np} process(es) x {p.settings.threads} thread(s))"
            + (f", {scored}" if scored else "")
            + f" -> {done.output or 'stdout'}")


@click.command()
@click.argument("model_or_run", type=click.Path(path_type=Path))
@click.option("--file", "file", type=click.Path(path_type=Path),
              help="Rows to predict: csv, tsv, `;`-separated txt, json or jsonl (as `cpudist run` "
                   "reads them).")
@click.option("--text-columns",
              help="The file's 1 or 2 text columns, comma-separated [default: the run's, else "
                   "text].")
@click.option("--label-column",
              help="--file's label column: score the predictions against it, as the run scored "
              "its dev rows (class names or ids; numbers for regression).")
@click.option("--split", type=click.Choice(SPLITS),
              help="A GLUE split instead of --file: test writes the "
              "submission file (index, prediction), dev is scored against its labels.")
@click.option("--task",
              help="The rows' task: the GLUE task of --split, or of --file's rows; a model of "
                   "another "
              "task is refused [default: the run's].")
@click.option("--data-dir", type=click.Path(path_type=Path),
              help="GLUE's task folder for --split [default: the run's].")
@click.option("--output", "-o",
              help="Where to write: a path, or - for stdout [default: stdout for --file; "
              "predict_results_<task>.txt in the run folder for --split].")
@click.option("--format", "fmt", type=click.Choice(FORMATS),
              help="jsonl, csv, json (an array) or glue "
              "(index<TAB>prediction) [default: from --output's suffix; glue for --split, else "
              "jsonl].")
@click.option("--json", "fmt", flag_value="json", help="Same as --format json.")
@click.option("--precision", type=click.Choice(PRECISIONS),
              help="fp32, bf16 autocast (the run's own numbers, if it ran in bf16), or auto (bf16 "
                   "where "
              "native) [default: fp32].")
@click.option("--max-seq-len", type=click.IntRange(min=2),
              help="Tokens per row, truncated [default: the run's, else 128].")
@click.option("--batch-size", type=click.IntRange(min=1),
              help="Rows per batch [default: the run's eval batch, else 64].")
@click.option("--max-rows", type=click.IntRange(min=1),
              help="Only the first N rows [default: all; for --split dev of a run, the rows it "
                   "scored].")
@click.option("--np", "np_", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes on this machine, each with its share of the rows and of the cores.")
@click.option("--dry-run", is_flag=True,
              help="Say what would be read and written, and how; load no model.")
def predict(model_or_run: Path, file: Path | None, text_columns: str | None,
            label_column: str | None,
            split: str | None, task: str | None,
            data_dir: Path | None, output: str | None, fmt: str | None, precision: str | None,
            max_seq_len: int | None, batch_size: int | None, max_rows: int | None, np_: int,
            dry_run: bool) -> None:
    """Predict with a trained model (a save_pretrained folder, or a run folder with model/).

    Examples: cpudist predict runs/RUN --file reviews.csv --text-columns text -o predictions.jsonl;
    cpudist predict runs/RUN --split test --data-dir glue/MRPC (GLUE's submission file)
    """
    from cpudist.train.tasks import normalize_task

    columns = tuple(c.strip() for c in (text_columns or "").split(",") if c.strip())
    request = PredictRequest(model_or_run=model_or_run, file=file, task=normalize_task(task)
                             if task else None, split=split,
                             data_dir=data_dir, text_columns=columns, output=output, fmt=fmt,
                             precision=precision, max_seq_len=max_seq_len, batch_size=batch_size,
                             np=np_, max_rows=max_rows, label_column=label_column)
    p = plan(request)
    if dry_run:
        click.echo(describe(p), nl=False)
        return
    with signals_interrupt(), _progress(len(p.inputs)) as on_rows:
        done = execute(p, on_rows)
    if done.text is not None:
        click.echo(done.text, nl=False)
    click.echo(f"[cpudist] {summary(p, done)}", err=True)
