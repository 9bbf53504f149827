"""A job from options to ledger: check inputs, plan, launch, collect the result."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cpudist.cpu import read_cpu
from cpudist.errors import BadInput
from cpudist.hostfile import Host, check_resolvable, local_hosts, read_hostfile, render_hostfile
from cpudist.launch import runner, slurm_job
from cpudist.launch.plan import Launch, RunSpec, check_layout
from cpudist.launch.slurm import SlurmOptions
from cpudist.launch.tools import free_port, is_this_machine, pick_allocator, pick_openmp, resolve_launcher
from cpudist.results.schema import RunResult
from cpudist.run.outcome import check, fetch_from_rank0, record
from cpudist.run.outcome import failed_host as failed_host  # where it lived before outcome.py
from cpudist.ssh.keys import local_cluster_dir
from cpudist.ssh.reach import check_reachable
from cpudist.train import resume
from cpudist.train.config import TrainConfig
from cpudist.train.models import is_local_model, resolve_model, tokenizer_source
from cpudist.train.preempt import MARKER

HUB_PROBE_TIMEOUT_S = 5.0


def default_output_dir(cfg: TrainConfig, np: int) -> str:
    """runs/<task>-<model>-np<N>-<time>: one folder per run, never overwritten."""
    model = Path(cfg.model).name or cfg.model.replace("/", "-")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return str(Path("runs") / f"{cfg.task}-{model}-np{np}-{stamp}")


def unfinished_run(cfg: TrainConfig) -> Path | None:
    """The newest run folder of this task and model that stopped before its result (for --resume auto)."""
    model = Path(cfg.model).name or cfg.model.replace("/", "-")
    found = [p for p in Path("runs").glob(f"{cfg.task}-{model}-np*-*")
             if not (p / "result.json").exists() and ((p / MARKER).exists() or any(p.glob("checkpoints/step-*")))]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def check_hub(what: str) -> None:
    """Fail at once, naming the local alternatives, when the Hub cannot be reached."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(f"{endpoint}/api/models/bert-base-uncased", timeout=HUB_PROBE_TIMEOUT_S)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise BadInput(f"the Hugging Face Hub is unreachable ({reason}) and {what} comes from it",
                       "Use local sources: --data-dir DIR (GLUE TSV layout) or --train-file, and "
                       "--model with a local folder or a preset (tiny, minilm-l6, bert-base, ...)") from None


def preflight(cfg: TrainConfig) -> bool:
    """Check model and data before any rank starts; True when every source is local."""
    from cpudist.train.data import load_task  # parsing only: cheap, and errors are one line

    resolve_model(cfg.model)
    if cfg.backend == "ccl" and importlib.util.find_spec("oneccl_bindings_for_pytorch") is None:
        raise BadInput("backend 'ccl' needs oneccl_bindings_for_pytorch, which is not installed",
                       "Install Intel's torch-ccl wheel matching your torch, or use --backend gloo")
    if cfg.ipex and importlib.util.find_spec("intel_extension_for_pytorch") is None:
        raise BadInput("--ipex needs intel_extension_for_pytorch, which is not installed",
                       "Install the IPEX matching your torch (its last release, 2.8, needs torch 2.8), or drop --ipex")
    data_local = cfg.task == "synthetic" or bool(cfg.data_dir or cfg.train_file or cfg.task == "custom")
    if data_local and cfg.task != "synthetic":
        load_task(cfg)
    model_local = is_local_model(cfg.model) and (
        cfg.task == "synthetic" or Path(tokenizer_source(cfg.model, cfg.tokenizer)).exists())
    if data_local and model_local:
        return True
    if os.environ.get("HF_HUB_OFFLINE") != "1":  # offline mode: the user relies on the Hub cache
        remote = [what for what, ok in (("the data", data_local), ("the model", model_local)) if not ok]
        check_hub(" and ".join(remote))
    return False


@dataclass(frozen=True)
class Placement:
    """Where ranks go and how the launcher reaches the nodes."""

    np: int
    ppn: int
    hostfile: Path | None = None
    ssh: str | None = None  # default: the cluster key's wrapper from `hosts ssh-setup`, else ssh
    oversubscribe: bool = False
    iface: str | None = None


