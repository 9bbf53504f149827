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

from cpudist.cli.progress import JobView
from cpudist.cli.slurm_options import slurm_options, to_slurm_options
from cpudist.cpu import read_cpu
from cpudist.errors import BadInput, Preempted
from cpudist.hosts.hostfile import render_hostfile
from cpudist.interrupts import signals_interrupt
from cpudist.launch.env import AUTO_PPN_WHY, auto_ppn, parse_env_pairs, threads_per_rank
from cpudist.launch.job import (
    OPENMP_AUTO,
    Callbacks,
    Placement,
    default_output_dir,
    prepare,
    run_job,
    unfinished_run,
)
from cpudist.launch.plan import LAUNCHERS, SBATCH_FILE, check_layout, plan
from cpudist.remote.agent import JobRequest
from cpudist.remote.session import Head, local_inputs, run_remote
from cpudist.remote.targets import cluster_target, onprem_head, recover_cluster
from cpudist.results.ledger import default_ledger
from cpudist.results.schema import RunResult
from cpudist.traffic import STRATEGIES, parse_compression
from cpudist.train.config import BACKENDS, LR_SCALINGS, MOMENTS, OPTIMIZERS, PRECISIONS, SAMPLERS, TrainConfig
from cpudist.train.durable import parse_s3_url
from cpudist.train.tasks import normalize_task
from cpudist.validate import check_imds


