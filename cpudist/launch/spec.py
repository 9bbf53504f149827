"""A launch as data: the resolved run (RunSpec), the command and variables it becomes (Launch), and
what every launcher kind shares (the rank program, the rank environment, the layout check)."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path

from cpudist.config import TrainConfig, to_argv
from cpudist.errors import BadInput
from cpudist.hostfile import Host
from cpudist.launch.batch import BatchOptions
from cpudist.launch.env import HIDDEN, SHOWN, EnvSpec, node_env, redact_pairs
from cpudist.launch.slurm import Allocation
from cpudist.secrets import file_for

LAUNCHERS = ("auto", "mpich", "impi", "openmpi", "slurm", "torchrun")
SBATCH_FILE = "job.sbatch"  # the batch script's name in the run folder


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How many ranks, where they go, and how the launcher starts them: as the user asked."""

    np: int = 1
    ppn: int = 1
    launcher: str = "auto"  # auto | mpich | impi | openmpi | slurm | torchrun
    mpirun: str | None = None  # the launcher program, when not the one found
    ssh: str | None = None  # default: the cluster key's wrapper from `hosts ssh-setup`, else ssh
    iface: str | None = None
    allocator: str = "auto"
    openmp: str = "auto"
    env: tuple[tuple[str, str], ...] = ()
    oversubscribe: bool = False
    timeout_s: float | None = None
    batch: BatchOptions | None = None
    # --secret/--env-file values: data only (cpudist/secrets.py)
    secrets: tuple[tuple[str, str], ...] = ()
    # --shared-fs: every node sees the launching node's paths; nothing is staged
    shared_fs: bool = False

    @property
    def nodes(self) -> int:
        return max(1, self.np // self.ppn)

    def shown(self) -> LaunchOptions:
        """As it may be shown or kept: --env values (but the thread counts) and secrets as ***."""
        hidden = tuple((k, HIDDEN) for k, _ in self.secrets)
        return dataclasses.replace(self, env=redact_pairs(self.env), secrets=hidden)


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One job: what to train, the launch as asked, and what was resolved of it (launcher, nodes,
    rendezvous)."""

    train: TrainConfig
    launch: LaunchOptions
    hosts: tuple[Host, ...]
    launcher: str  # resolved: mpich | impi | openmpi | slurm | torchrun
    launcher_path: str  # mpiexec.hydra / mpirun / srun; unused for torchrun
    python: str
    master_addr: str
    master_port: int
    physical_cores: int
    hub_offline: bool = False
    hostfile: str | None = None  # rendered hostfile of the nodes in use; None: this machine only
    ssh: str = "ssh"  # the ssh program the launcher uses to reach other nodes
    as_root: bool = False
    allocator: str | None = None
    iomp: str | None = None
    # the rank module and its arguments (`python -m ...`); empty: the trainer
    program: tuple[str, ...] = ()
    # the program tags each of its lines with its rank: the launcher adds none
    own_tags: bool = False
    cwd: str = "."  # where the ranks run (and relative paths resolve) on every node
    # --launcher slurm inside an allocation: srun there, not sbatch
    allocation: Allocation | None = None
    # Unix time the command started this run (None: a dry run shows no clock)
    started_at: float | None = None

    @property
    def np(self) -> int:
        return self.launch.np

    @property
    def ppn(self) -> int:
        return self.launch.ppn

    @property
    def secrets_name(self) -> str:
        """The run's name for its secrets file on every node."""
        return self.train.run_id or Path(self.train.output_dir).name


@dataclass(frozen=True)
class Launch:
    """The command to spawn and the variables every rank gets."""

    argv: tuple[str, ...]
    rank_env: dict[str, str]
    # torchrun across hosts: (host, argv) each
    per_host: tuple[tuple[str, tuple[str, ...]], ...] = ()
    script: str | None = None  # Slurm outside an allocation: the batch script that `argv` submits
    # --elastic: (head, argv) of torchft's Lighthouse; the nodes (per_host) may leave and come back
    lighthouse: tuple[str, tuple[str, ...]] | None = None

    def shell(self) -> str:
        """The command as copy-pasteable shell: one line, or one per host after a `# host` line."""
        if self.per_host:
            house = () if self.lighthouse is None else (
                f"# {self.lighthouse[0]}: the Lighthouse\n{shlex.join(self.lighthouse[1])}",)
            return "\n".join([*house, *(f"# {host}\n{shlex.join(argv)}"
                                        for host, argv in self.per_host)])
        return shlex.join(self.argv)


def check_layout(np: int, ppn: int, hosts: tuple[Host, ...], oversubscribe: bool) -> int:
    """Nodes the job needs; bad rank counts are errors that say what would fit."""
    if np < 1 or ppn < 1:
        raise BadInput(f"--np {np} --ppn {ppn}: both must be at least 1", "Pass positive counts")
    if np % ppn:
        raise BadInput(f"--np {np} is not divisible by --ppn {ppn}",
                       "Every node takes --ppn ranks: make --np a multiple of --ppn")
    nodes = np // ppn
    if nodes > len(hosts):
        raise BadInput(f"--np {np} with --ppn {ppn} needs {nodes} nodes but {len(hosts)} "
                       f"{'is' if len(hosts) == 1 else 'are'} available",
                       f"Use at most --np {ppn * len(hosts)}, raise --ppn, or add hosts "
                       "(--hostfile)")
    short = [h for h in hosts[:nodes] if h.slots is not None and h.slots < ppn]
    if short and not oversubscribe:
        h = short[0]
        raise BadInput(f"--ppn {ppn} is larger than the {h.slots} slots of {h.name}",
                       "Lower --ppn, or pass --oversubscribe to run more ranks than cores")
    return nodes


def rank_module(spec: RunSpec) -> list[str]:
    """What every rank runs after `python -m`: the trainer with its job, or another program (hosts
    bench)."""
    return list(spec.program) if spec.program else ["cpudist.rank", *to_argv(spec.train)]


def trainer_argv(spec: RunSpec) -> list[str]:
    return [spec.python, "-m", *rank_module(spec)]


def rank_env(spec: RunSpec) -> dict[str, str]:
    return node_env(_env_spec(spec, spec.launch.env))


def _env_spec(spec: RunSpec, overrides: tuple[tuple[str, str], ...]) -> EnvSpec:
    return EnvSpec(physical_cores=spec.physical_cores, ppn=spec.ppn, backend=spec.train.backend,
                   master_addr=spec.master_addr, master_port=spec.master_port,
                   hub_offline=spec.hub_offline, overrides=overrides, launcher=spec.launcher,
                   iface=spec.launch.iface, allocator=spec.allocator, iomp=spec.iomp,
                   started_at=spec.started_at,
                   secrets_file=file_for(spec.secrets_name) if file_pairs(spec) else None)


def filed_env(spec: RunSpec) -> tuple[tuple[str, str], ...]:
    """--env values that reach the ranks through the run's secrets file, exported from it by name
    before the rank program starts: a Slurm batch script's (job.sbatch outlives the run, and Slurm
    keeps a copy) and each host's torchrun line (ssh's command line, which `ps` shows on both ends
    while the run lasts). The thread counts and PYTHONPATH stay on those lines, shown."""
    batch = spec.launcher == "slurm" and spec.allocation is None
    per_host = spec.launcher == "torchrun" and spec.hostfile is not None
    if not (batch or per_host):
        return ()
    return tuple((k, v) for k, v in spec.launch.env if k not in SHOWN)


def file_pairs(spec: RunSpec) -> tuple[tuple[str, str], ...]:
    """What the run's secrets file on each node holds: --secret/--env-file values, filed_env's."""
    return spec.launch.secrets + filed_env(spec)


def inherited(spec: RunSpec) -> frozenset[str]:
    """--env variables that reach the ranks off every command line (not in `ps`): from the
    launcher's own environment (runner.execute sets it), as Hydra passes its whole environment and
    Open MPI's `-x NAME` the named ones. Variables cpudist sets itself stay on the command line,
    where the user's value must win over theirs."""
    own = node_env(_env_spec(spec, ()))
    return frozenset(k for k, _ in spec.launch.env if k not in own and k not in SHOWN)


def redacted(spec: RunSpec) -> RunSpec:
    """The spec as it may be shown (command.txt, --dry-run): --env values hidden but for the thread
    counts."""
    return dataclasses.replace(spec, launch=spec.launch.shown())
