"""Text classification data: GLUE from the Hub or GLUE's TSV layout, and user files.

Pure parsing (no torch): the CLI calls it before launching so bad data fails in one line.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train.tasks import GLUE_DIR_NAMES, GLUE_TASKS, GlueTask

CUSTOM_SUFFIXES = (".csv", ".tsv", ".txt", ".json", ".jsonl")


@dataclass(frozen=True)
class Split:
    """One split: one or two text columns and a label per row."""

    texts: tuple[tuple[str, ...], ...]  # one tuple per text column, each as long as labels
    labels: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int | None) -> Split:
        if n is None or n >= len(self):
            return self
        return Split(tuple(col[:n] for col in self.texts), self.labels[:n])


@dataclass(frozen=True)
class TaskData:
    """A task ready to tokenize: splits, label names, and which metrics to report."""

    name: str
    train: Split
    validation: Split
    label_names: tuple[str, ...]
    metrics: tuple[str, ...]

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1


Row = tuple[int, list[str]]  # (line number, fields)


def _open_text(path: Path) -> list[str]:
    if not path.is_file():
        raise BadInput(f"data file not found: {path}", "Check the path (--data-dir/--train-file)")
    # utf-8-sig: MRPC's files start with a byte-order mark that would corrupt the first header.
    return path.read_text(encoding="utf-8-sig").splitlines()


def read_table(path: Path, delimiter: str, header: bool = True) -> tuple[list[str], list[Row]]:
    """Read a delimited file; GLUE's quotes are text, not CSV quoting, so only .csv unquotes."""
    lines = _open_text(path)
    if delimiter == ";":
        # `text;label` files: the text itself may hold semicolons, so split on the last ones.
        ncols = lines[0].count(";") + 1 if lines else 1
        rows = [line.rsplit(";", ncols - 1) for line in lines]
    else:
        if path.suffix == ".csv":
            rows = list(csv.reader(lines, delimiter=delimiter))
        else:
            rows = list(csv.reader(lines, delimiter=delimiter, quoting=csv.QUOTE_NONE))
    numbered = [(i + 1, r) for i, r in enumerate(rows) if r and any(f.strip() for f in r)]
    if not numbered:
        raise BadInput(f"{path} is empty", "Give a file with a header line and at least one row")
    if not header:
        return [], numbered
    return numbered[0][1], numbered[1:]


def _column_index(path: Path, columns: list[str], name: str | int, role: str) -> int:
    if isinstance(name, int):
        return name
    if name not in columns:
        raise BadInput(
            f"{role} column '{name}' not found in {path} (columns: {', '.join(columns)})",
            f"Pick one of those with --{role}-column" + ("s" if role == "text" else ""))
    return columns.index(name)


def _field(path: Path, row: Row, index: int) -> str:
    line, fields = row
    if index >= len(fields):
        raise BadInput(f"malformed row at {path}:{line}: expected at least {index + 1} fields, "
                       f"found {len(fields)}", "Fix or remove that line (is the delimiter right?)")
    return fields[index]


def _labels_to_ids(path: Path, rows: Sequence[Row], raw: Sequence[str],
                   names: tuple[str, ...]) -> tuple[float, ...]:
    if not names:  # regression
        try:
            return tuple(float(v) for v in raw)
        except ValueError as e:
            raise BadInput(f"non-numeric score in {path}: {e}",
                           "Regression labels must be numbers") from None
    index = {n: i for i, n in enumerate(names)}
    out = []
    for (line, _), value in zip(rows, raw, strict=True):
        if value not in index:
            raise BadInput(f"unknown label '{value}' at {path}:{line}",
                           f"Expected one of: {', '.join(names)}")
        out.append(float(index[value]))
    return tuple(out)


def _split_from_table(path: Path, columns: list[str], rows: list[Row],
                      text: Sequence[str | int], label: str | int,
                      names: tuple[str, ...]) -> Split:
    if not rows:
        raise BadInput(f"{path} has no data rows", "Give a file with a header and at least one row")
    text_idx = [_column_index(path, columns, c, "text") for c in text]
    label_idx = _column_index(path, columns, label, "label")
    texts = tuple(tuple(_field(path, r, i) for r in rows) for i in text_idx)
    raw = [_field(path, r, label_idx).strip() for r in rows]
    return Split(texts, _labels_to_ids(path, rows, raw, names))


def glue_dir(task: str, data_dir: Path) -> Path:
    """The folder holding a task's TSVs: DATA_DIR itself, or DATA_DIR/<GLUE name>."""
    if not data_dir.is_dir():
        raise BadInput(f"data directory not found: {data_dir}",
                       "Point --data-dir at a GLUE task folder holding train.tsv and dev.tsv")
    for candidate in (data_dir, data_dir / GLUE_DIR_NAMES[task]):
        if (candidate / "train.tsv").is_file():
            return candidate
    raise BadInput(f"no train.tsv in {data_dir} or {data_dir / GLUE_DIR_NAMES[task]}",
                   "Point --data-dir at a GLUE task folder (as GLUE's download script lays it out)")


