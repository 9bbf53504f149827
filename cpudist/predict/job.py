"""A predict job: plan it from the request (files only, no torch), describe it, or run it on --np
processes."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cpudist.cpu import read_cpu, read_cpu_quota, usable_cores
from cpudist.errors import BadInput, JobFailed
from cpudist.predict import match, outputs
from cpudist.predict.inputs import Inputs, read_file, read_split
from cpudist.predict.source import Settings, Source, find_source
from cpudist.train.tasks import GLUE_TASKS
from cpudist.train.threads import pinned_threads
from cpudist.wire import events, programs

DEFAULT_BATCH = 64  # the run's default --eval-batch-size: the same batches, the same numbers
DEFAULT_MAX_LEN = 128  # the run's default --max-seq-len


@dataclass(kw_only=True, frozen=True)
class PredictRequest:
    """What `cpudist predict` was asked: the model, the rows, the output and how to compute."""

    model_or_run: Path
    file: Path | None = None
    task: str | None = None
    split: str | None = None
    data_dir: Path | None = None
    text_columns: tuple[str, ...] = ()
    output: str | None = None  # a path, "-" for stdout, None for the default
    fmt: str | None = None
    precision: str | None = None  # fp32 | bf16 | auto; None: fp32, whatever the run computed in
    max_seq_len: int | None = None
    batch_size: int | None = None
    np: int = 1
    # the first N rows only; for the dev split of a run, the run's --max-eval-samples
    max_rows: int | None = None
    label_column: str | None = None  # --file's labels, to score the predictions against


@dataclass(kw_only=True, frozen=True)
class Plan:
    """Everything read and decided before the model loads."""

    source: Source
    inputs: Inputs
    settings: Settings
    precision_from: str
    np: int
    output: Path | None  # None: stdout
    fmt: str


@dataclass(frozen=True)
class Outcome:
    """What a predict job did: rows, where they went, the metrics when the rows had labels, time."""

    rows: int
    output: Path | None
    text: str | None  # the predictions, when they go to stdout
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def _precision(req: PredictRequest, source: Source) -> tuple[str, str]:
    if req.precision == "auto":
        return ("bf16" if read_cpu().has_bf16 else "fp32"), "--precision auto"
    if req.precision is not None:
        return req.precision, "--precision"
    ran = source.facts.precision
    # bf16 keeps 8 bits of a score: enough for the run's metric, not for scores
    if ran and ran != "fp32":
        return "fp32", (f"the default; the run computed in {ran}: --precision {ran} gives its "
                        "own numbers")
    return "fp32", "the default; --precision to change"


def _threads(np_: int) -> int:
    pinned = pinned_threads(os.environ)
    if pinned is not None:
        return pinned
    cpu = read_cpu()
    return max(1, usable_cores(len(cpu.core_ids) or cpu.physical_cores, read_cpu_quota()) // np_)


def _inputs(req: PredictRequest, source: Source) -> Inputs:
    facts = source.facts
    if (req.file is None) == (req.split is None):
        raise BadInput("give either --file or --split" if req.file else "nothing to predict",
                       "Pass --file F (csv, tsv, txt, json, jsonl), or --split dev|test with "
                       "--task and --data-dir")
    if req.file is not None:
        task = req.task or facts.task
        task_text = GLUE_TASKS[task].tsv.text if task in GLUE_TASKS else ()
        named = tuple(c for c in task_text if isinstance(c, str))
        return read_file(req.file, req.text_columns or facts.text_columns or named or ("text",),
                         req.label_column, source.label_names, task)
    task = req.task or facts.task
    data_dir = req.data_dir or (Path(facts.data_dir) if facts.data_dir else None)
    if task is None or data_dir is None:
        raise BadInput(f"--split {req.split} needs the task and its data folder",
                       "Pass --task (e.g. mrpc) and --data-dir (GLUE's task folder)")
    rows = read_split(task, req.split or "", data_dir)
    if req.max_rows is None and req.split == "dev" and task == facts.task:
        return rows.head(facts.max_eval_samples)  # the rows the run scored
    return rows


def _output(req: PredictRequest, source: Source, inputs: Inputs) -> Path | None:
    if req.output == "-" or (req.output is None and req.split is None):
        return None
    if req.output is not None:
        return Path(req.output)
    name = f"predict_results_{inputs.task}{'_dev' if req.split == 'dev' else ''}.txt"
    return (source.run_dir or Path.cwd()) / name


def plan(req: PredictRequest) -> Plan:
    """Find the model, read the rows, settle precision, lengths, batches, threads and the output."""
    if req.np < 1:
        raise BadInput(f"--np {req.np}", "Use 1 or more processes")
    source = find_source(req.model_or_run)
    # before the rows: a mismatch says so, not a label error
    match.check(source, req.task or source.facts.task)
    inputs = _inputs(req, source).head(req.max_rows)
    precision, why = _precision(req, source)
    facts = source.facts
    settings = Settings(str(source.model_dir), precision, req.max_seq_len or facts.max_seq_len
                        or DEFAULT_MAX_LEN,
                        req.batch_size or facts.eval_batch_size or DEFAULT_BATCH, _threads(req.np))
    output = _output(req, source, inputs)
    fmt = outputs.pick_format(str(output) if output else None, req.fmt, req.split is not None)
    if fmt == "glue":
        # refuses a model of another task now, not later
        outputs.glue_labels(inputs.task, source.label_names)
    return Plan(source=source, inputs=inputs, settings=settings, precision_from=why, np=req.np,
                output=output, fmt=fmt)


def describe(p: Plan) -> str:
    """The dry run: what would be read and written, and how."""
    s = p.settings
    lines = [f"model:     {s.model_dir}"
             + (f" (run {p.source.run_dir})" if p.source.run_dir else ""),
             f"labels:    {', '.join(p.source.label_names) or 'a value (regression)'}",
             f"rows:      {len(p.inputs)} from {p.inputs.path}"
             + (" (with labels: scored)" if p.inputs.labels else ""),
             f"compute:   {s.precision} ({p.precision_from}), max {s.max_seq_len} tokens, batches "
             f"of {s.batch_size}, {p.np} process(es) x {s.threads} thread(s)",
             f"output:    {p.output or 'stdout'} ({p.fmt})"]
    return "\n".join(lines) + "\n"


def _gather(parts: list[list[tuple[int, list[float]]]], rows: int) -> list[list[float]]:
    """The processes' (row, logits) pairs in input order; every row exactly once."""
    by_row = {i: logits for part in parts for i, logits in part}
    returned = sum(len(p) for p in parts)
    if len(by_row) != rows or returned != rows:
        raise JobFailed(f"the predict processes returned {returned} predictions for {len(by_row)} "
                        f"of {rows} rows",
                        "Re-run with --np 1")
    return [by_row[i] for i in range(rows)]


