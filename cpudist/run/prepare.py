"""Before any rank starts: the model and data checked, the launcher and nodes resolved into a
RunSpec."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from cpudist import elastic_flags as elastic
from cpudist.config import TrainConfig
from cpudist.cpu import read_cpu
from cpudist.errors import BadInput
from cpudist.hostfile import local_hosts
from cpudist.launch.env import THREAD_VARIABLES
from cpudist.launch.kinds import kind_of
from cpudist.launch.nodes import cluster_hosts, rendezvous_address
from cpudist.launch.spec import RunSpec
from cpudist.launch.tools import free_port, pick_allocator, pick_openmp, resolve_launcher
from cpudist.run.request import RunRequest
from cpudist.train import report_to, resume
from cpudist.train.models import is_local_model, resolve_model, tokenizer_source

HUB_PROBE_TIMEOUT_S = 5.0


def _nearest_existing(path: Path) -> Path:
    """The path itself, or its closest ancestor that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_folder_for(path: Path, folder: Path, option: str) -> None:
    """Refuse `path` when `folder` (or its closest existing ancestor) is not a folder this user may
    write into."""
    above = _nearest_existing(folder)
    if not above.is_dir():
        raise BadInput(f"{option} {path}: {above} is a file, not a folder",
                       f"Pass a {option} path under a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {path}: {above} is not writable",
                       f"Pass a {option} path in a folder you can write")


def make_output_dir(path: Path) -> None:
    """Create the run folder before anything is written into it; a file or an unwritable place is
    one line."""
    if path.exists() and not path.is_dir():
        raise BadInput(f"--output-dir {path} is a file",
                       "Pass a folder (new or a run folder) to --output-dir")
    _check_folder_for(path, path, "--output-dir")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--output-dir {path} cannot be created ({e.strerror})",
                       "Pass a folder you can write to --output-dir") from None


def check_ledger(path: Path) -> None:
    """Refuse, before training, a ledger the result could not be appended to."""
    if path.is_dir():
        raise BadInput(f"--ledger {path} is a folder",
                       "Pass a file (results.jsonl, new or a ledger) to --ledger")
    if path.exists() and not os.access(path, os.W_OK):
        raise BadInput(f"--ledger {path} is not writable",
                       "Pass a ledger file you can write to --ledger")
    _check_folder_for(path, path.parent, "--ledger")


def check_env(pairs: tuple[tuple[str, str], ...]) -> None:
    """Refuse a thread count from --env that every rank would refuse (a positive number, or auto for
    ours)."""
    for key, value in pairs:
        ok = ((value.strip().isdigit() and int(value) >= 1)
              or (key == "CPUDIST_THREADS" and value.strip() == "auto"))
        if key in THREAD_VARIABLES and not ok:
            raise BadInput(f"--env {key}={value}: the thread count must be a positive number",
                           f"Pass --env {key}=N with N >= 1, or leave it out (one thread per core)")


def check_hub(what: str) -> None:
    """Fail at once, naming the local alternatives, when the Hub cannot be reached."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(f"{endpoint}/api/models/bert-base-uncased",
                               timeout=HUB_PROBE_TIMEOUT_S)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise BadInput(f"the Hugging Face Hub is unreachable ({reason}) and {what} comes from it",
                       "Use local sources: --data-dir DIR (GLUE TSV layout) or --train-file, and "
                       "--model with a local folder or a preset "
                       "(tiny, minilm-l6, bert-base, ...)") from None


def preflight(cfg: TrainConfig) -> bool:
    """Check model and data before any rank starts; True when every source is local."""
    from cpudist.train.data import load_task  # parsing only: cheap, and errors are one line

    resolve_model(cfg.model)
    if cfg.backend == "ccl" and importlib.util.find_spec("oneccl_bindings_for_pytorch") is None:
        raise BadInput("backend 'ccl' needs oneccl_bindings_for_pytorch, which is not installed",
                       "Install Intel's torch-ccl wheel matching your torch, or use --backend gloo")
    if cfg.ipex and importlib.util.find_spec("intel_extension_for_pytorch") is None:
        raise BadInput("--ipex needs intel_extension_for_pytorch, which is not installed",
                       "Install the IPEX matching your torch (its last release, 2.8, needs torch "
                       "2.8), or drop --ipex")
    report_to.check_installed(cfg.report_to, cfg.mlflow_uri)
    data_local = cfg.task == "synthetic" or bool(cfg.data_dir or cfg.train_file
                                                 or cfg.task == "custom")
    if data_local and cfg.task != "synthetic":
        load_task(cfg)
    model_local = is_local_model(cfg.model) and (
        cfg.task == "synthetic" or Path(tokenizer_source(cfg.model, cfg.tokenizer)).exists())
    if data_local and model_local:
        return True
    if os.environ.get("HF_HUB_OFFLINE") != "1":  # offline mode: the user relies on the Hub cache
        remote = [what for what, ok in (("the data", data_local), ("the model", model_local))
                  if not ok]
        check_hub(" and ".join(remote))
    return False


def prepare(request: RunRequest, dry_run: bool = False) -> RunSpec:
    """A checked RunSpec: this machine as the cluster, the nodes of a hostfile, or a scheduler's."""
    cfg, opts = request.train, request.launch
    check_env(opts.env)
    elastic.check(cfg)
    hub_offline = preflight(cfg)
    resume.preflight(cfg, 1 if cfg.elastic else opts.np)  # an elastic node: a world of its own
    return resolve(request, hub_offline, dry_run)


def resolve(request: RunRequest, hub_offline: bool = False, dry_run: bool = False) -> RunSpec:
    """The launcher, nodes and rendezvous of a request, whatever its ranks run (the trainer, a
    user's script)."""
    cfg, opts = request.train, request.launch
    cpu = read_cpu()
    # --elastic starts each node's rank over ssh itself (torchrun's route), not through MPI
    asked = "torchrun" if cfg.elastic and opts.launcher == "auto" else opts.launcher
    name, path = resolve_launcher(asked, opts.mpirun, request.nodes is None)
    if cfg.elastic:
        elastic.check_launch(name, opts.ppn, request.nodes is not None)
    kind = kind_of(name)
    hosts, rendered, ssh = local_hosts(cpu.logical_cpus), None, "ssh"
    master, allocation = "127.0.0.1", None
    placed = kind.placed(request.nodes, opts.nodes)
    if placed is not None:  # a scheduler's nodes
        hosts, master, allocation = placed.hosts, placed.master, placed.allocation
    elif request.nodes is not None:
        hosts, rendered, ssh = cluster_hosts(request.nodes, (opts.np, opts.ppn, opts.oversubscribe),
                                             opts.ssh, Path(cfg.output_dir), name, dry_run)
        master = rendezvous_address(hosts[: opts.nodes])
    return RunSpec(train=cfg, launch=opts, hosts=hosts, launcher=name, launcher_path=path,
                   python=sys.executable, master_addr=master, master_port=free_port(),
                   physical_cores=cpu.physical_cores, hub_offline=hub_offline, hostfile=rendered,
                   ssh=ssh, as_root=os.geteuid() == 0, allocator=pick_allocator(opts.allocator),
                   iomp=pick_openmp(opts.openmp), cwd=os.getcwd(), allocation=allocation,
                   started_at=None if dry_run else time.time())
