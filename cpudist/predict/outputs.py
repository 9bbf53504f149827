"""Predictions as records (label, score per class; value for regression) and the files they go
to."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.train.tasks import GLUE_TASKS

FORMATS = ("jsonl", "csv", "json", "glue")
SUFFIXES = {".jsonl": "jsonl", ".csv": "csv", ".json": "json", ".tsv": "glue", ".txt": "glue"}


@dataclass(frozen=True)
class Prediction:
    """One row's prediction: the class (by the highest logit) and each class's probability, or a
    value."""

    label: str | None
    scores: dict[str, float]
    value: float | None = None
    class_id: int = 0

    def record(self) -> dict[str, object]:
        if self.label is None:
            return {"value": self.value}
        return {"label": self.label, "score": self.scores[self.label], "scores": self.scores}


def predictions(logits: Sequence[Sequence[float]], names: tuple[str, ...]) -> list[Prediction]:
    """Rows of logits -> predictions; the label is the argmax of the logits, as the run's evaluation
    takes it."""
    out = []
    for row in logits:
        if not names:
            out.append(Prediction(None, {}, float(row[0])))
            continue
        top = max(row)
        exp = [math.exp(x - top) for x in row]
        total = sum(exp)
        # the first of equal maxima, as torch.argmax
        best = max(range(len(row)), key=row.__getitem__)
        out.append(Prediction(names[best], {n: e / total for n, e in zip(names, exp, strict=True)},
                              None, best))
    return out


def class_ids(logits: Sequence[Sequence[float]], regression: bool) -> list[float]:
    """What the run's metrics compare to the labels: the argmax class id, or the value."""
    if regression:
        return [float(row[0]) for row in logits]
    return [float(max(range(len(row)), key=row.__getitem__)) for row in logits]


def pick_format(output: str | None, fmt: str | None, glue_split: bool) -> str:
    """--format when given, else from --output's suffix, else glue for a GLUE split and jsonl
    otherwise."""
    if fmt is not None:
        return fmt
    if output and output != "-":
        suffix = Path(output).suffix.lower()
        if suffix in SUFFIXES:
            return SUFFIXES[suffix]
        raise BadInput(f"cannot tell the format of {output} from '{suffix}'",
                       f"Use a suffix of {', '.join(SUFFIXES)} "
                       f"or pass --format {'|'.join(FORMATS)}")
    return "glue" if glue_split else "jsonl"


def glue_labels(task: str | None, names: tuple[str, ...]) -> tuple[str, ...]:
    """The class names GLUE's submission format wants (0/1, entailment, ...), in class-id order."""
    if task in GLUE_TASKS:
        wanted = GLUE_TASKS[task].labels
        if len(wanted) != len(names):
            raise BadInput(f"the model has {len(names) or 1} output(s); GLUE's {task} has "
                           f"{len(wanted) or 1}",
                           "Give a model trained on that task, "
                           "or --format jsonl for its own labels")
        return wanted
    return names


def render(preds: Sequence[Prediction], ids: Sequence[str], fmt: str, names: tuple[str, ...],
           task: str | None) -> str:
    """The text of the output file, rows in input order."""
    if fmt == "jsonl":
        return "".join(json.dumps(p.record()) + "\n" for p in preds)
    if fmt == "json":
        return json.dumps([p.record() for p in preds], indent=1) + "\n"
    if fmt == "glue":  # as run_glue.py --do_predict writes predict_results_<task>.txt
        lines = ["index\tprediction"]
        wanted = glue_labels(task, names)
        for i, p in zip(ids, preds, strict=True):
            if p.label is None:
                lines.append(f"{i}\t{p.value:3.3f}")
            else:
                lines.append(f"{i}\t{wanted[p.class_id]}")
        return "\n".join(lines) + "\n"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if names:
        writer.writerow(["label", "score", *(f"score:{n}" for n in names)])
        writer.writerows([p.label, p.scores[p.label or ""], *(p.scores[n] for n in names)]
                         for p in preds)
    else:
        writer.writerow(["value"])
        writer.writerows([p.value] for p in preds)
    return buf.getvalue()


def write(text: str, output: Path) -> None:
    """Write the whole file at once (a file named .tmp, then renamed), so no reader sees half of
    it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(output)
