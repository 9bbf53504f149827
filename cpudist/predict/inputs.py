"""The rows to predict: a user file read as `cpudist run` reads custom data, or a GLUE split in
GLUE's layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.train.data import (
    Row,
    Split,
    _column_index,
    _field,
    _labels_to_ids,
    _read_records,
    _split_from_table,
    read_table,
)
from cpudist.train.tasks import GLUE_DIR_NAMES, GLUE_TASKS

SPLITS = ("dev", "test")
# GLUE's test files: the id column run_glue.py's submission rows are numbered by (QQP calls it
# `id`), and the text columns by name (CoLA's train and dev files have no header, its test file
# does).
TEST_ID_COLUMN = {"qqp": "id"}
TEST_TEXT = {"cola": ("sentence",)}
TEST_FILE = {"mnli": "test_matched.tsv"}


@dataclass(kw_only=True, frozen=True)
class Inputs:
    """Rows to predict: one tuple per text column; labels and metric names when the split has
    them."""

    path: Path
    texts: tuple[tuple[str, ...], ...]
    ids: tuple[str, ...]  # each row's id: GLUE's index column, else its position
    labels: tuple[float, ...] | None = None  # class ids (or scores) in the task's label order
    metrics: tuple[str, ...] = ()
    task: str | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def head(self, n: int | None) -> Inputs:
        """The first n rows (all when n is None)."""
        if n is None or n >= len(self):
            return self
        labels = self.labels[:n] if self.labels is not None else None
        return Inputs(path=self.path, texts=tuple(c[:n] for c in self.texts), ids=self.ids[:n],
                      labels=labels, metrics=self.metrics, task=self.task)


def metric_names(names: tuple[str, ...], task: str | None) -> tuple[str, ...]:
    """What `cpudist run` reports for this task: GLUE's own metrics, else custom data's by the kind
    of label."""
    if task in GLUE_TASKS:
        return GLUE_TASKS[task].metrics
    if not names:
        return ("pearson", "spearmanr")
    return ("accuracy", "f1") if len(names) == 2 else ("accuracy", "f1_macro")


def _label_ids(path: Path, rows: Sequence[Row], raw: Sequence[str],
               names: tuple[str, ...]) -> tuple[float, ...]:
    """Class names (the model's id2label) or class ids as numbers; scores for regression."""
    if not names:
        return _labels_to_ids(path, rows, raw, names)
    ids = {n: i for i, n in enumerate(names)} | {str(i): i for i in range(len(names))}
    for (line, _), value in zip(rows, raw, strict=True):
        if value not in ids:
            raise BadInput(f"unknown label '{value}' at {path}:{line}",
                           f"Expected one of the model's classes: {', '.join(names)} "
                           "(or their ids)")
    return tuple(float(ids[v]) for v in raw)


def read_file(path: Path, text_columns: Sequence[str], label_column: str | None = None,
              names: tuple[str, ...] = (), task: str | None = None) -> Inputs:
    """A csv, tsv, `;`-separated txt, json or jsonl file: the named text columns of every row, and
    its labels to score against when a label column is named."""
    if not 1 <= len(text_columns) <= 2:
        raise BadInput(f"{len(text_columns)} text columns given",
                       "Name one or two with --text-columns a[,b]")
    columns, rows = _read_records(path)
    if not rows:
        raise BadInput(f"{path} has no data rows", "Give a file with a header and at least one row")
    indices = [_column_index(path, columns, c, "text") for c in text_columns]
    texts = tuple(tuple(_field(path, r, i) for r in rows) for i in indices)
    ids = tuple(str(i) for i in range(len(rows)))
    if label_column is None:
        return Inputs(path=path, texts=texts, ids=ids)
    at = _column_index(path, columns, label_column, "label")
    labels = _label_ids(path, rows, [_field(path, r, at).strip() for r in rows], names)
    return Inputs(path=path, texts=texts, ids=ids, labels=labels, metrics=metric_names(names, task),
                  task=task)


def split_file(task: str, split: str, data_dir: Path) -> Path:
    """The TSV of a GLUE split in DATA_DIR or DATA_DIR/<GLUE name>, as GLUE's download script lays
    it out."""
    if task not in GLUE_TASKS:
        raise BadInput(f"--split needs a GLUE task, not '{task}'",
                       f"Pass --task, one of: {', '.join(GLUE_TASKS)}")
    if split not in SPLITS:
        raise BadInput(f"unknown split '{split}'", f"Use one of: {', '.join(SPLITS)}")
    name = (GLUE_TASKS[task].tsv.validation_file if split == "dev"
            else TEST_FILE.get(task, "test.tsv"))
    for folder in (data_dir, data_dir / GLUE_DIR_NAMES[task]):
        if (folder / name).is_file():
            return folder / name
    raise BadInput(f"no {name} in {data_dir} or {data_dir / GLUE_DIR_NAMES[task]}",
                   "Point --data-dir at the GLUE task folder that holds it")


def read_split(task: str, split: str, data_dir: Path) -> Inputs:
    """A GLUE split: dev with its labels (to score), test with its index column (for the submission
    file)."""
    spec = GLUE_TASKS[task]
    path = split_file(task, split, data_dir)
    if split == "dev":
        columns, rows = read_table(path, "\t", header=spec.tsv.header)
        part: Split = _split_from_table(path, columns, rows, spec.tsv.text, spec.tsv.label,
                                        spec.labels)
        return Inputs(path=path, texts=part.texts, ids=tuple(str(i) for i in range(len(part))),
                      labels=part.labels, metrics=spec.metrics, task=task)
    columns, rows = read_table(path, "\t")
    text = TEST_TEXT.get(task, tuple(str(c) for c in spec.tsv.text))
    if not rows:
        raise BadInput(f"{path} has no data rows",
                       "Give the GLUE test file with its header and rows")
    indices = [_column_index(path, columns, c, "text") for c in text]
    id_column = TEST_ID_COLUMN.get(task, "index")
    if id_column not in columns:
        raise BadInput(f"{path} has no '{id_column}' column (columns: {', '.join(columns)})",
                       "Give GLUE's own test file: its rows are numbered in that column")
    id_index = columns.index(id_column)
    texts = tuple(tuple(_field(path, r, i) for r in rows) for i in indices)
    return Inputs(path=path, texts=texts, ids=tuple(_field(path, r, id_index) for r in rows),
                  task=task)
