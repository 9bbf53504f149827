"""#23 item 6, a preempted Slurm job (not its time limit) is requeued: against a real Slurm whose
`urgent` partition preempts `batch` jobs (PreemptMode=CANCEL with a GraceTime:
tests/harness/slurm.py, preemption=True). The ranks are a stand-in that stops as cpudist's do
(SIGTERM: write the stop marker, exit 75), so the test takes seconds: what it checks is cpudist's
batch script (launch/slurm.py), which saw only its own USR1 and let the preempted job go."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.launch.batch import BatchOptions
from cpudist.launch.slurm import BatchJob, sbatch_script
from cpudist.wire.stop_marker import NAME as STOP_MARKER
from tests.harness import netns
from tests.harness import slurm as slurm_harness
from tests.harness.slurm import SlurmCluster
from tests.integration.helpers import wait_for

MISSING = netns.missing_requirements() or slurm_harness.missing_requirements()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]
RANK = """#!/bin/bash
# cpudist's ranks at a stop: SIGTERM -> a checkpoint, the stop marker in the run folder, exit 75
trap 'echo "{\\"step\\": 3, \\"reason\\": \\"SIGTERM\\"}" > %s; exit 75' TERM
echo "rank up, part ${SLURM_RESTART_COUNT:-0}"
sleep 600 & wait
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_harness.on_namespace_hosts(1, tmp_path_factory.mktemp("slurm-hosts"), "slp",
                                          preemption=True) as cluster:
        yield cluster


def job_field(slurm: SlurmCluster, job_id: str, name: str) -> str:
    found = re.search(rf"\b{name}=(\S+)",
                      slurm.run(0, ["scontrol", "show", "job", "-o", job_id]).stdout)
    return found.group(1) if found else ""


def test_a_preempted_job_that_saved_a_checkpoint_is_requeued(slurm: SlurmCluster,
                                                             tmp_path: Path) -> None:
    rank = tmp_path / "rank.sh"
    rank.write_text(RANK % (tmp_path / STOP_MARKER))
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(BatchJob(name="preempted", np=1, ppn=1, cwd=str(tmp_path),
                                             output=str(tmp_path / "slurm-%j.out"),
                                             command=("bash", str(rank)), env=(),
                                             options=BatchOptions(requeue=True, exclusive=True))))
    job_id = slurm.run(0, ["sbatch", "--parsable", str(script)]).stdout.strip().split(";")[0]
    out = tmp_path / f"slurm-{job_id}.out"
    urgent = ""
    try:
        wait_for(lambda: out.is_file() and "rank up, part 0" in out.read_text(), 60,
                 f"job {job_id}'s rank",
                 lambda: slurm.run(0, ["scontrol", "show", "job", job_id]).stdout)
        urgent = slurm.run(0,
                           ["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-o",
                            "/dev/null", "--wrap", "sleep 1"]).stdout.strip().split(";")[0]
        # Two waits, so that a slow scheduler pass is not taken for a slow script: Slurm preempts
        # when a scheduling pass takes up the urgent job (at its submission, else the next pass of
        # the main or the backfill scheduler, sched_interval 60 s and bf_interval 30 s by default);
        # from then on the job's end is the batch script's (after its steps' SIGTERM, GraceTime).
        def state() -> str:
            return "\n".join([out.read_text()[-2000:],
                              slurm.run(0, ["scontrol", "show", "job"]).stdout,  # both jobs
                              slurm.logs()])

        # the preemption's SIGTERM to the steps, as slurmstepd writes it into the job's output
        wait_for(lambda: "CANCELLED AT" in out.read_text(), 150,
                 f"job {job_id} preempted by job {urgent}", state, 0.5)
        wait_for(lambda: job_field(slurm, job_id, "Restarts") == "1", slurm_harness.GRACE_S + 30,
                 f"job {job_id} requeued", state, 0.5)
        text = out.read_text()
        assert f"[cpudist] requeueing Slurm job {job_id}: the ranks saved a checkpoint before " \
               "its preemption" in text
        # it starts again once the nodes are free
        assert job_field(slurm, job_id, "JobState") == "PENDING", text
    finally:
        slurm.run(0, ["scancel", job_id, *([urgent] if urgent else [])])
