"""From a RunSpec to the launcher's argv and the ranks' environment: pure data, no spawning."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.hostfile import Host
from cpudist.launch import slurm, torchrun
from cpudist.launch.env import EnvSpec, node_env
from cpudist.launch.slurm import Allocation, SlurmOptions
from cpudist.train.config import TrainConfig, to_argv

LAUNCHERS = ("auto", "mpich", "impi", "openmpi", "slurm", "torchrun")


@dataclass(frozen=True)
class RunSpec:
    """One job: what to train, on how many ranks, where, with which launcher."""

    train: TrainConfig
    np: int
    ppn: int
    hosts: tuple[Host, ...]
    launcher: str  # resolved: mpich | impi | openmpi | slurm | torchrun
    launcher_path: str  # mpiexec.hydra / mpirun / srun; unused for torchrun
    python: str
    master_addr: str
    master_port: int
    physical_cores: int
    hub_offline: bool = False
    env_overrides: tuple[tuple[str, str], ...] = ()
    oversubscribe: bool = False
    hostfile: str | None = None  # rendered hostfile of the nodes in use; None: this machine only
    ssh: str = "ssh"  # the ssh program the launcher uses to reach other nodes
    as_root: bool = False
    iface: str | None = None
    allocator: str | None = None
    iomp: str | None = None
    program: tuple[str, ...] = ()  # the rank module and its arguments (`python -m ...`); empty: the trainer
    cwd: str = "."  # where the ranks run (and relative paths resolve) on every node
    slurm: SlurmOptions | None = None  # --launcher slurm: what to ask Slurm for
    allocation: Allocation | None = None  # --launcher slurm inside an allocation: srun there, not sbatch


@dataclass(frozen=True)
class Launch:
    """The command to spawn and the variables every rank gets."""

    argv: tuple[str, ...]
    rank_env: dict[str, str]
    per_host: tuple[tuple[str, tuple[str, ...]], ...] = ()  # torchrun across hosts: (host, argv) each
    script: str | None = None  # Slurm outside an allocation: the batch script that `argv` submits

    def shell(self) -> str:
        """The command as copy-pasteable shell: one line, or one per host after a `# host` line."""
        if self.per_host:
            return "\n".join(f"# {host}\n{shlex.join(argv)}" for host, argv in self.per_host)
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
                       f"Use at most --np {ppn * len(hosts)}, raise --ppn, or add hosts (--hostfile)")
    short = [h for h in hosts[:nodes] if h.slots is not None and h.slots < ppn]
    if short and not oversubscribe:
        h = short[0]
        raise BadInput(f"--ppn {ppn} is larger than the {h.slots} slots of {h.name}",
                       "Lower --ppn, or pass --oversubscribe to run more ranks than cores")
    return nodes


def rank_module(spec: RunSpec) -> list[str]:
    """What every rank runs after `python -m`: the trainer with its job, or another program (hosts bench)."""
    return list(spec.program) if spec.program else ["cpudist.train", *to_argv(spec.train)]


def trainer_argv(spec: RunSpec) -> list[str]:
    return [spec.python, "-m", *rank_module(spec)]


def rank_env(spec: RunSpec) -> dict[str, str]:
    return node_env(EnvSpec(spec.physical_cores, spec.ppn, spec.train.backend, spec.master_addr,
                            spec.master_port, spec.hub_offline, spec.env_overrides, spec.launcher,
                            spec.iface, spec.allocator, spec.iomp))


def hydra_argv(spec: RunSpec, env: dict[str, str]) -> list[str]:
    """MPICH's or Intel MPI's Hydra: `mpiexec.hydra -f H -np N -ppn P -genv K V ... python -m cpudist.train`.

    The two differ only in how they name the ssh bootstrap: -launcher (MPICH), -bootstrap (Intel).
    """
    argv = [spec.launcher_path]
    if spec.hostfile:
        flag = "-bootstrap" if spec.launcher == "impi" else "-launcher"
        argv += [flag, "ssh", f"{flag}-exec", spec.ssh, "-f", spec.hostfile]
    argv += ["-np", str(spec.np), "-ppn", str(spec.ppn), "-prepend-pattern", "[%h:%r] "]
    for key, value in env.items():
        argv += ["-genv", key, value]
    return argv + trainer_argv(spec)


def openmpi_argv(spec: RunSpec, env: dict[str, str]) -> list[str]:
    """Open MPI: `--map-by ppr:P:node` places P ranks per node (else it fills each host's cores)."""
    argv = [spec.launcher_path]
    if spec.as_root:
        argv.append("--allow-run-as-root")  # Open MPI refuses root unless told; only then
    argv += ["-np", str(spec.np), "--map-by", f"ppr:{spec.ppn}:node", "--output", "tag-detailed"]
    if spec.oversubscribe:
        argv += ["--oversubscribe"]
    if spec.hostfile:
        argv += ["--hostfile", spec.hostfile, "--prtemca", "plm_ssh_agent", spec.ssh]
    for key, value in env.items():
        argv += ["-x", f"{key}={value}"]
    return argv + trainer_argv(spec)


def torchrun_argv(spec: RunSpec) -> list[str]:
    """torchrun on this machine: one agent spawning --ppn ranks (env comes from the parent)."""
    return [spec.python, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(spec.ppn), "--master-addr", spec.master_addr,
            "--master-port", str(spec.master_port), "--tee", "3", "-m", *rank_module(spec)]


SBATCH_FILE = "job.sbatch"  # the batch script's name in the run folder


def slurm_launch(spec: RunSpec, env: dict[str, str]) -> Launch:
    """srun inside an allocation (each rank its node's share of the CPUs); else an sbatch script to submit."""
    if spec.allocation is not None:
        alloc = spec.allocation
        if spec.np // spec.ppn > len(alloc.nodes):
            raise BadInput(f"--np {spec.np} with --ppn {spec.ppn} needs {spec.np // spec.ppn} nodes but the "
                           f"allocation (job {alloc.job_id}) has {len(alloc.nodes)}",
                           f"Use at most --nodes {len(alloc.nodes)}, or allocate more (salloc -N ...)")
        cpus = max(1, alloc.cpus_per_node // spec.ppn)
        return Launch(tuple(slurm.srun_argv(spec.np, spec.ppn, trainer_argv(spec), cpus)), env)
    out = Path(spec.cwd, spec.train.output_dir)  # absolute: the script may be submitted from elsewhere
    job = slurm.BatchJob(f"cpudist-{spec.train.task}", spec.np, spec.ppn, spec.cwd, str(out / "slurm-%j.out"),
                         tuple(trainer_argv(spec)), tuple(env.items()), spec.slurm or SlurmOptions())
    return Launch(("sbatch", "--parsable", str(out / SBATCH_FILE)), env, script=slurm.sbatch_script(job))


def torchrun_hosts_launch(spec: RunSpec, env: dict[str, str], nodes: int) -> Launch:
    """One torchrun agent per host of the hostfile, the head's hosting the c10d rendezvous."""
    hosts = [h.name for h in spec.hosts[:nodes]]
    run_id = Path(spec.train.output_dir).name or "cpudist"
    commands = torchrun.host_commands(hosts, spec.ssh, spec.python, spec.cwd, env, spec.ppn, spec.master_port,
                                      run_id, rank_module(spec))
    return Launch(commands[0][1], env, per_host=commands)


def plan(spec: RunSpec) -> Launch:
    """The launch of a spec, after checking that its ranks fit its hosts."""
    nodes = check_layout(spec.np, spec.ppn, spec.hosts, spec.oversubscribe)
    env = rank_env(spec)
    builders = {"mpich": hydra_argv, "impi": hydra_argv, "openmpi": openmpi_argv}
    if spec.launcher in builders:
        return Launch(tuple(builders[spec.launcher](spec, env)), env)
    if spec.launcher == "slurm":
        return slurm_launch(spec, env)
    if spec.launcher == "torchrun":
        if spec.hostfile:
            return torchrun_hosts_launch(spec, env, nodes)
        if nodes > 1:
            raise BadInput("torchrun on more than one node needs the nodes: a hostfile",
                           "Pass --hostfile H (head first; `cpudist hosts ssh-setup` once), or --launcher slurm")
        return Launch(tuple(torchrun_argv(spec)), env)
    raise BadInput(f"unknown launcher '{spec.launcher}'", f"Use one of: {', '.join(LAUNCHERS)}")
