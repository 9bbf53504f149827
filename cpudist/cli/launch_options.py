"""The options of a launch, declared once: how many ranks and how the launcher starts them
(`LaunchOptions`), and where they go (`Route`). `cpudist run` (and each run of `sweep`) and `cpudist
launch` take both; `cpudist hosts bench` takes the launcher's way to the nodes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from cpudist.cli.batch_options import batch_options
from cpudist.cli.options import PPN
from cpudist.errors import BadInput
from cpudist.launch import batch
from cpudist.launch.env import AUTO_PPN_WHY, parse_env_pairs
from cpudist.launch.kinds import KINDS, batches
from cpudist.launch.spec import LAUNCHERS
from cpudist.launch.tools import OPENMP_AUTO

if TYPE_CHECKING:
    from cpudist.run.request import LaunchOptions
    from cpudist.run.where import Route

F = TypeVar("F", bound=Callable[..., Any])


def _env(ctx: click.Context, param: click.Parameter,
         value: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    try:
        return parse_env_pairs(value)
    except ValueError as e:
        raise BadInput(f"--env {e} is not of the form KEY=VALUE",
                       "Write it as --env NAME=value") from None


def _add(options: list[Callable[[Any], Any]], command: F) -> F:
    # click lists a command's options in the order they decorate it
    for option in reversed(options):
        command = option(command)
    return command


def connect_options(command: F) -> F:
    """Add --mpirun --ssh --iface: the launcher program and how it reaches the nodes."""
    return _add([
        click.option("--mpirun", type=click.Path(dir_okay=False),
                     help="The launcher program (mpiexec.hydra or mpirun)."),
        click.option("--ssh",
                     help="ssh program for the launcher [default: ~/.cpudist/cluster/ssh from "
                          "ssh-setup]."),
        click.option("--iface", help="Network interface between nodes (sets GLOO_SOCKET_IFNAME)."),
    ], command)


def _launcher_help() -> str:
    inside = " or ".join(f"{kind.label}'s" for kind in batches())
    kinds = "; ".join(f"{kind.name}: {kind.about}" for kind in KINDS.values() if kind.about)
    return (f"auto: inside {inside} allocation, its own launcher, else the MPI of --mpirun, else "
            f"MPICH's Hydra when installed, else torchrun. {kinds}.")


def launch_options(command: F) -> F:
    """Add the options `to_launch` reads: rank counts, the launcher (a scheduler's too), the ranks'
    environment."""
    return _add([
        click.option("--np", "np_", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Ranks in all."),
        click.option("--ppn", type=PPN,
                     help="Ranks per node [default: --np, on this machine]; auto: ranks and "
                     "threads per rank from this node's cores (" + AUTO_PPN_WHY + ")."),
        click.option("--nodes", type=click.IntRange(min=1),
                     help="Nodes to use: --np becomes nodes x --ppn."),
        click.option("--launcher", "--mpi", "launcher", type=click.Choice(LAUNCHERS),
                     default="auto", show_default=True, help=_launcher_help()),
        batch_options(),
        connect_options,
        click.option("--allocator", type=click.Choice(["auto", "tcmalloc", "jemalloc", "none"]),
                     default="auto", show_default=True,
                     help="Preloaded memory allocator (auto: tcmalloc when installed)."),
        click.option("--openmp", type=click.Choice(["auto", "intel", "gnu"]), default="auto",
                     show_default=True,
                     help="OpenMP runtime of the ranks: Intel's libiomp5 (pip install "
                          "intel-openmp) with "
                     "KMP_AFFINITY/KMP_BLOCKTIME, or torch's own GNU one (auto: " + OPENMP_AUTO
                     + ", the faster "
                     "one measured here)."),
        click.option("--env", "env_pairs", multiple=True, callback=_env,
                     help="Extra rank variable KEY=VALUE (repeatable)."),
        click.option("--secret", "secret_names", multiple=True, metavar="NAME",
                     help="Pass this shell's variable NAME to every rank off every command line (a "
                          "0600 file on "
                     "each node, read by the rank); repeatable."),
        click.option("--env-file", "env_files", multiple=True,
                     type=click.Path(path_type=Path, dir_okay=False),
                     help="NAME=value lines passed to every rank as --secret does; repeatable."),
        click.option("--oversubscribe", is_flag=True,
                     help="Allow more ranks per node than its cores."),
        click.option("--timeout", type=click.FloatRange(min=1),
                     help="Stop the job after this many seconds."),
    ], command)


def route_options(command: F) -> F:
    """Add the options `to_route` reads: a hostfile's nodes, or a cluster or head reached from
    outside."""
    return _add([
        click.option("--hostfile", type=click.Path(path_type=Path),
                     help="Nodes to run on, head first (run from the head) "
                     "[default: this machine]."),
        click.option("--cluster", "cluster_name",
                     help="A cluster from `cpudist cluster up`: its nodes and price; "
                     "run from anywhere (inputs are staged on the nodes, results come back here)."),
        click.option("--head", "head_addr",
                     help="With --hostfile, from outside the cluster: the address this "
                     "machine reaches the head (first host) by."),
        click.option("--user", help="With --head: login name on the head [default: yours]."),
        click.option("--identity", type=click.Path(exists=True, dir_okay=False),
                     help="With --head: private key that logs in to the head [default: the "
                          "ssh-setup cluster key]."),
        click.option("--remote-python",
                     help="Python with cpudist on the nodes [default: /opt/cpudist/bin/python, "
                     "python3.11, python3]."),
        click.option("--stage-code", type=click.Choice(["auto", "always", "never"]), default="auto",
                     show_default=True,
                     help="Send a wheel of this cpudist to the nodes: when theirs differs (auto), "
                     "always, or never."),
    ], command)


def to_launch(opts: dict[str, Any], np: int, ppn: int) -> LaunchOptions:
    """The LaunchOptions of a command's options, for the `np` ranks, `ppn` a node, the command
    resolved."""
    from cpudist import secrets
    from cpudist.run.request import LaunchOptions

    return LaunchOptions(np=np, ppn=ppn, launcher=opts["launcher"], mpirun=opts["mpirun"],
                         ssh=opts["ssh"],
                         iface=opts["iface"], allocator=opts["allocator"], openmp=opts["openmp"],
                         env=opts["env_pairs"], oversubscribe=opts["oversubscribe"],
                         timeout_s=opts["timeout"],
                         batch=batch.from_values(opts), shared_fs=opts.get("shared_fs", False),
                         # --env-file's pairs, then --secret's (the later wins), as data: never on a
                         # command line
                         secrets=secrets.gather(opts["env_files"], opts["secret_names"],
                                                os.environ))


def to_route(opts: dict[str, Any]) -> Route:
    """Where a command's options send the ranks."""
    from cpudist.run.where import Route

    return Route(hostfile=opts["hostfile"], cluster=opts["cluster_name"],
                 head_addr=opts["head_addr"],
                 user=opts["user"], identity=opts["identity"], remote_python=opts["remote_python"],
                 stage_code=opts["stage_code"], on_preemption=opts.get("on_preemption", "stop"))
