"""torchrun across hosts, as pure data: one `torchrun` agent per host, each started over SSH.

    # the command of each host
    cpudist run mrpc --launcher torchrun --hostfile hosts --np 4 --ppn 1 --dry-run

The zero-MPI path: every host of the hostfile runs `torchrun --nnodes N --nproc-per-node P
--rdzv-backend c10d --rdzv-endpoint HEAD:PORT`, the head (the first host, where cpudist runs)
hosting the rendezvous. Each agent runs under `python -m cpudist.launch.tether`, which takes the
agent and its ranks down when its SSH session ends, so stopping the local ssh (a failed host,
Ctrl-C) leaves nothing behind (launch/runner.py). --env values other than the thread counts are not
on these lines (ssh's command line is in `ps` on both ends): the tether exports them by name from
the run's secrets file (launch/spec.py: filed_env). c10d numbers the hosts in the order of their
--local-addr names, so rank 0 (and result.json) may be on another host than the head: cpudist
fetches the result, the model and --report-to's folders from there when the run folder is not shared
(run/outcome.fetch_from_rank0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.launch import elastic
from cpudist.launch.kind import Direct
from cpudist.launch.per_host import host_line
from cpudist.launch.spec import Launch, RunSpec, filed_env, rank_module

# Set by torchrun itself for every worker: passing ours would only mislead a reader of the command.
OWN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")


def torchrun_argv(python: str, nnodes: int, ppn: int, endpoint: str, run_id: str, local_addr: str,
                  module: Sequence[str]) -> list[str]:
    """One host's agent: --ppn ranks of `python -m MODULE ARGS...`, joining the c10d rendezvous at
    `endpoint`."""
    return [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node",
            str(ppn), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
            "--local-addr", local_addr, "--max-restarts", "0", "-m", *module]


def host_commands(hosts: Sequence[str], ssh: str, python: str, cwd: str, env: dict[str, str],
                  ppn: int, port: int, run_id: str, module: Sequence[str],
                  from_file: Sequence[str] = ()) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(host, argv) for every host: the head's runs here under `sh -c`, the others' through `ssh
    HOST`."""
    endpoint = f"{hosts[0]}:{port}"
    env = {k: v for k, v in env.items() if k not in OWN_VARIABLES}
    commands = []
    for i, host in enumerate(hosts):
        agent = torchrun_argv(python, len(hosts), ppn, endpoint, run_id, host, module)
        line = host_line(python, cwd, env, agent, from_file)
        argv = ("sh", "-c", line) if i == 0 else (ssh, host, line)
        commands.append((host, argv))
    return tuple(commands)


def local_argv(spec: RunSpec) -> list[str]:
    """torchrun on this machine: one agent spawning --ppn ranks (env comes from the parent)."""
    return [spec.python, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(spec.ppn), "--master-addr", spec.master_addr,
            "--master-port", str(spec.master_port), "-m", *rank_module(spec)]


def hosts_launch(spec: RunSpec, env: dict[str, str], nodes: int) -> Launch:
    """One torchrun agent per host of the hostfile, the head's hosting the c10d rendezvous."""
    hosts = [h.name for h in spec.hosts[:nodes]]
    run_id = Path(spec.train.output_dir).name or "cpudist"
    from_file = tuple(k for k, _ in filed_env(spec))  # off the ssh lines: from the secrets file
    commands = host_commands(hosts, spec.ssh, spec.python, spec.cwd, env, spec.ppn,
                             spec.master_port, run_id, rank_module(spec), from_file)
    return Launch(commands[0][1], env, per_host=commands)


@dataclass(frozen=True)
class Torchrun(Direct):
    """torchrun: one agent on this machine, or one per host of a hostfile (started over ssh, under a
    tether)."""

    name: str = "torchrun"
    about = "with --hostfile: one torchrun per host over SSH"

    def build(self, spec: RunSpec, env: dict[str, str]) -> Launch:
        nodes = max(1, spec.np // spec.ppn)
        if spec.train.elastic:
            return elastic.hosts_launch(spec, env, nodes)
        if spec.hostfile:
            return hosts_launch(spec, env, nodes)
        if nodes > 1:
            raise BadInput("torchrun on more than one node needs the nodes: a hostfile",
                           "Pass --hostfile H (head first; `cpudist hosts ssh-setup` once), or "
                           "--launcher slurm")
        return Launch(tuple(local_argv(spec)), env)