def _run_processes(p: Plan, on_rows: Callable[[int], None]) -> list[list[tuple[int, list[float]]]]:
    """N worker processes, each with its share of the rows and threads; their parts in rank
    order."""
    with tempfile.TemporaryDirectory(prefix="cpudist-predict-") as tmp:
        folder = Path(tmp)
        request = folder / "request.json"
        request.write_text(json.dumps({"settings": p.settings.__dict__, "texts": p.inputs.texts}))
        env = {**os.environ, "OMP_NUM_THREADS": str(p.settings.threads),
               "TOKENIZERS_PARALLELISM": "false"}
        procs = []
        sel = selectors.DefaultSelector()
        try:
            for rank in range(p.np):
                argv = [sys.executable, "-m", programs.PREDICT_WORKER, str(request), str(rank),
                        str(p.np), str(folder / f"part-{rank}.json")]
                with open(folder / f"stderr-{rank}", "w") as err:
                    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                            env=env)
                procs.append(proc)
                assert proc.stdout is not None
                sel.register(proc.stdout, selectors.EVENT_READ)
            open_pipes = p.np
            while open_pipes:
                for key, _ in sel.select():
                    line = key.fileobj.readline()  # type: ignore[union-attr]
                    if not line:
                        sel.unregister(key.fileobj)
                        open_pipes -= 1
                    elif (event := events.parse(line)) is not None and events.kind(
                        event) == events.ROWS:
                        on_rows(int(event["rows"]))
            for rank, proc in enumerate(procs):
                if proc.wait() != 0:
                    said = (folder / f"stderr-{rank}").read_text().strip().splitlines() or [
                        "(nothing on stderr)"]
                    error = BadInput if proc.returncode == BadInput.exit_code else JobFailed
                    raise error(f"predict process {rank} of {p.np} failed (exit "
                                f"{proc.returncode}): {said[-1]}",
                                "Fix what it names; --np 1 runs in this process and shows the "
                                "whole error")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return [json.loads((folder / f"part-{rank}.json").read_text()) for rank in range(p.np)]


def execute(p: Plan, on_rows: Callable[[int], None] = lambda n: None) -> Outcome:
    """Predict every row (in this process for --np 1), write the output, score rows that have
    labels."""
    started = time.perf_counter()
    if p.np == 1:
        from cpudist.predict.infer import run_shard  # torch: only when predicting

        parts = [run_shard(p.inputs.texts, 0, 1, p.settings, on_rows)]
    else:
        parts = _run_processes(p, on_rows)
    logits = _gather(parts, len(p.inputs))
    names = p.source.label_names
    text = outputs.render(outputs.predictions(logits, names), p.inputs.ids, p.fmt, names,
                          p.inputs.task)
    if p.output is not None:
        outputs.write(text, p.output)
    metrics: dict[str, float] = {}
    if p.inputs.labels is not None:
        import numpy as np

        from cpudist.train.metrics import compute_metrics

        predicted = np.array(outputs.class_ids(logits, p.source.is_regression))
        metrics = compute_metrics(p.inputs.metrics, predicted, np.array(p.inputs.labels))
    return Outcome(len(p.inputs), p.output, None if p.output else text, metrics,
                   time.perf_counter() - started)
