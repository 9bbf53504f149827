"""Finding the launchers installed beside this Python, and a free rendezvous port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

from cpudist.errors import BadInput


def find_program(name: str) -> str | None:
    """A program from this Python's bin folder first (pip-installed MPI), then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


def mpi_flavor(path: str) -> str:
    """Which MPI a launcher belongs to: mpich, impi or openmpi (from its --version)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "Intel(R) MPI" in out:
        return "impi"
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    if "HYDRA" in out:
        return "mpich"
    return "unknown"


def resolve_launcher(name: str) -> tuple[str, str]:
    """(launcher, path): `auto` picks MPICH's Hydra when installed, else torchrun."""
    if name in ("auto", "mpich"):
        path = find_program("mpiexec.hydra")
        if path is not None and mpi_flavor(path) == "mpich":
            return "mpich", path
        if name == "mpich":
            raise BadInput("MPICH's mpiexec.hydra was not found",
                           "Install it with `pip install mpich`, or use --launcher torchrun")
    if name in ("auto", "torchrun"):
        return "torchrun", sys.executable
    raise BadInput(f"unknown launcher '{name}'", "Use auto, mpich or torchrun")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, for MASTER_PORT."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
