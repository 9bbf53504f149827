"""`cpudist run TASK`: train on N ranks and record the result."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from cpudist.cli.options import SectionedCommand
from cpudist.cli.progress import JobView
from cpudist.cli.run_options import SECTIONS, run_options
from cpudist.cli.slurm_options import to_slurm_options
from cpudist.cpu import read_cpu
from cpudist.errors import BadInput, Preempted
from cpudist.hostfile import render_hostfile
from cpudist.interrupts import signals_interrupt
from cpudist.launch.env import auto_ppn, threads_per_rank
from cpudist.launch.plan import SBATCH_FILE, check_layout, plan
from cpudist.results.ledger import default_ledger
from cpudist.results.schema import RunResult
from cpudist.run.agent import JobRequest
from cpudist.run.prepare import (
    Callbacks,
    Placement,
    default_output_dir,
    prepare,
    run_job,
    unfinished_run,
)
from cpudist.run.remote import Head, local_inputs, run_remote
from cpudist.run.where import cluster_target, onprem_head, recover_cluster
from cpudist.train.config import TrainConfig


def _layout(np_: int, ppn: int | str | None, nodes: int | None, remote: bool) -> tuple[int, int | None]:
    """(--np, --ppn) once `--ppn auto` and `--nodes` are worked out."""
    given = click.get_current_context().get_parameter_source("np_") is not ParameterSource.DEFAULT
    if ppn == "auto":
        if remote:
            raise BadInput("--ppn auto reads the cores of the machine it runs on, and the nodes are elsewhere",
                           "Give --ppn N (ranks per node), or run from the head node")
        cores = read_cpu().physical_cores
        ppn = auto_ppn(cores)
        click.echo(f"[cpudist] --ppn auto: {ppn} rank(s) per node x {threads_per_rank(cores, ppn)} thread(s) "
                   f"({cores} physical cores)", err=True)
        if not given and nodes is None:
            nodes = 1
    if nodes is not None:
        if given and np_ != nodes * (ppn or 1):
            raise BadInput(f"--np {np_} disagrees with --nodes {nodes} x --ppn {ppn or 1}",
                           "Give --nodes with --ppn (the rank count follows), or --np alone")
        np_ = nodes * int(ppn or 1)
        ppn = int(ppn or 1)
    return np_, None if ppn is None else int(ppn)


def check_sync(cfg: TrainConfig) -> None:
    """Knobs of one strategy given with another are mistakes: say so before anything starts."""
    defaults = TrainConfig(task=cfg.task, output_dir="")
    local_only = ("sync_every", "local_sgd_warmup", "outer_optimizer", "outer_lr", "outer_momentum",
                  "average_moments", "second_moment_every")
    given = [k for k in local_only if getattr(cfg, k) != getattr(defaults, k)]
    if cfg.sync != "local-sgd" and given:
        flag = "--" + given[0].replace("_", "-")
        raise BadInput(f"{flag} applies to --sync local-sgd, not {cfg.sync}",
                       f"Add --sync local-sgd, or drop {flag}")
    if cfg.sync == "local-sgd" and cfg.grad_compression not in ("none", "bf16"):
        raise BadInput(f"--grad-compression {cfg.grad_compression}: local SGD averages in fp32 (none) or bf16",
                       "Use --grad-compression bf16 with --sync local-sgd, or --sync ddp for PowerSGD")
    if cfg.second_moment_every > 1 and cfg.average_moments not in ("second", "both"):
        raise BadInput(f"--second-moment-every {cfg.second_moment_every}: the second moment is not averaged "
                       f"(--average-moments {cfg.average_moments})",
                       "Add --average-moments both (or second), or drop --second-moment-every")
    if cfg.sync not in ("ddp", "local-sgd") and cfg.grad_compression != "none":
        raise BadInput(f"--grad-compression applies to --sync ddp and local-sgd, not {cfg.sync}",
                       "Use --sync ddp (or local-sgd) with it, or drop --grad-compression")


def summary(r: RunResult) -> str:
    """The final line: time, throughput and metrics."""
    metrics = " ".join(f"{k}={v:.4f}" for k, v in r.metrics.items()) or "no eval"
    return (f"done: {r.task} {r.model} on {r.world_size} rank(s), {len(r.nodes)} node(s): "
            f"train {r.train_time_s:.1f}s, {r.train_samples_per_s:.1f} samples/s, "
            f"wall {r.wall_time_s:.1f}s, {metrics}  -> {r.run_dir}/result.json")


@click.command(cls=SectionedCommand, sections=SECTIONS)
@run_options
def run(task: str, np_: int, ppn: int | str | None, nodes: int | None, hostfile: Path | None,
        cluster_name: str | None, head_addr: str | None,
        user: str | None, identity: str | None, remote_python: str | None, stage_code: str, launcher: str,
        partition: str | None, time_limit: str | None, account: str | None, exclusive: bool,
        sbatch_args: tuple[str, ...],
        mpirun: str | None, ssh: str | None, iface: str | None, allocator: str, openmp: str,
        env_pairs: tuple[tuple[str, str], ...], oversubscribe: bool, timeout: float | None, dry_run: bool,
        fmt: str, quiet: bool,
        ledger: Path | None, output_dir: Path | None, data_dir: Path | None, train_file: Path | None,
        validation_file: Path | None, text_columns: str | None, dist_timeout: int, on_preemption: str,
        **opts: object) -> None:
    """Fine-tune on TASK (a GLUE task, `custom` or `synthetic`) with --np ranks.

    Example: cpudist run mrpc --np 2 --data-dir glue/MRPC --model tiny --max-steps 5
    """
    cfg = TrainConfig(task=task, output_dir="", data_dir=str(data_dir) if data_dir else None,
                      train_file=str(train_file) if train_file else None,
                      validation_file=str(validation_file) if validation_file else None,
                      text_columns=tuple(c.strip() for c in (text_columns or "").split(",") if c.strip()),
                      dist_timeout_s=dist_timeout, **opts)  # type: ignore[arg-type]
    check_sync(cfg)
    if output_dir is None and cfg.resume == "auto":
        output_dir = unfinished_run(cfg)
        if output_dir is not None:
            click.echo(f"[cpudist] --resume auto: going on with {output_dir}", err=True)
    np_, ppn = _layout(np_, ppn, nodes, cluster_name is not None or head_addr is not None)
    cfg = TrainConfig(**{**cfg.__dict__, "output_dir": str(output_dir or default_output_dir(cfg, np_))})
    if ppn is None and (hostfile is not None or cluster_name is not None):
        raise BadInput("--hostfile/--cluster need --ppn (ranks per node)",
                       "e.g. --np 4 --ppn 1 for one rank on each of 4 nodes")
    price = None
    head = None
    if cluster_name is not None:
        head, cluster_hostfile, price = cluster_target(cluster_name, np_ // (ppn or np_), remote_python, stage_code)
        hostfile = hostfile or cluster_hostfile
    elif head_addr is not None:
        if hostfile is None:
            raise BadInput("--head needs --hostfile (the nodes as they name each other, head first)",
                           "Pass --hostfile H --head ADDRESS")
        head = onprem_head(hostfile, head_addr, user, identity, remote_python, stage_code)
    if head is not None and launcher == "slurm":
        raise BadInput("--launcher slurm runs from the cluster's login node, not through --head/--cluster",
                       "ssh to the login node and run `cpudist run ... --launcher slurm` there")
    extra: dict[str, Any] = {"cluster": cluster_name, "usd_per_hour": price}
    with signals_interrupt():
        if head is not None:
            if on_preemption == "resume" and cluster_name is None:
                raise BadInput("--on-preemption resume needs --cluster (it replaces lost nodes with `cluster up`)",
                               "Use --cluster NAME, or resume by hand with --resume auto")
            recovery = (Recovery(cluster_name, remote_python, stage_code)
                        if on_preemption == "resume" and cluster_name is not None else None)
            _run_remote(cfg, head, np_, ppn or np_, launcher, mpirun, env_pairs, (allocator, openmp), iface,
                        oversubscribe, timeout, dry_run, fmt == "json", quiet, ledger, extra, recovery)
            return
        where = Placement(np_, ppn or np_, hostfile, ssh, oversubscribe, iface)
        spec = prepare(cfg, where, launcher, mpirun, env_pairs, allocator, dry_run, openmp,
                       to_slurm_options(partition, time_limit, account, exclusive, sbatch_args))
        launch = plan(spec)
        if dry_run and launch.script is not None:
            click.echo(f"# {Path(cfg.output_dir) / SBATCH_FILE} (written and submitted with `{launch.shell()}`)")
            click.echo(launch.script, nl=False)
            return
        if dry_run:
            click.echo("# environment of every rank")
            for key, value in launch.rank_env.items():
                click.echo(f"export {key}={value}")
            if spec.hostfile and not launch.per_host:  # torchrun across hosts runs one command per host instead
                click.echo(f"# hostfile {spec.hostfile} (written when the run starts)")
                used = spec.hosts[: np_ // spec.ppn]
                click.echo(render_hostfile(used, "openmpi" if spec.launcher == "openmpi" else "hydra", spec.ppn),
                           nl=False)
            click.echo("# command")
            click.echo(launch.shell())
            return
        _batch_note(cfg, np_, quiet)
        view = JobView(quiet=quiet)
        try:
            result = run_job(spec, launch, ledger or default_ledger(), Callbacks(view.on_event, view.on_line),
                             timeout, extra)
        finally:
            view.close()
    click.echo(json.dumps(result.to_dict(), indent=2) if fmt == "json" else summary(result))


def _batch_note(cfg: TrainConfig, np_: int, quiet: bool) -> None:
    """Say once, before a multi-rank run, that the global batch grew and the learning rate did not."""
    if np_ > 1 and cfg.lr_scaling == "none" and cfg.task != "synthetic" and not quiet:
        batch = cfg.batch_size * cfg.grad_accum
        click.echo(f"[cpudist] {np_} ranks x batch {batch} = global batch {np_ * batch}: 1/{np_} of one rank's "
                   f"optimizer steps per epoch at the same --lr {cfg.lr:g}. At 4 ranks on MRPC that cost accuracy "
                   "unless the lr grew with the batch: see --lr-scaling", err=True)


def _run_remote(cfg: TrainConfig, head: Head, np_: int, ppn: int, launcher: str, mpirun: str | None,
                env_pairs: tuple[tuple[str, str], ...], runtime: tuple[str, str], iface: str | None,
                oversubscribe: bool,
                timeout: float | None, dry_run: bool, as_json: bool, quiet: bool, ledger: Path | None,
                extra: dict[str, Any], recovery: Recovery | None) -> None:
    """Stage, launch on the head, follow, fetch: this machine is outside the cluster."""
    check_layout(np_, ppn, head.inside, oversubscribe)
    request = JobRequest(cfg, np_, ppn, "", launcher, mpirun, env_pairs, runtime[0], iface, oversubscribe, timeout,
                         runtime[1])
    if dry_run:
        click.echo(f"# from this machine: ssh {head.target.user or ''}{'@' if head.target.user else ''}"
                   f"{head.target.host} (port {head.target.port}, host keys pinned in {head.known_hosts})")
        for name, what, path in local_inputs(cfg):
            click.echo(f"# stage {what} ({name}) {path} -> ~/.cpudist/stage/<sha256>/ on the head, then on "
                       f"{', '.join(h.name for h in head.inside[1: np_ // ppn]) or 'no other node'}")
        click.echo(f"# nodes (as they reach each other): {' '.join(h.name for h in head.inside[: np_ // ppn])}")
        click.echo("# on the head: python -m cpudist.run.agent, with this request on stdin")
        click.echo(request.to_json())
        return
    _batch_note(cfg, np_, quiet)
    lost: list[float] = []
    while True:
        view = JobView(quiet=quiet)
        try:
            result = run_remote(cfg, request, head, Path(cfg.output_dir), ledger or default_ledger(),
                                Callbacks(view.on_event, view.on_line), {**extra, "recoveries": len(lost),
                                                                         "time_lost_s": round(sum(lost), 1)},
                                view.on_line)
            break
        except Preempted as e:
            if recovery is None:
                raise
            if len(lost) >= MAX_RECOVERIES:
                raise Preempted(f"{e.message}; gave up after {MAX_RECOVERIES} recoveries") from None
            stopped = time.monotonic()
            view.on_line(f"[cpudist] {e.what}: recovering ({len(lost) + 1}/{MAX_RECOVERIES})")
            head = recover_cluster(recovery.cluster, np_ // ppn, recovery.python, recovery.stage_code,
                                   RECLAIM_WAIT_S, view.on_line)
            cfg = dataclasses.replace(cfg, resume="auto")
            request = dataclasses.replace(request, train=cfg)
            lost.append(time.monotonic() - stopped)
        finally:
            view.close()
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else summary(result))


MAX_RECOVERIES = 3
RECLAIM_WAIT_S = 150.0  # AWS gives two minutes' notice before it reclaims a spot instance


@dataclass(frozen=True)
class Recovery:
    """How `--on-preemption resume` gets the cluster back: `cluster up` on its record."""

    cluster: str
    python: str | None
    stage_code: str
