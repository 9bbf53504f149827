"""Where the model is, what its run recorded (precision, lengths, data), how to compute: files only,
no torch."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpudist.errors import BadInput
from cpudist.train.lora import is_adapter
from cpudist.wire import names, programs

# A tokenizer's own files: without one, transformers 5 builds an empty tokenizer from config.json
# without a word.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model")
HEAD = "ForSequenceClassification"  # the architecture's suffix of a model with a classifier head


@dataclass(kw_only=True, frozen=True)
class RunFacts:
    """What a run folder says about how its model was trained and evaluated (None: not recorded)."""

    task: str | None = None
    data_dir: str | None = None
    text_columns: tuple[str, ...] = ()
    precision: str | None = None  # fp32 | bf16: what the run computed in (result.json)
    max_seq_len: int | None = None
    eval_batch_size: int | None = None
    max_eval_samples: int | None = None  # the run scored the first N dev rows
    world_size: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Source:
    """A model folder (saved with save_pretrained), its run folder when it has one, and its
    labels."""

    model_dir: Path
    run_dir: Path | None
    facts: RunFacts
    label_names: tuple[str, ...]  # in class-id order; empty for regression

    @property
    def is_regression(self) -> bool:
        return not self.label_names


def _is_run_folder(path: Path) -> bool:
    return any((path / name).is_file()
               for name in (names.RESULT, names.COMMAND, names.STEPS, names.RUN))


def find_source(given: Path) -> Source:
    """The model folder in MODEL_OR_RUN (itself, or its model/), with what its run recorded."""
    path = given.expanduser()
    if not path.exists():
        raise BadInput(f"model or run folder not found: {given}",
                       "Give a folder saved with save_pretrained() "
                       "or a run folder of `cpudist run`")
    if (path / "config.json").is_file():
        model_dir = path
        run_dir = path.parent if _is_run_folder(path.parent) else None
    elif (path / names.MODEL / "config.json").is_file():
        model_dir, run_dir = path / names.MODEL, path
    elif _is_run_folder(path):
        raise BadInput(f"run folder {path} has no model/ (the run did not save its model)",
                       "Re-run `cpudist run` with --save-model last (the default) to get "
                       "<run>/model/, or give a folder saved with save_pretrained()")
    else:
        raise BadInput(f"{path} holds no model: no config.json there or in {path / 'model'}",
                       "Give a folder saved with save_pretrained() "
                       "or a run folder of `cpudist run`")
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise BadInput(f"no tokenizer in {model_dir} (none of {', '.join(TOKENIZER_FILES)})",
                       "Save the tokenizer beside the model: tokenizer.save_pretrained(folder)")
    facts = read_facts(run_dir) if run_dir else RunFacts(task=card_task(model_dir),
                                                         precision=card_precision(model_dir))
    return Source(model_dir, run_dir, facts, label_names(model_dir))


def card_precision(model_dir: Path) -> str | None:
    """The precision a model card of cpudist names (`precision bf16`), for a model folder away from
    its run."""
    card = model_dir / "README.md"
    if not card.is_file():
        return None
    found = re.search(r"\bprecision (bf16|fp32)\b", card.read_text(errors="replace"))
    return found.group(1) if found else None


def card_task(model_dir: Path) -> str | None:
    """The task a model card of cpudist names (`- Task: `mrpc``), for a model folder away from its
    run."""
    card = model_dir / "README.md"
    if not card.is_file():
        return None
    found = re.search(r"^- Task: `(\w+)`", card.read_text(errors="replace"), re.MULTILINE)
    return found.group(1) if found else None


def label_names(model_dir: Path) -> tuple[str, ...]:
    """Class names from config.json's id2label in id order; () for a regression head."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"cannot read {model_dir / 'config.json'}: {e}",
                       "Save the model again with save_pretrained()") from None
    heads = [str(a) for a in config.get("architectures") or ()]
    # AutoModelForSequenceClassification would add a random head (an adapter's config keeps its
    # base's name)
    if heads and not any(a.endswith(HEAD) for a in heads) and not is_adapter(model_dir):
        raise BadInput(f"{model_dir} holds a base model ({', '.join(heads)}) without a "
                       "classification head: it was never fine-tuned to classify",
                       f"Fine-tune it first (cpudist run TASK --model {model_dir}), then predict "
                       "with that run")
    id2label: dict[str, str] = config.get("id2label") or {}
    count = int(config.get("num_labels") or len(id2label) or 2)
    if config.get("problem_type") == "regression" or count == 1:
        return ()
    return tuple(str(id2label.get(str(i), f"LABEL_{i}")) for i in range(count))


def _rank_words(command: str) -> list[str]:
    """The rank program's own options in command.txt (the launcher's words before them dropped)."""
    for line in command.splitlines():
        if programs.RANK not in line:
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if programs.RANK in words:  # the rank program's words follow it
            return words[words.index(programs.RANK) + 1:]
    return []


def read_facts(run_dir: Path) -> RunFacts:
    """result.json's precision, lengths, metrics and data folder as the user gave it (command.txt
    names the copy the ranks read: a head's stage folder from a laptop), and the rank options in
    command.txt; missing parts stay None."""
    result: dict[str, Any] = {}
    if (run_dir / names.RESULT).is_file():
        try:
            result = json.loads((run_dir / names.RESULT).read_text())
        except json.JSONDecodeError:
            result = {}
    cfg = None
    if (run_dir / names.COMMAND).is_file():
        words = _rank_words((run_dir / names.COMMAND).read_text())
        if words:
            from cpudist.config import from_argv  # parsing only, no torch

            try:
                cfg = from_argv(words)
            # argparse's way to refuse: a command of another version; use result.json alone
            except SystemExit:
                cfg = None
    return RunFacts(
        task=result.get("task") or (cfg.task if cfg else None),
        data_dir=(result.get("data") or {}).get("dir") or (cfg.data_dir if cfg else None),
        text_columns=cfg.text_columns if cfg else (),
        precision=result.get("precision"),
        max_seq_len=result.get("max_seq_len") or (cfg.max_seq_len if cfg else None),
        eval_batch_size=cfg.eval_batch_size if cfg else None,
        max_eval_samples=cfg.max_eval_samples if cfg else None,
        world_size=result.get("world_size"),
        metrics=dict(result.get("metrics") or {}),
    )


@dataclass(frozen=True)
class Settings:
    """How to run the model: precision (fp32 | bf16 autocast), truncation, batch size, threads."""

    model_dir: str
    precision: str
    max_seq_len: int
    batch_size: int
    threads: int
