"""The GLUE tasks: where their text and labels live, on the Hub and in GLUE's TSV layout."""

from __future__ import annotations

from dataclasses import dataclass

from cpudist.errors import BadInput


@dataclass(frozen=True)
class TsvLayout:
    """How one GLUE task's TSV files are laid out (as GLUE's download script writes them)."""

    text: tuple[str | int, ...]  # column names, or indices when the file has no header
    label: str | int
    header: bool = True
    validation_file: str = "dev.tsv"


@dataclass(kw_only=True, frozen=True)
class GlueTask:
    """One GLUE task: labels, metrics and both of its sources."""

    name: str
    labels: tuple[str, ...]  # label names in the Hub's id order; empty for regression
    metrics: tuple[str, ...]
    hub_text: tuple[str, ...]
    tsv: TsvLayout
    hub_validation_split: str = "validation"

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return len(self.labels) or 1


BINARY = ("0", "1")
ENTAIL = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask(name="cola", labels=BINARY, metrics=("matthews_correlation",),
                 hub_text=("sentence",), tsv=TsvLayout(text=(3,), label=1, header=False)),
        GlueTask(name="sst2", labels=BINARY, metrics=("accuracy",), hub_text=("sentence",),
                 tsv=TsvLayout(text=("sentence",), label="label")),
        GlueTask(name="mrpc", labels=BINARY, metrics=("accuracy", "f1"),
                 hub_text=("sentence1", "sentence2"),
                 tsv=TsvLayout(text=("#1 String", "#2 String"), label="Quality")),
        GlueTask(name="stsb", labels=(), metrics=("pearson", "spearmanr"),
                 hub_text=("sentence1", "sentence2"),
                 tsv=TsvLayout(text=("sentence1", "sentence2"), label="score")),
        GlueTask(name="qqp", labels=BINARY, metrics=("accuracy", "f1"),
                 hub_text=("question1", "question2"),
                 tsv=TsvLayout(text=("question1", "question2"), label="is_duplicate")),
        GlueTask(name="mnli", labels=("entailment", "neutral", "contradiction"),
                 metrics=("accuracy",),
                 hub_text=("premise", "hypothesis"),
                 tsv=TsvLayout(text=("sentence1", "sentence2"), label="gold_label",
                           validation_file="dev_matched.tsv"),
                 hub_validation_split="validation_matched"),
        GlueTask(name="qnli", labels=ENTAIL, metrics=("accuracy",),
                 hub_text=("question", "sentence"),
                 tsv=TsvLayout(text=("question", "sentence"), label="label")),
        GlueTask(name="rte", labels=ENTAIL, metrics=("accuracy",),
                 hub_text=("sentence1", "sentence2"),
                 tsv=TsvLayout(text=("sentence1", "sentence2"), label="label")),
        GlueTask(name="wnli", labels=BINARY, metrics=("accuracy",),
                 hub_text=("sentence1", "sentence2"),
                 tsv=TsvLayout(text=("sentence1", "sentence2"), label="label")),
    )
}

# The class names the Hub's glue dataset gives each task's label ids (GLUE's files say 0/1): what a
# saved model's id2label shows.
HUB_LABEL_NAMES: dict[str, tuple[str, ...]] = {
    "cola": ("unacceptable", "acceptable"), "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"), "qqp": ("not_duplicate", "duplicate"),
    "mnli": ("entailment", "neutral", "contradiction"), "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"), "wnli": ("not_entailment", "entailment"),
}


def display_labels(task: str, labels: tuple[str, ...]) -> tuple[str, ...]:
    """Class names in id order: the Hub's for a GLUE task, the data's own otherwise (custom
    data)."""
    return HUB_LABEL_NAMES.get(task, labels)


# Directory names used by GLUE's download script, so `--data-dir glue/` also works.
GLUE_DIR_NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
                  "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}

SPECIAL_TASKS = ("synthetic", "custom")


def task_names() -> tuple[str, ...]:
    """Every task name `cpudist run` accepts."""
    return (*GLUE_TASKS, *SPECIAL_TASKS)


def normalize_task(name: str) -> str:
    """Accept `SST-2`, `sst-2`, `STS-B` and friends; reject what is not a task."""
    key = name.lower().replace("-", "").replace("_", "")
    if key in GLUE_TASKS or key in SPECIAL_TASKS:
        return key
    raise BadInput(f"unknown task '{name}'",
                   f"Use one of: {', '.join(task_names())} (custom data: --train-file with task "
                   "'custom')")
