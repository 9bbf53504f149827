"""The nodes of a launch across hosts: read from the hostfile, checked, reached, and the hostfile
the launcher gets."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

from cpudist import state
from cpudist.errors import BadInput
from cpudist.hostfile import Host, Nodes, check_resolvable, render_hostfile
from cpudist.launch.spec import check_layout
from cpudist.launch.tools import is_this_machine
from cpudist.ssh.reach import check_reachable


def cluster_hosts(listed: Nodes, layout: tuple[int, int, bool], ssh: str | None, out_dir: Path,
                  launcher: str, dry_run: bool) -> tuple[tuple[Host, ...], str, str]:
    """(hosts, rendered hostfile, ssh) of a job on a hostfile's nodes; a dry run writes and probes
    nothing.

    `layout` is (np, ppn, oversubscribe); the launcher's ssh is `ssh`, else the cluster key's
    wrapper, else ssh.
    """
    np, ppn, oversubscribe = layout
    hosts = listed.hosts
    check_layout(np, ppn, hosts, oversubscribe)  # before any probe: the real error first
    check_resolvable(hosts)
    if not is_this_machine(hosts[0].name):
        raise BadInput(f"run cpudist on the head node: {hosts[0].name}, the first host of "
                       f"{listed.source}",
                       f"e.g. `ssh {hosts[0].name} cpudist run ...`, or pass --head ADDRESS to run "
                       "from here")
    cluster_ssh = state.local_cluster_dir() / "ssh"
    ssh = ssh or (str(cluster_ssh) if cluster_ssh.is_file() else "ssh")
    used = hosts[: max(1, np // ppn)]
    rendered = out_dir / "hostfile"
    if not dry_run:
        check_reachable(used, ssh)
        out_dir.mkdir(parents=True, exist_ok=True)
        rendered.write_text(render_hostfile(used, "openmpi" if launcher == "openmpi" else "hydra",
                                            ppn))
    return hosts, str(rendered), ssh




def rendezvous_address(hosts: tuple[Host, ...]) -> str:
    """MASTER_ADDR: the head's name, or the head's address toward the next node when the head
    resolves its own name to loopback (Debian's `127.0.1.1 <hostname>`): its ranks listen where
    MASTER_ADDR leads (train/dist.py)."""
    head = hosts[0].name
    try:
        if len(hosts) < 2 or not ipaddress.ip_address(socket.gethostbyname(head)).is_loopback:
            return head
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            # UDP: picks the route, sends nothing
            s.connect((socket.gethostbyname(hosts[1].name), 9))
            return str(s.getsockname()[0])
    except OSError:
        return head
