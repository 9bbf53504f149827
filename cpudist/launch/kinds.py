"""Every launcher kind by name (the one table), and the launch of a spec.

A kind is one object (launch/kind.Kind): it places the ranks (a scheduler's nodes), builds the
Launch, runs it and judges its end. A new kind (PBS, Kubernetes, Ray, ...) is one module with such
an object and one row of KINDS.
"""

from __future__ import annotations

from typing import cast

from cpudist.errors import BadInput
from cpudist.launch.kind import Batch, Kind
from cpudist.launch.mpi import Hydra, OpenMPI
from cpudist.launch.slurm_job import Slurm
from cpudist.launch.spec import LAUNCHERS, Launch, RunSpec, check_layout, rank_env
from cpudist.launch.torchrun import Torchrun

KINDS: dict[str, Kind] = {k.name: k
                          for k in (Hydra("mpich"), Hydra("impi"), OpenMPI(), Torchrun(), Slurm())}


def kind_of(name: str) -> Kind:
    """The kind of a resolved launcher name."""
    kind = KINDS.get(name)
    if kind is None:
        raise BadInput(f"unknown launcher '{name}'", f"Use one of: {', '.join(LAUNCHERS)}")
    return kind


def batch_of(name: str) -> Batch:
    """The kind of a launcher whose jobs outlive this process (--detach leaves them), or a one-line
    refusal."""
    kind = kind_of(name)
    if not kind.scheduled:
        raise BadInput(f"--launcher {name} runs its ranks under this process: --detach has nothing "
                       "to leave running",
                       "Detach from outside the cluster (--cluster/--head), or keep this shell "
                       "open (tmux)")
    return cast(Batch, kind)


def batches() -> tuple[Batch, ...]:
    """The kinds whose jobs a scheduler runs (their flags are the CLI's submission options)."""
    return tuple(cast(Batch, kind) for kind in KINDS.values() if kind.scheduled)


def scheduled(name: str) -> bool:
    """Whether a launcher (as given: `auto` is not) is a scheduler's: it picks the nodes, no
    hostfile."""
    return name in KINDS and KINDS[name].scheduled


def plan(spec: RunSpec) -> Launch:
    """The launch of a spec, after checking that its ranks fit its hosts."""
    check_layout(spec.np, spec.ppn, spec.hosts, spec.launch.oversubscribe)
    return kind_of(spec.launcher).build(spec, rank_env(spec))
