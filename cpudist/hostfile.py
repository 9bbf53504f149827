"""Hostfiles: parse and render the Intel MPI/MPICH form and the Open MPI form.

    head-node            # Intel MPI / MPICH: a name per line, optionally name:slots
    node1:2
    node2 slots=2        # Open MPI: name slots=N

The first host is the head node: rank 0 and the rendezvous (MASTER_ADDR) live there.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpudist.errors import BadInput

FLAVORS = ("hydra", "openmpi")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Host:
    """One node of the cluster; `slots` None means the hostfile did not say."""

    name: str
    slots: int | None = None


@dataclass(frozen=True)
class Nodes:
    """A run's nodes, head first, read once from where they were listed (`source`: that hostfile,
    for messages)."""

    hosts: tuple[Host, ...]
    source: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Nodes:
        return cls(tuple(Host(**h) for h in data["hosts"]), data["source"])


def read_nodes(path: Path) -> Nodes:
    """The nodes of a hostfile on this machine."""
    return Nodes(read_hostfile(path), str(path))


def local_hosts(slots: int) -> tuple[Host, ...]:
    """This machine as a one-node cluster."""
    return (Host("localhost", slots),)


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise BadInput(f"bad slot count '{text}' at {where}",
                       "Slots must be a whole number of at least 1")
    return int(text)


def _parse_line(line: str, where: str) -> Host:
    tokens = re.sub(r"\s*=\s*", "=", line).split()  # `slots = 2` as Open MPI accepts it
    name, slots = tokens[0], None
    for extra in tokens[1:]:
        key, sep, value = extra.partition("=")
        if not sep:
            raise BadInput(f"unexpected '{extra}' at {where}",
                           "Write `host`, `host:slots` or `host slots=N`")
        if key == "slots":
            slots = _slots(value, where)
        # Open MPI's other keys (max_slots=...) do not change where our ranks go.
    if ":" in name:
        name, _, count = name.partition(":")
        slots = _slots(count, where)
    if not _NAME.match(name):
        raise BadInput(f"'{name}' at {where} is not a host name or IPv4 address",
                       "Fix that line of the hostfile")
    return Host(name, slots)


def parse_hostfile(text: str, source: str = "hostfile") -> tuple[Host, ...]:
    """Hosts in file order; comments, blank lines, duplicates and bad slots are handled or
    refused."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host = _parse_line(line, f"{source}:{number}")
        if any(h.name == host.name for h in hosts):
            raise BadInput(f"host '{host.name}' appears twice ({source}:{number})",
                           "List each host once; give it more slots with host:N or `host slots=N`")
        hosts.append(host)
    if not hosts:
        raise BadInput(f"{source} lists no hosts", "Put one host per line, the head node first")
    return tuple(hosts)


def read_hostfile(path: Path) -> tuple[Host, ...]:
    """Parse a hostfile from disk."""
    if not path.is_file():
        raise BadInput(f"hostfile not found: {path}",
                       "Check --hostfile (or write one: see hostfiles/)")
    return parse_hostfile(path.read_text(), str(path))


def render_hostfile(hosts: Sequence[Host], flavor: str = "hydra", slots: int | None = None) -> str:
    """Hostfile text; `slots` overrides every host's count (the launch's ranks per node)."""
    lines = []
    for h in hosts:
        count = slots if slots is not None else h.slots
        if flavor == "openmpi":
            lines.append(h.name if count is None else f"{h.name} slots={count}")
        else:
            lines.append(h.name if count is None else f"{h.name}:{count}")
    return "\n".join(lines) + "\n"


def check_resolvable(hosts: Sequence[Host]) -> None:
    """Every name must resolve here, or the launcher would fail late and vaguely."""
    for h in hosts:
        try:
            socket.getaddrinfo(h.name, 22, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise BadInput(f"host '{h.name}' does not resolve ({e.strerror})",
                           "Fix the name in the hostfile, or add it to /etc/hosts or DNS") from None
