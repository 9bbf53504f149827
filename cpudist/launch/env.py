"""The environment of every rank, built in one place (one line per variable, with its why)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvSpec:
    """What decides a node's rank environment."""

    physical_cores: int
    ppn: int
    backend: str
    master_addr: str
    master_port: int
    hub_offline: bool
    overrides: tuple[tuple[str, str], ...] = ()


def threads_per_rank(physical_cores: int, ppn: int) -> int:
    """One OpenMP thread per physical core, the node's cores split evenly among its ranks."""
    return max(1, physical_cores // ppn)


def node_env(spec: EnvSpec) -> dict[str, str]:
    """Variables every rank on a node gets (user overrides from --env win)."""
    env = {
        # One compute thread per physical core: more threads than cores only adds contention.
        "OMP_NUM_THREADS": str(threads_per_rank(spec.physical_cores, spec.ppn)),
        # Rendezvous point of torch.distributed's env:// init: rank 0's node.
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        # Rank output goes through the launcher's pipes: unbuffered keeps it live and ordered.
        "PYTHONUNBUFFERED": "1",
        # Tokenizers' own thread pool would fight the OpenMP threads (and warns after fork).
        "TOKENIZERS_PARALLELISM": "false",
    }
    if spec.hub_offline:
        # Every source is local: fail at once instead of ~46 s of Hub retries per rank.
        env["HF_HUB_OFFLINE"] = "1"
    if spec.backend == "ccl":
        # oneCCL: one worker thread for communication, over the MPI transport the launcher set up.
        env["CCL_WORKER_COUNT"] = "1"
        env["CCL_ATL_TRANSPORT"] = "mpi"
    env.update(dict(spec.overrides))
    return env


def parse_env_pairs(pairs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`K=V` strings from --env as pairs; a pair without `=` is an error the caller reports."""
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "").isalnum():
            raise ValueError(pair)
        out.append((key, value))
    return tuple(out)


def merged(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The launcher process's environment: ours plus the rank variables."""
    return {**base, **extra}
