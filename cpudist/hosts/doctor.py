"""`cpudist hosts doctor`: is every node the same as the head, and ready to run ranks?"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpudist import state
from cpudist.errors import CpudistError
from cpudist.hostfile import Host
from cpudist.hosts.probe import facts as local_facts
from cpudist.ssh.client import Remote, Target
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.ssh.setup import parallel
from cpudist.wire import programs

SAME_AS_HEAD = ("python", "cpudist", "torch", "transformers")
SAME_AS_HERE = ("cpudist", "torch", "mpi")  # what the laptop's cpudist must match to launch there
CPU_FLAGS_THAT_MATTER = ("avx512f", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class NodeReport:
    """One node's facts and what is wrong with them."""

    host: str
    facts: dict[str, Any]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def _flags(f: dict[str, Any]) -> set[str]:
    return set(f.get("cpu", {}).get("flags", [])) & set(CPU_FLAGS_THAT_MATTER)


def compare(head: dict[str, Any], node: dict[str, Any], launcher: str | None,
            here: dict[str, Any] | None = None) -> tuple[str, ...]:
    """What differs from the head (versions, CPU features, cores) or from this machine (cpudist,
    torch, MPI), or is missing (the launcher)."""
    problems = [f"{key} {node.get(key)} != head's {head.get(key)}"
                for key in SAME_AS_HEAD if node.get(key) != head.get(key)]
    problems += [f"{key} {node.get(key)} != this machine's {here.get(key)}"
                 for key in SAME_AS_HERE if here is not None and node.get(key) != here.get(key)]
    if node["cpu"].get("model") != head["cpu"].get("model"):
        problems.append(f"CPU {node['cpu'].get('model')} != head's {head['cpu'].get('model')}")
    if _flags(node) != _flags(head):
        problems.append(f"CPU flags {sorted(_flags(node))} != head's {sorted(_flags(head))}")
    cores, head_cores = node["cpu"]["physical_cores"], head["cpu"]["physical_cores"]
    if cores != head_cores:
        problems.append(f"{cores} physical cores != head's {head_cores}")
    usable, head_usable = node.get("usable_cores"), head.get("usable_cores")
    # a cpuset or CPU quota: its ranks run fewer threads, and the ring waits for them
    if usable != head_usable:
        problems.append(f"{usable} usable cores != head's {head_usable}{quota_note(node)}")
    if launcher and not node.get("launchers", {}).get(launcher):
        problems.append(f"{launcher} not found")
    return tuple(problems)


def quota_note(facts: dict[str, Any]) -> str:
    """` (cgroup quota 0.5 CPUs)` when a quota limits the node, else nothing."""
    quota = facts.get("cpu_quota")
    return "" if quota is None else f" (cgroup quota {quota:g} CPUs)"


def usable_text(facts: dict[str, Any]) -> str:
    """The doctor table's cell: usable cores, and the quota when one applies."""
    usable = facts.get("usable_cores")
    return "-" if usable is None else f"{usable}{quota_note(facts)}"


def probe(host: Host, user: str | None, identity: str | None, port: int,
          python: str) -> dict[str, Any]:
    """Run the probe module on a node with the head's Python path."""
    known = KnownHosts(state.local_cluster_dir() / "known_hosts")
    key = identity or (str(state.local_cluster_dir() / "id_ed25519")
                       if (state.local_cluster_dir() / "id_ed25519").exists() else None)
    with Remote(Target(host.name, user, port, key), known) as remote:
        code, out, err = remote.run(f"{shlex.quote(python)} -m {programs.PROBE}", timeout=60)
    if code != 0:
        raise CpudistError(f"{host.name}: the probe failed with exit code {code}: "
                           f"{err.strip()[-200:]}",
                           f"Install the same Python at {python} and cpudist on every node")
    data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return data


def doctor(hosts: Sequence[Host], user: str | None, identity: str | None, port: int = 22,
           launcher: str | None = "mpiexec.hydra", python: str | None = None) -> list[NodeReport]:
    """Probe every node in parallel and compare each with the head (the first host)."""
    exe = python or sys.executable

    def one(h: Host) -> dict[str, Any]:
        try:
            return probe(h, user, identity, port, exe)
        except CpudistError as e:
            return {"error": e.message}

    facts = parallel(hosts, one)
    head, here = facts[0], local_facts()
    reports = []
    for h, f in zip(hosts, facts, strict=True):
        if "error" in f:
            reports.append(NodeReport(h.name, f, (f["error"],)))
        elif "error" in head:
            reports.append(NodeReport(h.name, f,
                                      ("head node unreachable: nothing to compare with",)))
        else:
            reports.append(NodeReport(h.name, f, compare(head, f, launcher, here)))
    return reports

