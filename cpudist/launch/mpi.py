"""MPI launchers: MPICH's and Intel MPI's Hydra (`mpiexec.hydra`), and Open MPI's `mpirun`."""

from __future__ import annotations

from dataclasses import dataclass

from cpudist.launch.kind import Direct
from cpudist.launch.spec import Launch, RunSpec, inherited, trainer_argv


def hydra_argv(spec: RunSpec, env: dict[str, str]) -> list[str]:
    """MPICH's or Intel MPI's Hydra: `mpiexec.hydra -f H -np N -ppn P -genv K V ... python -m
    cpudist.rank`.

    The two differ only in how they name the ssh bootstrap: -launcher (MPICH), -bootstrap (Intel).
    """
    argv = [spec.launcher_path]
    if spec.hostfile:
        flag = "-bootstrap" if spec.launcher == "impi" else "-launcher"
        argv += [flag, "ssh", f"{flag}-exec", spec.ssh, "-f", spec.hostfile]
    argv += ["-np", str(spec.np), "-ppn", str(spec.ppn)]
    # each line with its host and rank
    argv += [] if spec.own_tags else ["-prepend-pattern", "[%h:%r] "]
    hidden = inherited(spec)  # Hydra passes its own environment to every rank, also across hosts
    for key, value in env.items():
        if key not in hidden:
            argv += ["-genv", key, value]
    return argv + trainer_argv(spec)


def openmpi_argv(spec: RunSpec, env: dict[str, str]) -> list[str]:
    """Open MPI: `--map-by ppr:P:node` places P ranks per node (else it fills each host's cores)."""
    argv = [spec.launcher_path]
    if spec.as_root:
        argv.append("--allow-run-as-root")  # Open MPI refuses root unless told; only then
    argv += ["-np", str(spec.np), "--map-by", f"ppr:{spec.ppn}:node"]
    argv += [] if spec.own_tags else ["--output", "tag-detailed"]
    if spec.launch.oversubscribe:
        argv += ["--oversubscribe"]
    if spec.hostfile:
        argv += ["--hostfile", spec.hostfile, "--prtemca", "plm_ssh_agent", spec.ssh]
    hidden = inherited(spec)
    for key, value in env.items():
        # -x NAME: the value of mpirun's environment
        argv += ["-x", key if key in hidden else f"{key}={value}"]
    return argv + trainer_argv(spec)



@dataclass(frozen=True)
class Hydra(Direct):
    """MPICH's or Intel MPI's Hydra: one command; it starts every node's ranks over ssh."""

    name: str  # mpich | impi

    def build(self, spec: RunSpec, env: dict[str, str]) -> Launch:
        return Launch(tuple(hydra_argv(spec, env)), env)


@dataclass(frozen=True)
class OpenMPI(Direct):
    """Open MPI's mpirun: one command, `--map-by ppr:P:node`."""

    name: str = "openmpi"

    def build(self, spec: RunSpec, env: dict[str, str]) -> Launch:
        return Launch(tuple(openmpi_argv(spec, env)), env)
