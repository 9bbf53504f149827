from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpudist.cpu import parse_cpuinfo, read_cpu
from cpudist.errors import BadInput
from cpudist.train.dist import discover_rank
from cpudist.train.setup import resolve_precision
from tests.harness.machine import cpus_on_distinct_cores

CPUINFO = "\n\n".join(
    f"processor\t: {i}\nmodel name\t: Xeon\nphysical id\t: 0\ncore id\t\t: {i % 2}\n"
    "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16" for i in range(4))


def test_cpuinfo_counts_physical_cores_and_bf16() -> None:
    cpu = parse_cpuinfo(CPUINFO)
    assert (cpu.logical_cpus, cpu.physical_cores, cpu.has_bf16) == (4, 2, True)
    assert parse_cpuinfo(CPUINFO, allowed={0}).physical_cores == 1


def test_this_machines_cores_are_the_kernels_physical_cores() -> None:
    """What cpudist counts here (and tests size their expectations by) is the kernel's topology: one
    core per (package, core id) among the CPUs of this process's affinity mask, not one per logical
    CPU."""
    topology = Path("/sys/devices/system/cpu")
    if not (topology / "cpu0" / "topology" / "core_id").is_file():
        pytest.skip("no CPU topology in sysfs to compare with")
    allowed = sorted(os.sched_getaffinity(0))

    def core(cpu: int) -> tuple[str, str]:
        folder = topology / f"cpu{cpu}" / "topology"
        return (folder / "physical_package_id").read_text().strip(), (
            folder / "core_id").read_text().strip()

    cores = {core(cpu) for cpu in allowed}
    cpu = read_cpu()
    assert cpu.physical_cores == len(cores) and cpu.logical_cpus == len(allowed)
    distinct = cpus_on_distinct_cores()
    assert len(distinct) == len(cores) and len({core(c) for c in distinct}) == len(cores)


def test_precision_auto() -> None:
    assert resolve_precision("auto", True) == "bf16"
    assert resolve_precision("auto", False) == "fp32"
    assert resolve_precision("fp32", True) == "fp32"


@pytest.mark.parametrize(("env", "expected"), [
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     (3, 4, 1, 2)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2, 1, 2)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
      "SLURM_NTASKS_PER_NODE": "2(x4)"},
     (5, 8, 1, 2)),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
      "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (0, 2, 0, 2)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (1, 2, 1, 2)),
    ({}, (0, 1, 0, 1)),
])
def test_rank_discovery(env: dict[str, str], expected: tuple[int, int, int, int]) -> None:
    info = discover_rank(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == expected


def test_rank_outside_world() -> None:
    with pytest.raises(BadInput):
        discover_rank({"PMI_RANK": "4", "PMI_SIZE": "4"})


def test_a_rank_ends_with_its_code_and_its_buffered_output_written(tmp_path: Path) -> None:
    """exit_rank skips the interpreter's finalization (os._exit), which would also skip flushing: a
    rank's last lines (its closing event, an error line) sit in Python's buffers when its output is
    a pipe."""
    script = ("import sys\nfrom cpudist.train.dist import exit_rank\n"
              "sys.stdout.write('last event\\n'); sys.stderr.write('last error\\n'); "
              "exit_rank(3)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (3, "last event\n", "last error\n")