def load_glue_tsv(task: str, data_dir: Path) -> TaskData:
    """Read a GLUE task from a local folder in GLUE's standard TSV layout."""
    spec = GLUE_TASKS[task]
    folder = glue_dir(task, data_dir)
    splits = []
    for name in ("train.tsv", spec.tsv.validation_file):
        path = folder / name
        columns, rows = read_table(path, "\t", header=spec.tsv.header)
        splits.append(_split_from_table(path, columns, rows, spec.tsv.text, spec.tsv.label,
                                        spec.labels))
    return TaskData(task, splits[0], splits[1], spec.labels, spec.metrics)


def load_glue_hub(task: str) -> TaskData:
    """Read a GLUE task from the Hugging Face Hub with `datasets` (needs the Hub)."""
    import datasets

    spec: GlueTask = GLUE_TASKS[task]
    ds = datasets.load_dataset("nyu-mll/glue", task)

    def split(name: str) -> Split:
        part = ds[name]
        return Split(tuple(tuple(part[c]) for c in spec.hub_text),
                     tuple(float(v) for v in part["label"]))

    return TaskData(task, split("train"), split(spec.hub_validation_split), spec.labels,
                    spec.metrics)


def _read_records(path: Path) -> tuple[list[str], list[Row]]:
    """Rows of a custom file as (columns, rows), whatever its format."""
    suffix = path.suffix.lower()
    if suffix not in CUSTOM_SUFFIXES:
        raise BadInput(f"unsupported data file type '{suffix}' ({path})",
                       f"Use one of: {', '.join(CUSTOM_SUFFIXES)}")
    if suffix in (".json", ".jsonl"):
        return _read_json(path)
    delimiter = {".csv": ",", ".tsv": "\t", ".txt": ";"}[suffix]
    return read_table(path, delimiter)


def _read_json(path: Path) -> tuple[list[str], list[Row]]:
    lines = _open_text(path)
    text = "\n".join(lines).strip()
    try:
        if text.startswith("["):
            records = [(i + 1, r) for i, r in enumerate(json.loads(text))]
        else:
            records = [(i + 1, json.loads(line)) for i, line in enumerate(lines) if line.strip()]
    except json.JSONDecodeError as e:
        raise BadInput(f"malformed JSON in {path}: {e}",
                       "Use JSON Lines or one JSON array") from None
    if not records:
        raise BadInput(f"{path} is empty", "Give at least one record")
    columns = list(records[0][1])
    rows = [(n, [str(rec.get(c, "")) if isinstance(rec, dict) else "" for c in columns])
            for n, rec in records]
    return columns, rows


def _label_names(values: Iterable[str]) -> tuple[str, ...]:
    unique = set(values)
    if all(v.lstrip("-").isdigit() for v in unique):
        return tuple(sorted(unique, key=int))
    return tuple(sorted(unique))


def _is_scores(values: Iterable[str]) -> bool:
    """Numbers with a fraction somewhere (STS-B's 3.8): scores to regress on, not class names."""
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        return False
    return all(math.isfinite(x) for x in numbers) and any(x != int(x) for x in numbers)


def load_custom(train_file: Path, validation_file: Path | None, text_columns: Sequence[str],
                label_column: str) -> TaskData:
    """Read user data (csv, tsv, `;`-separated txt, json, jsonl): class labels, or scores for
    regression."""
    if not 1 <= len(text_columns) <= 2:
        raise BadInput(f"{len(text_columns)} text columns given",
                       "Name one or two with --text-columns a[,b]")
    columns, rows = _read_records(train_file)
    label_idx = _column_index(train_file, columns, label_column, "label")
    raw = [_field(train_file, r, label_idx).strip() for r in rows]
    # Fractional numbers are scores: as class names each distinct score would become a class.
    names = () if _is_scores(raw) else _label_names(raw)
    if len(set(raw)) < 2:
        raise BadInput(f"only one label value in {train_file}", "Training needs at least two")
    train = _split_from_table(train_file, columns, rows, text_columns, label_column, names)
    if validation_file is None:
        raise BadInput("no validation file given",
                       "Pass --validation-file (same columns as --train-file)")
    vcols, vrows = _read_records(validation_file)
    validation = _split_from_table(validation_file, vcols, vrows, text_columns, label_column, names)
    if not names:
        metrics: tuple[str, ...] = ("pearson", "spearmanr")
    else:
        metrics = ("accuracy", "f1") if len(names) == 2 else ("accuracy", "f1_macro")
    return TaskData("custom", train, validation, names, metrics)


def load_task(cfg: TrainConfig) -> TaskData:
    """The task's text data from wherever the config points (not for `synthetic`)."""
    if cfg.task == "custom":
        if cfg.train_file is None:
            raise BadInput("task 'custom' needs --train-file",
                           "Add --train-file and --validation-file")
        return load_custom(Path(cfg.train_file), Path(cfg.validation_file) if cfg.validation_file
                           else None,
                           cfg.text_columns or ("text",), cfg.label_column or "label")
    if cfg.data_dir is not None:
        return load_glue_tsv(cfg.task, Path(cfg.data_dir))
    return load_glue_hub(cfg.task)
