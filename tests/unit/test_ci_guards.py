"""CI's guards fail when they should: .ci/run on a main job that did not learn, a pytest session
under CPUDIST_CI=1 on a skip outside the allowlist, tests/harness/setup.sh without root under CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import allowed
from tests.harness.quota import cpu_controller_version, quota_unavailable

REPO = Path(__file__).resolve().parents[2]
DONE = ("done: mrpc all-MiniLM-L6-v2 on 2 rank(s), 1 node(s): train 121.4s, 90.6 samples/s, "
        "wall 128.2s, {metrics} -> runs/mrpc/result.json")


def fake_checkout(tmp_path: Path, block1: str) -> Path:
    """A checkout whose README's first bash block is `block1` and whose second prints what CI mode
    it sees."""
    (tmp_path / ".ci").mkdir()
    for name in ("run", "accuracy_floor.py"):
        shutil.copy(REPO / ".ci" / name, tmp_path / ".ci" / name)
    block2 = 'echo "tests, CI=$CPUDIST_CI"'
    (tmp_path / "README.md").write_text(
        f"# x\n\n```bash\n{block1}\n```\n\n```bash\n{block2}\n```\n")
    return tmp_path


@pytest.mark.parametrize(("block1", "rc", "says"), [
    (f"echo 'Successfully installed'; echo '{DONE.format(metrics='accuracy=0.7966 f1=0.8610')}'", 0,
     "accuracy check: 0.7966 > 0.75"),
    (f"echo '{DONE.format(metrics='accuracy=0.6838 f1=0.8122')}'", 1,
     "accuracy 0.6838 is not above 0.75"),
    (f"echo '{DONE.format(metrics='accuracy=0.7500 f1=0.8300')}'", 1,
     "accuracy 0.75 is not above 0.75"),
    (f"echo '{DONE.format(metrics='accuracy=0.81 f1=0.86')}' >&2; echo "
     f"'{DONE.format(metrics='accuracy=0.70')}'", 1,
     "accuracy 0.7 is not above"),  # the last done: line decides
    (f"echo '{DONE.format(metrics='f1=0.86')}'", 1, "shows no accuracy"),
    ("echo 'the job failed'", 1, "no `done:` line"),
], ids=["learned", "majority-class", "at-the-floor", "last-line-decides", "no-accuracy",
        "no-done-line"])
def test_ci_run_fails_when_the_main_job_did_not_learn(tmp_path: Path, block1: str, rc: int,
                                                      says: str) -> None:
    checkout = fake_checkout(tmp_path, block1)
    r = subprocess.run(["bash", str(checkout / ".ci" / "run")], capture_output=True, text=True,
                       timeout=60, env={k: v for k, v in os.environ.items() if k != "CPUDIST_CI"})
    assert r.returncode == rc, r.stdout + r.stderr
    assert says in r.stdout + r.stderr
    assert "tests, CI=1" in r.stdout  # the tests ran too, in CI mode


def test_ci_run_stops_when_the_main_job_fails(tmp_path: Path) -> None:
    checkout = fake_checkout(tmp_path, f"echo '{DONE.format(metrics='accuracy=0.80')}'; exit 3")
    r = subprocess.run(["bash", str(checkout / ".ci" / "run")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3 and "tests, CI=" not in r.stdout, r.stdout + r.stderr


BOGUS = """
import pytest

def test_fine() -> None:
    pass

def test_skips_for_no_good_reason() -> None:
    pytest.skip("the MPI venv is missing")

@pytest.mark.xfail(reason="known")
def test_expected_failure() -> None:
    assert False
"""


@pytest.mark.parametrize(("ci", "rc"), [("1", 1), ("", 0), ("0", 0)])
def test_a_skip_outside_the_allowlist_fails_a_ci_session(tmp_path: Path, ci: str, rc: int) -> None:
    (tmp_path / "test_bogus.py").write_text(BOGUS)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p",
                        "no:cacheprovider", "-q",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_bogus.py")],
                       capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "CPUDIST_CI": ci})
    assert r.returncode == rc, r.stdout + r.stderr
    assert "1 passed, 1 skipped, 1 xfailed" in r.stdout, r.stdout
    named = "test_bogus.py::test_skips_for_no_good_reason: the MPI venv is missing" in r.stdout
    assert named == (ci == "1"), r.stdout  # the xfail is not counted as a skip


def test_the_allowlist_admits_only_the_other_cgroup_versions_test() -> None:
    """Here, with the kernel's real answer: the test of the version that lacks the cpu controller
    may skip."""
    holder = cpu_controller_version()
    for version in (1, 2):
        test = ("tests/integration/test_threads_cgroup.py::"
                f"test_a_ranks_threads_follow_its_cgroup_quota[{version}]")
        reason = quota_unavailable(version)
        if holder in (1, 2) and version != holder:
            assert reason is not None and allowed(test, reason) is not None, reason
        if reason is not None:
            # only that test
            assert allowed("tests/integration/test_torchrun_hosts.py::x", reason) is None
    test = "test_cpu_max_of_a_ranks_v2_group_sizes_its_threads"
    assert allowed(f"tests/integration/test_threads_cgroup.py::{test}",
                   "needs root (cgroups, mounts)") is None
    assert allowed("tests/integration/test_cluster.py::test_x",
                   "needs root (network namespaces)") is None


def setup_as_non_root(ci: str) -> subprocess.CompletedProcess[str]:
    """tests/harness/setup.sh (read from stdin) as `nobody` when this is root, else as this user."""
    who = ["setpriv", "--reuid=nobody", "--regid=nogroup",
           "--clear-groups"] if os.geteuid() == 0 else []
    return subprocess.run([*who, "bash", "-s"],
                          input=(REPO / "tests" / "harness" / "setup.sh").read_text(),
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CPUDIST_CI": ci})


def test_setup_sh_without_root_fails_under_ci_and_is_a_friendly_no_op_otherwise() -> None:
    ci = setup_as_non_root("1")
    assert ci.returncode == 1 and "not root" in ci.stderr and "CPUDIST_CI" in ci.stderr, ci.stderr
    dev = setup_as_non_root("")
    assert (dev.returncode == 0
            and "not root; the multi-host tests will be skipped" in dev.stderr), dev.stderr
