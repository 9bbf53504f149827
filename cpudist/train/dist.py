"""Rank discovery from whichever launcher started us, and process-group set-up."""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

from cpudist.errors import BadInput
from cpudist.slurm_counts import expand_counts
from cpudist.train.netcount import iface_toward

# (rank, size, local rank, local size) variables, most specific launcher first: torchrun sets
# RANK even under Slurm, and Hydra sets PMI_* even inside an sbatch allocation.
RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),  # torchrun
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # Intel MPI, MPICH Hydra
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),  # srun
)


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    source: str  # the variable the rank came from, for error messages


# srun's per-node task counts, the step's first (srun sets all three; sbatch's own may differ from a
# step's).
SLURM_TASK_COUNTS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")


def slurm_local_size(env: Mapping[str, str], size: int) -> int:
    """Ranks on this node under srun: this node's entry (SLURM_NODEID) of a count list such as
    `2(x3),1`."""
    for var in SLURM_TASK_COUNTS:
        if env.get(var):
            try:
                counts = expand_counts(env[var])
            except ValueError:
                raise BadInput(f"{var}={env[var]} is not a Slurm task count",
                               "Check the launcher's environment") from None
            return counts[min(int(env.get("SLURM_NODEID", "0")), len(counts) - 1)]
    return size


def discover_rank(env: Mapping[str, str]) -> RankInfo:
    """Rank and world size from the launcher's environment; a lone process is rank 0 of 1."""
    for rank_var, size_var, local_var, local_size_var in RANK_VARIABLES:
        if rank_var in env and size_var in env:
            rank, size = int(env[rank_var]), int(env[size_var])
            local = int(env.get(local_var, rank))
            local_size = (slurm_local_size(env, size) if rank_var == "SLURM_PROCID"
                          else int(env.get(local_size_var, str(size))))
            if not 0 <= rank < size:
                raise BadInput(f"{rank_var}={rank} is outside a world of {size}",
                               "Check the launcher's environment")
            return RankInfo(rank, size, local, local_size, rank_var)
    return RankInfo(0, 1, 0, 1, "default")


def init_distributed(info: RankInfo, backend: str, env: Mapping[str, str], timeout_s: int) -> None:
    """Join the process group; a missing peer fails after `timeout_s` instead of hanging."""
    import torch.distributed as dist

    if backend == "ccl":
        try:
            importlib.import_module("oneccl_bindings_for_pytorch")
        except ImportError:
            raise BadInput(
                "backend 'ccl' needs oneccl_bindings_for_pytorch, which is not installed",
                "Install Intel's torch-ccl wheel for your torch, or use --backend gloo") from None
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in env:
            raise BadInput(f"{var} is not set for rank {info.rank}",
                           "Start ranks with `cpudist run`, or export MASTER_ADDR/MASTER_PORT")
    iface = gloo_interface(info, env) if backend == "gloo" else None
    if iface is not None:
        # torch builds gloo's device from this variable only (init_process_group takes no device).
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    dist.init_process_group(backend, init_method="env://", rank=info.rank,
                            world_size=info.world_size, timeout=timedelta(seconds=timeout_s))


def _loopback(name: str) -> str | None:
    """The loopback address `name` resolves to here (Debian's `127.0.1.1 <hostname>` line), or
    None."""
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return "nothing"  # gloo then falls back to loopback itself
    return addr if ipaddress.ip_address(addr).is_loopback else None


def gloo_interface(info: RankInfo, env: Mapping[str, str]) -> str | None:
    """The interface gloo must listen on when this node's name resolves to loopback in a job across
    nodes (gloo binds the hostname's address, which the other nodes cannot reach); None when gloo's
    choice is right."""
    if env.get("GLOO_SOCKET_IFNAME") or info.local_world_size >= info.world_size:
        return None
    host = socket.gethostname()
    own = _loopback(host)
    if own is None:
        return None
    iface = iface_toward(env)  # the interface toward the head (on the head: MASTER_ADDR's own)
    if iface is None:
        raise BadInput(f"{host} resolves its own name to {own} (/etc/hosts), so gloo would listen "
                       "where the other nodes cannot reach it",
                       "Pass --iface with the interface toward the other nodes, or map "
                       f"{host} to its network address in /etc/hosts")
    return iface


def shutdown_distributed() -> None:
    """Leave the process group, if joined, after freeing what still holds it.

    DDP's reducer sits in reference cycles, so it lives until a collection; freeing it now joins the
    group's threads here instead of in a destructor at interpreter exit, which aborted a rank now
    and then ("terminate called without an active exception", 3 of 48 two-rank runs). Callers drop
    their own references to the model first.
    """
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a rank process after shutdown_distributed, without the interpreter's finalization.

    Everything a rank owes is written and flushed by then (result.json, the model, the report
    folders, closed by their owners). What finalization would still do is destroy torch's leftover
    C++ objects, and there gloo's threads abort a rank now and then even after destroy_process_group
    ("terminate called without an active exception", exit code 6 after a run that had finished),
    which the launcher reports as a failed job. The kernel frees the rest.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