class _Ppn(click.ParamType):
    """A positive rank count, or `auto`."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if value == "auto" or (isinstance(value, int) and value >= 1):
            return value
        if isinstance(value, str) and value.isdigit() and int(value) >= 1:
            return int(value)
        self.fail(f"{value!r} is neither a positive count nor auto", param, ctx)


PPN = _Ppn()


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


def _task(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return normalize_task(value)


def _env(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    try:
        return parse_env_pairs(value)
    except ValueError as e:
        raise BadInput(f"--env {e} is not of the form KEY=VALUE", "Write it as --env NAME=value") from None


def _s3(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        parse_s3_url(value)
    return value


def _imds(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return check_imds(value)


def _compression(ctx: click.Context, param: click.Parameter, value: str) -> str:
    parse_compression(value)
    return value


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


@click.command()
@click.argument("task", callback=_task)
@click.option("--np", "np_", type=click.IntRange(min=1), default=1, show_default=True, help="Ranks in all.")
@click.option("--ppn", type=PPN, help="Ranks per node [default: --np, on this machine]; auto: ranks and threads "
              "per rank from this node's cores (" + AUTO_PPN_WHY + ").")
@click.option("--nodes", type=click.IntRange(min=1), help="Nodes to use: --np becomes nodes x --ppn.")
@click.option("--hostfile", type=click.Path(path_type=Path),
              help="Nodes to run on, head first (run from the head) [default: this machine].")
@click.option("--cluster", "cluster_name", help="A cluster from `cpudist cluster up`: its nodes and price; "
              "run from anywhere (inputs are staged on the nodes, results come back here).")
@click.option("--head", "head_addr", help="With --hostfile, from outside the cluster: the address this machine "
              "reaches the head (first host) by.")
@click.option("--user", help="With --head: login name on the head [default: yours].")
@click.option("--identity", type=click.Path(exists=True, dir_okay=False),
              help="With --head: private key that logs in to the head [default: the ssh-setup cluster key].")
@click.option("--remote-python", help="Python with cpudist on the nodes [default: /opt/cpudist/bin/python, "
              "python3.11, python3].")
@click.option("--stage-code", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Send a wheel of this cpudist to the nodes: when theirs differs (auto), always, or never.")
@click.option("--launcher", "--mpi", "launcher", type=click.Choice(LAUNCHERS), default="auto", show_default=True,
              help="auto: srun inside a Slurm allocation, else the MPI of --mpirun, else MPICH's Hydra when "
              "installed, else torchrun. slurm: sbatch from a login node (srun inside an allocation); torchrun "
              "with --hostfile: one torchrun per host over SSH.")
@slurm_options
@click.option("--mpirun", type=click.Path(dir_okay=False), help="The launcher program (mpiexec.hydra or mpirun).")
@click.option("--ssh", help="ssh program for the launcher [default: ~/.cpudist/cluster/ssh from ssh-setup].")
@click.option("--iface", help="Network interface between nodes (sets GLOO_SOCKET_IFNAME).")
@click.option("--allocator", type=click.Choice(["auto", "tcmalloc", "jemalloc", "none"]), default="auto",
              show_default=True, help="Preloaded memory allocator (auto: tcmalloc when installed).")
@click.option("--model", default="bert-base-uncased", show_default=True,
              help="Preset (tiny, minilm-l6, bert-base, distilbert-base, bert-large), local folder or Hub id.")
@click.option("--tokenizer", help="Tokenizer source, when not the model's.")
@click.option("--data-dir", type=click.Path(path_type=Path), help="GLUE task folder (TSV layout).")
@click.option("--train-file", type=click.Path(path_type=Path), help="Custom data: csv, tsv, txt (;), json, jsonl.")
@click.option("--validation-file", type=click.Path(path_type=Path))
@click.option("--text-columns", help="Custom data: 1 or 2 columns, comma-separated [default: text].")
@click.option("--label-column", help="Custom data: the label column [default: label].")
@click.option("--max-seq-len", type=click.IntRange(8, 8192), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True, help="Per rank.")
@click.option("--eval-batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), help="Stop after this many optimizer steps.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True, max=10), default=2e-5, show_default=True)
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.01, show_default=True)
@click.option("--warmup-ratio", type=click.FloatRange(0, 1), default=0.1, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=42, show_default=True)
@click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
              help="auto: bf16 autocast where the CPU has native bf16, else fp32.")
@click.option("--backend", type=click.Choice(BACKENDS), default="gloo", show_default=True)
@click.option("--sampler", type=click.Choice(SAMPLERS), default="grouped", show_default=True,
              help="grouped: length-grouped global batches (less padding); random: DistributedSampler.")
@click.option("--dropout", type=click.FloatRange(0, 1, max_open=True),
              help="Override the model's dropout (0 turns it off).")
@click.option("--max-train-samples", type=click.IntRange(min=1))
@click.option("--max-eval-samples", type=click.IntRange(min=1))
@click.option("--synthetic-samples", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--eval/--no-eval", "do_eval", default=True, show_default=True)
@click.option("--log-every", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--dist-timeout", type=click.IntRange(min=1), default=300, show_default=True,
              help="Seconds before a missing peer fails the job.")
@click.option("--max-grad-norm", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Clip the gradient norm (as HF Trainer does); 0 turns clipping off.")
@click.option("--checkpoint-every", type=click.IntRange(min=1), help="Write a checkpoint every N optimizer steps.")
@click.option("--checkpoint-every-min", type=click.FloatRange(min=0, min_open=True),
              help="Write a checkpoint every N minutes.")
@click.option("--checkpoint-dir", help="Checkpoints folder on the head node [default: <run folder>/checkpoints].")
@click.option("--keep-checkpoints", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--checkpoint-s3", callback=_s3,
              help="s3://bucket/prefix: a durable copy of every checkpoint (survives the head).")
@click.option("--resume", help="auto: go on from the newest usable checkpoint of the run folder (without "
              "--output-dir: the newest unfinished run of this task and model), if any; or a checkpoint path.")
@click.option("--imds-endpoint", "imds", default="auto", show_default=True, callback=_imds,
              help="Instance metadata service polled for spot interruption notices: auto (AWS's, on EC2 "
              "only), off, or a URL.")
@click.option("--on-preemption", type=click.Choice(["stop", "resume"]), default="stop", show_default=True,
              help="With --cluster: when a node is reclaimed, stop (and say how to resume) or replace it with "
              "`cluster up` and resume from the checkpoint.")
@click.option("--freeze-embeddings", is_flag=True,
              help="Do not train the word-embedding table (half of MiniLM's gradient bytes and AdamW work).")
@click.option("--compile", is_flag=True, help="torch.compile the model (batches padded to multiples of 32 "
              "tokens; kernels cached in ~/.cpudist/inductor across runs).")
@click.option("--fast-dropout/--torch-dropout", default=True, show_default=True,
              help="Dropout masks at a quarter of torch's RNG cost (same p and seeding; 1.2x a MiniLM step on AMX), "
              "or torch's own.")
@click.option("--ipex", is_flag=True, help="Apply Intel Extension for PyTorch's optimize() (needs its matching "
              "torch; archived upstream in 2026).")
@click.option("--openmp", type=click.Choice(["auto", "intel", "gnu"]), default="auto", show_default=True,
              help="OpenMP runtime of the ranks: Intel's libiomp5 (pip install intel-openmp) with KMP_AFFINITY/"
              "KMP_BLOCKTIME, or torch's own GNU one (auto: " + OPENMP_AUTO + ", the faster one measured here).")
@click.option("--sync", type=click.Choice(STRATEGIES), default="ddp", show_default=True,
              help="How ranks agree: ddp (buckets all-reduced during backward), allreduce (one flattened all-reduce "
              "after backward), gather-scatter (through rank 0), local-sgd (average parameters every --sync-every).")
@click.option("--bucket-cap-mb", type=click.FloatRange(min=0, min_open=True), default=25.0, show_default=True,
              help="Size of DDP's gradient buckets and of local SGD's averaging buckets.")
@click.option("--grad-compression", default="none", show_default=True, callback=_compression,
              help="ddp: none, bf16, fp16 or powersgd[:RANK] (DDP communication hooks); local-sgd: none or bf16 "
              "(the averages cross the wire as bf16 changes since the last one).")
@click.option("--sync-every", type=click.IntRange(min=1), default=8, show_default=True,
              help="local-sgd: optimizer steps between parameter averages (K).")
@click.option("--local-sgd-warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="local-sgd: synchronous (gradient-averaging) steps before the first local one.")
@click.option("--outer-optimizer", type=click.Choice(["none", "nesterov"]), default="none", show_default=True,
              help="local-sgd: nesterov applies the averaged change with an outer Nesterov SGD (DiLoCo).")
@click.option("--outer-lr", type=click.FloatRange(min=0, min_open=True), default=0.7, show_default=True)
@click.option("--outer-momentum", type=click.FloatRange(0, 1, max_open=True), default=0.9, show_default=True)
@click.option("--average-moments", type=click.Choice(MOMENTS), default="none", show_default=True,
              help="local-sgd: also average AdamW's first moment, its second, or both at each average.")
@click.option("--second-moment-every", type=click.IntRange(min=1), default=1, show_default=True,
              help="local-sgd with --average-moments second|both: average the second moment at every J-th "
              "average only (fewer bytes; J=2 lost 11 accuracy points on MRPC in benchmarks/README.md).")
@click.option("--lr-scaling", type=click.Choice(LR_SCALINGS), default="none", show_default=True,
              help="Scale --lr (given for one rank's batch) with the global batch: linear (x ranks, Goyal et al.) "
              "or sqrt (x sqrt(ranks)). Local SGD too: averaging the ranks' steps moves the model by their mean, "
              "as one step on the global batch does.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True,
              help="adamw (as HF Trainer), or sgd: plain SGD, linear in the gradient (for teaching and checks).")
@click.option("--output-dir", type=click.Path(path_type=Path), help="Run folder [default: runs/<task>-...].")
@click.option("--ledger", type=click.Path(path_type=Path), help="Results ledger [default: ~/.cpudist/results.jsonl].")
@click.option("--env", "env_pairs", multiple=True, callback=_env, help="Extra rank variable KEY=VALUE (repeatable).")
@click.option("--oversubscribe", is_flag=True, help="Allow more ranks per node than its cores.")
@click.option("--timeout", type=click.FloatRange(min=1), help="Stop the job after this many seconds.")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def run(task: str, np_: int, ppn: int | str | None, nodes: int | None, hostfile: Path | None,
        cluster_name: str | None, head_addr: str | None,
        user: str | None, identity: str | None, remote_python: str | None, stage_code: str, launcher: str,
        partition: str | None, time_limit: str | None, account: str | None, exclusive: bool,
        sbatch_args: tuple[str, ...],
        mpirun: str | None, ssh: str | None, iface: str | None, allocator: str, openmp: str,
        env_pairs: tuple[tuple[str, str], ...], oversubscribe: bool, timeout: float | None, dry_run: bool,
        as_json: bool, quiet: bool,
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
                        oversubscribe, timeout, dry_run, as_json, quiet, ledger, extra, recovery)
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
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else summary(result))


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
        click.echo("# on the head: python -m cpudist.remote.agent, with this request on stdin")
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
