"""`cpudist run TASK`: options -> a request and where it goes -> run.start -> the result line."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from cpudist import state
from cpudist.cli.hf_options import with_hf_defaults
from cpudist.cli.launch_options import to_launch, to_route
from cpudist.cli.options import SectionedCommand
from cpudist.cli.overwrite_option import overwrite_option
from cpudist.cli.progress import JobView
from cpudist.cli.run_options import run_options
from cpudist.cli.run_sections import SECTIONS
from cpudist.config import TrainConfig, check_save
from cpudist.cpu import read_cpu
from cpudist.errors import BadInput, Interrupted, JobFailed, Preempted
from cpudist.interrupts import signals_interrupt
from cpudist.launch.env import redact_env_args
from cpudist.launch.kinds import batch_of, scheduled
from cpudist.launch.tools import in_allocation
from cpudist.results.schema import RunResult
from cpudist.run.request import (
    Callbacks,
    Layout,
    RunRequest,
    default_output_dir,
    resolve_layout,
    unfinished_run,
)
from cpudist.sync_flags import asked, check_sync
from cpudist.train import lora
from cpudist.wire import names

if TYPE_CHECKING:
    from cpudist.run.where import Where

def summary(r: RunResult) -> str:
    """The final line: time, throughput and metrics."""
    metrics = " ".join(f"{k}={v:.4f}" for k, v in r.metrics.items()) or "no eval"
    if r.early_stopping:  # why the run is shorter than asked, where a user looks first
        early = r.early_stopping
        metrics += f"; stopped early at step {early['step']}: {early['reason']}"
    return (f"done: {r.task} {r.model} on {r.world_size} rank(s), {len(r.nodes)} node(s): "
            f"train {r.train_time_s:.1f}s, {r.train_samples_per_s:.1f} samples/s, "
            f"wall {r.wall_time_s:.1f}s, {metrics}  -> {r.run_dir}/{names.RESULT}"
            + (f", model {r.model_dir}" if r.model_dir else "")
            + (f" and {r.model_s3['url']}" if r.model_s3.get("url") and "error" not in r.model_s3
               else ""))


def _train_config(opts: dict[str, Any]) -> TrainConfig:
    """The TrainConfig in run's options (the rest feed the launch, the route and the output)."""
    names = {f.name for f in fields(TrainConfig)} - {"sync"}
    given: dict[str, Any] = {k: v for k, v in opts.items() if k in names}
    given["sync"] = asked(opts)
    for key in ("data_dir", "train_file", "validation_file"):
        given[key] = str(given[key]) if given.get(key) else None
    given["text_columns"] = tuple(c.strip() for c in (opts["text_columns"] or "").split(",")
                                  if c.strip())
    return TrainConfig(**{**given, "output_dir": "", "dist_timeout_s": opts["dist_timeout"]})


def _check_detach(where: Where, launcher: str) -> None:
    """--detach's rules: a run from outside the cluster or a scheduler's batch job, without
    --on-preemption resume."""
    if where.head is None and scheduled(launcher) and not in_allocation():
        # a batch job runs on by itself (run/life/batch_detach.py); inside an allocation it is this
        # process
        return
    if where.head is None:
        raise BadInput("--detach is for runs on a cluster from outside it (--cluster or --head): a "
                       "run here or from "
                       "a hostfile is this process", "Start it under nohup, tmux or screen instead")
    if where.recover:
        raise BadInput("--detach and --on-preemption resume do not go together (the laptop "
                       "replaces lost nodes)",
                       "Drop one of them")


def say(line: str) -> None:
    click.echo(f"[cpudist] {line}", err=True)


@click.command(cls=SectionedCommand, sections=SECTIONS)
@run_options
@overwrite_option
@click.pass_context
def run(ctx: click.Context, **opts: Any) -> None:
    """Fine-tune on TASK (a GLUE task, `custom` or `synthetic`) with --np ranks.

    Example: cpudist run mrpc --np 2 --data-dir glue/MRPC --model tiny --max-steps 5
    """
    # torch, paramiko, boto3 behind it: not for --help
    from cpudist.run.start import describe, start
    from cpudist.run.where import where_for

    cfg = with_hf_defaults(_train_config(opts), ctx, say)
    check_sync(cfg.sync)
    check_save(cfg)
    lora.check(cfg)
    route = to_route(opts)
    output_dir = opts["output_dir"]
    if output_dir is None and cfg.resume == "auto":
        output_dir = unfinished_run(cfg)
        if output_dir is not None:
            say(f"--resume auto: going on with {output_dir}")
    given = Layout(opts["np_"], opts["ppn"], opts["nodes"],
                   ctx.get_parameter_source("np_") is not ParameterSource.DEFAULT)
    remote = route.cluster is not None or route.head_addr is not None
    np_, ppn = resolve_layout(given, remote, lambda: read_cpu().physical_cores, say)
    cfg = TrainConfig(**{**cfg.__dict__,
                         "output_dir": str(output_dir or default_output_dir(cfg, np_))})
    launch = to_launch(opts, np_, ppn or np_)
    where = where_for(route, launch.nodes, ppn is not None, launch.launcher)
    if where.head is not None and opts["fetch_model"] == "no":
        where = dataclasses.replace(where, head=dataclasses.replace(where.head, fetch_model=False))
    if opts["detach"]:
        _check_detach(where, launch.launcher)
        where = dataclasses.replace(where, detach=True)
    request = RunRequest(train=cfg, launch=launch, nodes=where.nodes,
                         # run.json, card
                         command=shlex.join(["cpudist", *redact_env_args(sys.argv[1:])]),
                         overwrite=opts["overwrite_output_dir"])
    with signals_interrupt():
        if opts["dry_run"]:
            click.echo(describe(request, where), nl=False)
            return
        view = JobView(quiet=opts["quiet"])
        cb = Callbacks(view.on_event, view.on_line, (lambda line: None) if opts["quiet"] else say)
        try:
            result = start(request, where, opts["ledger"] or state.ledger_path(), cb)
        except (Interrupted, Preempted):
            raise
        except JobFailed:
            view.show_held()  # --quiet: the rank lines the error points at
            raise
        finally:
            view.close()
    if result is None:  # --detach
        from cpudist.run.life.identity import read_run

        info = read_run(Path(request.train.output_dir))
        run_id = info.id if info is not None else request.train.output_dir
        goes_on = (f"as a {batch_of(info.where).label} batch job" if info is not None
                   and scheduled(info.where)
                   else "on its head")
        click.echo(f"detached: run {run_id} goes on {goes_on}; follow it (and bring its result "
                   f"home): cpudist logs -f {run_id}; stop it: cpudist stop {run_id}")
        return
    click.echo(json.dumps(result.to_dict(), indent=2) if opts["fmt"] == "json" else summary(result))
