"""Bytes a node's network interface sent, from the kernel's counters (/sys/class/net/IF/statistics).

The interface counted is the one the process group uses: GLOO_SOCKET_IFNAME when set, else the one
holding the local address the kernel picks to reach MASTER_ADDR (on the head, MASTER_ADDR's own).
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

SIOCGIFADDR = 0x8915
NET = Path("/sys/class/net")


def _address_of(iface: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def iface_toward(env: Mapping[str, str]) -> str | None:
    """The interface this node's ranks talk to their peers through; None when unknown or
    loopback."""
    if env.get("GLOO_SOCKET_IFNAME"):
        return env["GLOO_SOCKET_IFNAME"].split(",")[0]
    try:
        master = socket.gethostbyname(env.get("MASTER_ADDR", ""))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # UDP: picks the route and source address, sends nothing
            local = s.getsockname()[0]
    except OSError:
        return None
    for _, name in socket.if_nameindex():
        if name != "lo" and _address_of(name) == local:
            return name
    return None


def tx_bytes(iface: str | None) -> int | None:
    """The interface's transmitted-bytes counter, or None."""
    if iface is None:
        return None
    try:
        return int((NET / iface / "statistics" / "tx_bytes").read_text())
    except (OSError, ValueError):
        return None
