"""How a job ended, where the site's accounting database is out of reach, against a real Slurm
(slurm-wlm 22.05, tests/harness/slurm.py): the harness runs without accounting (`sacct` answers
"accounting storage is disabled"); here the commands' slurm.conf then names a slurmdbd nobody runs,
so the real `sacct` errs as it does where slurmdbd is down. launch/slurm_query.final_info takes
slurmctld's word at once instead of retrying sacct: it costs no more than its own calls of sacct and
scontrol, measured on the same host, and less than one retry interval more."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.launch import slurm_query
from cpudist.waits import wait_until
from tests.harness import netns
from tests.harness import slurm as slurm_harness
from tests.harness.slurm import SlurmCluster

MISSING = netns.missing_requirements() or slurm_harness.missing_requirements()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

# On host 0: one sacct and one scontrol call timed on their own, then final_info timed; as JSON.
MEASURE = '''
import json, subprocess, sys, time
from cpudist.launch.slurm_query import final_info, job_info
job = sys.argv[1]
t = time.monotonic()
sacct = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P"], capture_output=True, text=True)
sacct_s = time.monotonic() - t
t = time.monotonic()
live = job_info(job)
scontrol_s = time.monotonic() - t
t = time.monotonic()
info = final_info(job, live)
print(json.dumps({"sacct_code": sacct.returncode, "sacct_err": sacct.stderr, "sacct_s": sacct_s,
                  "scontrol_s": scontrol_s, "final_s": time.monotonic() - t, "state": info.state}))
'''


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_harness.on_namespace_hosts(1, tmp_path_factory.mktemp("slurm-acct"),
                                          "sac") as cluster:
        yield cluster


def test_an_unreachable_accounting_database_costs_no_retries(slurm: SlurmCluster) -> None:
    job = slurm.run(0,
                    ["sbatch", "--parsable", "-o", "/dev/null", "--wrap",
                     "true"]).stdout.strip().split(";")[0]
    assert job.isdigit(), job
    wait_until(lambda: "JobState=COMPLETED" in slurm.run(0,
                                                         ["scontrol", "show", "job", "-o",
                                                          job]).stdout or None,
               f"Slurm job {job} to complete", 60, 0.5)
    conf = slurm.conf.read_text()
    # the harness's own: no accounting
    assert "AccountingStorageType=accounting_storage/none" in conf
    # Port 9 of host 0: nothing listens there, so sacct's connection to "slurmdbd" is refused at
    # once.
    slurm.conf.write_text(conf.replace("AccountingStorageType=accounting_storage/none",
                                       "AccountingStorageType=accounting_storage/slurmdbd\n"
                                       f"AccountingStorageHost={slurm.hosts.addr(0)}\n"
                                       "AccountingStoragePort=9"))
    try:
        r = slurm.run(0, [sys.executable, "-c", MEASURE, job], cwd=str(Path(__file__).parents[2]))
    finally:
        slurm.conf.write_text(conf)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    # sacct itself errs, as where it is down
    assert got["sacct_code"] != 0 and "database" in got["sacct_err"], got
    assert got["state"] == "COMPLETED", got  # slurmctld's word
    # One sacct call (twice its measured time, for the noise of a loaded machine), no retry after
    # RETRY_S.
    assert got["final_s"] < 2 * got["sacct_s"] + slurm_query.RETRY_S, got


def test_the_harness_has_no_accounting_and_sacct_says_so(slurm: SlurmCluster) -> None:
    r = slurm.run(0, ["sacct", "-j", "1", "-X", "-n"])
    assert r.returncode != 0 and "accounting storage is disabled" in r.stderr, r.stderr