def _cluster_hosts(where: Placement, out_dir: Path, launcher: str,
                   dry_run: bool) -> tuple[tuple[Host, ...], str | None, str]:
    """(hosts, rendered hostfile, ssh) of a job on a hostfile's nodes; a dry run writes and probes nothing."""
    assert where.hostfile is not None
    hosts = read_hostfile(where.hostfile)
    check_layout(where.np, where.ppn, hosts, where.oversubscribe)  # before any probe: the real error first
    check_resolvable(hosts)
    if not is_this_machine(hosts[0].name):
        raise BadInput(f"run cpudist on the head node: {hosts[0].name}, the first host of {where.hostfile}",
                       f"e.g. `ssh {hosts[0].name} cpudist run ...`, or pass --head ADDRESS to run from here")
    cluster_ssh = local_cluster_dir() / "ssh"
    ssh = where.ssh or (str(cluster_ssh) if cluster_ssh.is_file() else "ssh")
    used = hosts[: max(1, where.np // where.ppn)]
    rendered = out_dir / "hostfile"
    if not dry_run:
        check_reachable(used, ssh)
        out_dir.mkdir(parents=True, exist_ok=True)
        rendered.write_text(render_hostfile(used, "openmpi" if launcher == "openmpi" else "hydra", where.ppn))
    return hosts, str(rendered), ssh


def rendezvous_address(hosts: tuple[Host, ...]) -> str:
    """MASTER_ADDR: the head's name, or the head's address toward the next node when the head resolves its own
    name to loopback (Debian's `127.0.1.1 <hostname>`): its ranks listen where MASTER_ADDR leads (train/dist.py)."""
    head = hosts[0].name
    try:
        if len(hosts) < 2 or not ipaddress.ip_address(socket.gethostbyname(head)).is_loopback:
            return head
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(hosts[1].name), 9))  # UDP: picks the route, sends nothing
            return str(s.getsockname()[0])
    except OSError:
        return head


def prepare(cfg: TrainConfig, where: Placement, launcher: str, mpirun: str | None,
            env_overrides: tuple[tuple[str, str], ...], allocator: str = "auto", dry_run: bool = False,
            openmp: str = "auto", slurm: SlurmOptions | None = None) -> RunSpec:
    """A checked RunSpec: this machine as the cluster, the nodes of a hostfile, or Slurm's."""
    hub_offline = preflight(cfg)
    resume.preflight(cfg, where.np)
    cpu = read_cpu()
    in_allocation = bool(os.environ.get("SLURM_JOB_ID")) and where.hostfile is None
    name, path = resolve_launcher(launcher, mpirun, in_allocation)
    hosts, hostfile, ssh = local_hosts(cpu.logical_cpus), None, "ssh"
    master, allocation = "127.0.0.1", None
    if name == "slurm":
        slurm_job.check_options(where.hostfile)
        allocation = slurm_job.current_allocation(os.environ)
        hosts, master = slurm_job.slurm_hosts(allocation, where.np // where.ppn)
    elif where.hostfile is not None:
        hosts, hostfile, ssh = _cluster_hosts(where, Path(cfg.output_dir), name, dry_run)
        master = rendezvous_address(hosts[: max(1, where.np // where.ppn)])
    return RunSpec(train=cfg, np=where.np, ppn=where.ppn, hosts=hosts, launcher=name, launcher_path=path,
                   python=sys.executable, master_addr=master, master_port=free_port(),
                   physical_cores=cpu.physical_cores, hub_offline=hub_offline, env_overrides=env_overrides,
                   oversubscribe=where.oversubscribe, hostfile=hostfile, ssh=ssh, as_root=os.geteuid() == 0,
                   iface=where.iface, allocator=pick_allocator(allocator),
                   iomp=pick_openmp(openmp), cwd=os.getcwd(), slurm=slurm if name == "slurm" else None,
                   allocation=allocation)


@dataclass(frozen=True)
class Callbacks:
    """Where a running job reports: events (progress) and rank output lines."""

    on_event: Callable[[dict[str, Any]], None]
    on_line: Callable[[str], None]


def run_job(spec: RunSpec, launch: Launch, ledger_path: Path, cb: Callbacks,
            timeout_s: float | None, extra: dict[str, Any] | None = None) -> RunResult:
    """Launch the ranks (or submit them to Slurm), wait, then record the result in the run folder and ledger."""
    out = Path(spec.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(launch.shell() + "\n")
    (out / MARKER).unlink(missing_ok=True)  # a stop of an earlier part, already resumed
    extra = dict(extra or {})
    if spec.allocation is not None:
        extra["slurm_job_id"] = spec.allocation.job_id
    with (out / "ranks.log").open("w") as log:  # every rank line, also when a run elsewhere fetches it

        def to_log(line: str) -> None:
            log.write(line + "\n")
            log.flush()

        def on_line(line: str) -> None:
            to_log(line)
            cb.on_line(line)

        if launch.script is not None:
            slurm_outcome = slurm_job.submit_and_follow(launch, out, cb.on_event, on_line, cb.on_line, timeout_s)
            extra["slurm_job_id"] = slurm_outcome.info.job_id
            outcome = runner.Outcome(0 if slurm_outcome.info.state == "COMPLETED" else 1, slurm_outcome.timed_out,
                                     slurm_outcome.last_lines)
        elif launch.per_host:
            outcome = runner.execute_hosts(launch, os.environ, cb.on_event, on_line, timeout_s, to_log)
        else:
            outcome = runner.execute(launch, os.environ, cb.on_event, on_line, timeout_s)
    slurm_info = slurm_outcome.info if launch.script is not None else None
    check(outcome, out, timeout_s, "torchrun" if launch.per_host else "launcher", slurm_info)
    if launch.per_host:
        fetch_from_rank0(out, spec.hosts, spec.ssh)
    return record(spec, out, ledger_path, extra)
