"""Whether a model fits the rows it is asked to predict: the task its run recorded and its class
names, by name, against the rows' task. Files only, no torch."""

from __future__ import annotations

import re

from cpudist.errors import BadInput
from cpudist.predict.source import Source
from cpudist.train.tasks import GLUE_DIR_NAMES, GLUE_TASKS, HUB_LABEL_NAMES

UNNAMED = re.compile(r"LABEL_\d+")  # transformers' names for classes nobody named


def proper(task: str) -> str:
    """A task as people write it: GLUE's own spelling (STS-B, CoLA, SST-2), or custom data."""
    return GLUE_DIR_NAMES.get(task) or ("custom data" if task == "custom" else task)


def classes(names: tuple[str, ...]) -> str:
    return f"classes {', '.join(names)}" if names else "a score (regression)"


def glue_names(task: str) -> tuple[tuple[str, ...], ...]:
    """The class names, in id order, a model of a GLUE task carries: the Hub's (what cpudist saves),
    or the names in GLUE's own files; () for regression."""
    spec = GLUE_TASKS[task]
    return tuple(dict.fromkeys((HUB_LABEL_NAMES.get(task, spec.labels), spec.labels)))


def unnamed(names: tuple[str, ...]) -> bool:
    return bool(names) and all(UNNAMED.fullmatch(n) for n in names)


def check(source: Source, task: str | None) -> None:
    """Refuse, in one line, a model trained on another task than the rows' (`task`: a GLUE task,
    custom, or None when nothing says), or whose class names are not that task's (the names, not
    only their count)."""
    if task is None:
        return
    model, names, trained = source.model_dir, source.label_names, source.facts.task
    if trained is not None and trained != task:
        raise BadInput(f"{model} was trained on {proper(trained)} ({classes(names)}); the rows are "
                       f"{proper(task)}'s",
                       f"Give a model trained on {proper(task)}, or rows of {proper(trained)}")
    if task not in GLUE_TASKS:
        return
    wanted = glue_names(task)
    if names in wanted:
        return
    if not unnamed(names) or len(names) != len(wanted[0]):
        raise BadInput(f"{model} predicts {classes(names)}; {proper(task)}'s rows have "
                       f"{classes(wanted[0])}",
                       f"Give a model trained on {proper(task)}")
    # unnamed classes pass only where the model's run or card says they are this task's
    if trained is None:
        raise BadInput(f"{model} names its classes {', '.join(names)} and no run or card says its "
                       "task: a base model "
                       "whose head was never fine-tuned, or one saved without its class names",
                       f"Fine-tune it on {proper(task)} (cpudist run {task} --model {model}), or "
                       f"if it was, write {proper(task)}'s class names ({', '.join(wanted[0])}) "
                       "into id2label in its config.json")
