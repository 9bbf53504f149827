"""The environment of every rank, built in one place (one line per variable, with its why)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpudist.secrets import SECRETS_ENV
from cpudist.state import STARTED_AT_ENV

# The thread counts cpudist reads (node_env, train/threads.py): checked before any rank starts, and
# not secret, so command.txt and --dry-run show them; every other --env value is shown as HIDDEN.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "CPUDIST_THREADS")
# Shown in full and kept on the launcher's command line: the thread counts, and PYTHONPATH (a path,
# not a secret: where the nodes import this machine's cpudist from when its wheel is staged, which
# command.txt must show).
SHOWN = (*THREAD_VARIABLES, "PYTHONPATH")
HIDDEN = "***"


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """What decides a node's rank environment (keywords only: fourteen fields read alike)."""

    physical_cores: int
    ppn: int
    backend: str
    master_addr: str
    master_port: int
    hub_offline: bool
    overrides: tuple[tuple[str, str], ...] = ()
    launcher: str = "mpich"
    iface: str | None = None  # network interface between nodes, when known
    allocator: str | None = None  # path of libtcmalloc/libjemalloc to preload
    iomp: str | None = None  # path of Intel's libiomp5, when installed
    # Unix time the command started this run: ranks time their start-up from it
    started_at: float | None = None
    # the node's file of --secret/--env-file values (cpudist/secrets.py)
    secrets_file: str | None = None


def threads_per_rank(physical_cores: int, ppn: int) -> int:
    """One OpenMP thread per physical core, the node's cores split evenly among its ranks."""
    return max(1, physical_cores // ppn)


# --ppn auto: threads per rank it aims for. Measured on 2 cores (benchmarks/README.md, "Levers"):
# see AUTO_PPN_WHY. Intel's advice for big nodes is 2-4 ranks per socket, i.e. about 8-16 threads
# each.
AUTO_THREADS_PER_RANK = 8
AUTO_PPN_WHY = "one rank per 8 cores, at least one"


def auto_ppn(physical_cores: int) -> int:
    """Ranks per node for --ppn auto: one per AUTO_THREADS_PER_RANK physical cores, at least one."""
    return max(1, physical_cores // AUTO_THREADS_PER_RANK)


def node_env(spec: EnvSpec) -> dict[str, str]:
    """Variables every rank on a node gets (user overrides from --env win)."""
    threads = threads_per_rank(spec.physical_cores, spec.ppn)
    pinned = dict(spec.overrides).get("OMP_NUM_THREADS")
    env = {
        # One compute thread per physical core: more threads than cores only adds contention. This
        # is the estimate from the launching machine's cores (OpenMP's pool starts at it, Intel MPI
        # sizes its pin domains by it)...
        "OMP_NUM_THREADS": str(threads),
        # ...and each rank then sizes its threads from the CPUs it may use where it runs (affinity
        # mask, cgroup quota, shared with its node's other ranks: train/threads.py); --env
        # OMP_NUM_THREADS pins it.
        "CPUDIST_THREADS": pinned or "auto",
        # Rendezvous point of torch.distributed's env:// init: rank 0's node.
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        # Rank output goes through the launcher's pipes: unbuffered keeps it live and ordered.
        "PYTHONUNBUFFERED": "1",
        # Tokenizers' own thread pool would fight the OpenMP threads (and warns after fork).
        "TOKENIZERS_PARALLELISM": "false",
    }
    if spec.started_at is not None:
        # The rank's result.json splits the time before its first step into phases
        # (cpudist/train/startup.py).
        env[STARTED_AT_ENV] = f"{spec.started_at:.3f}"
    if spec.secrets_file:
        # Where the rank reads its secrets from (a path: the values never go on a command line).
        env[SECRETS_ENV] = spec.secrets_file
    if spec.hub_offline:
        # Every source is local: fail at once instead of ~46 s of Hub retries per rank.
        env["HF_HUB_OFFLINE"] = "1"
    if spec.iface:
        # gloo would otherwise bind the address its hostname resolves to (127.0.0.1 on many images).
        env["GLOO_SOCKET_IFNAME"] = spec.iface
    if spec.launcher == "impi":
        # Intel MPI pins each rank to a domain of OMP_NUM_THREADS cores, so ranks never share cores.
        env["I_MPI_PIN_DOMAIN"] = "omp"
    preload = [p for p in (spec.allocator, spec.iomp) if p]
    if preload:
        # tcmalloc/jemalloc cut the allocator time of the many short-lived activation tensors.
        env["LD_PRELOAD"] = ":".join(preload)
    if spec.iomp:
        # Intel OpenMP: threads stay on their cores and sleep 1 ms after a parallel region.
        env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        env["KMP_BLOCKTIME"] = "1"
    if spec.backend == "ccl":
        # oneCCL: one progress thread per rank, pinned to the last core of the rank's share...
        env["CCL_WORKER_COUNT"] = "1"
        env["CCL_WORKER_AFFINITY"] = ",".join(str((r + 1) * threads - 1) for r in range(spec.ppn))
        # ...moving data over the MPI transport the launcher already set up.
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


def redact_pairs(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """--env pairs as they may be shown: values of all but the thread counts hidden (tokens,
    passwords)."""
    return tuple((k, v if k in SHOWN else HIDDEN) for k, v in pairs)


def redact_env_args(words: Sequence[str]) -> list[str]:
    """A `cpudist run` command line with its --env values hidden as in redact_pairs (for run.json,
    the card)."""
    out, after_env = [], False
    for word in words:
        prefix = "--env=" if word.startswith("--env=") else ""
        if after_env or prefix:
            key, sep, _ = word[len(prefix):].partition("=")
            if sep and key not in SHOWN:
                word = f"{prefix}{key}={HIDDEN}"
        after_env = word == "--env"
        out.append(word)
    return out
