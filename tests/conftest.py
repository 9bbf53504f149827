"""Shared fixtures: where the shared GLUE and emotion data live (beside the repository); and, under
CI, a session that fails on any skip its machine should not take."""

from __future__ import annotations

import compileall
import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from tests.harness.quota import cpu_controller_version

# Property tests check results, not speed: hypothesis's 200 ms deadline failed a collate example on
# a busy 2-core machine, and CI machines differ in speed.
settings.register_profile("cpudist", deadline=None)
settings.load_profile("cpudist")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# The tests that press Ctrl-C or hang up on a command model a user at a terminal, where neither
# signal is ignored. A suite started under `nohup` or with `&` from a script inherits SIGHUP or
# SIGINT ignored, and so would every command it starts (an ignored disposition survives exec), which
# cpudist rightly keeps ignoring (cpudist/interrupts.py). So the session restores the terminal's
# dispositions for itself and its children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# OpenMP threads that wait, wait asleep (OMP_WAIT_POLICY=PASSIVE) in every process the suite starts
# on this machine, and on the namespace hosts (tests/harness/netns.py sets it in their sshd's
# sessions). Torch's GNU OpenMP spins a waiting thread (GOMP_SPINCOUNT, 300,000 pauses) before it
# sleeps: harmless on a node whose cores are its ranks' own, ruinous here, where 3 workers' runs and
# 2-4 "hosts" share 2 cores and a spinning thread holds the core its peer needs to reach the barrier
# it spins on. Three 2-thread runs at once on 2 cores (60 tiny steps each) took 65-79 s and 125-152
# CPU-s spinning, 21 s and 36 CPU-s waiting asleep (2026-11-28, AMD EPYC, 2 cores). Real nodes share
# no cores, so this removes an artefact of the test world, not a cost users pay; `cpudist run`
# leaves the policy to the user (benchmarks/omp_wait.py measures both on a node of its own and under
# sharing).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile cpudist and the test harness to bytecode once, as a wheel install (pip) would have.

    The README installs cpudist editable, which writes no `.pyc`; with PYTHONDONTWRITEBYTECODE set
    (this machine's environment) no process writes them either, so every rank, `cpudist` command and
    harness server the suite starts (hundreds) compiled the cpudist modules it imports again. Small
    (all of cpudist compiles in under a second; a rank's imports differed by less than their noise
    here), but it is what a wheel install gives users. The files are checked against their sources'
    mtimes as usual, so an edit after this still runs the edited source."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller did it
        return
    repo = Path(__file__).resolve().parents[1]
    for package in ("cpudist", "tests"):
        compileall.compile_dir(repo / package, quiet=1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (README's test command): one worker more than the cores, at most 4. Most of the
    suite's time is waiting (sshd, Slurm's scheduler, link-loss and node-watch bounds, moto), so on
    2 cores 3 workers keep the CPU busy; more would stack multi-rank trainings on each core and
    stretch the bounds the tests check. Each worker takes whole files (`--dist loadfile`), so a
    module's namespace cluster is built once."""
    return max(2, min(4, (os.cpu_count() or 1) + 1))


# The longest files first (their tests' summed durations in a full run, longest first; a file not
# listed keeps its place after them), so that with several workers no long file starts last and runs
# on alone. Each worker takes whole files in this order.
LONGEST_FIRST = (
    # summed durations of a parallel run (ba9a930, 3 workers on 2 cores): 735 s down to 60 s; the
    # one-test test_learning first (xdist keeps this order with --no-loadscope-reorder,
    # pyproject.toml)
    "test_learning.py", "test_aws_e2e.py", "test_sync.py", "test_run_local.py", "test_cluster.py",
    "test_resume_exact.py", "test_remote_onprem.py", "test_resume.py", "test_aws.py",
    "test_run_identity.py",
    "test_slurm.py", "test_predict_run.py", "test_torchrun_hosts.py", "test_predict.py",
    "test_sync_traffic.py",
    "test_launch_script_remote.py", "test_store_watch.py", "test_spot.py", "test_lora.py",
    "test_architectures_run.py",
    "test_model_save.py", "test_sweep.py", "test_chaos.py", "test_slurm_requeue.py",
    "test_best_across_parts.py",
    "test_logs_head.py", "test_model_s3.py", "test_local_sgd_moments.py",
    "test_launch_script_per_node.py",
    "test_ami.py", "test_remote_stock_nodes.py", "test_world.py", "test_launch_trainer.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    place = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # stable: a file's order is kept
    items.sort(key=lambda item: place.get(item.path.name, len(LONGEST_FIRST)))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (it lies beside the repository in CI)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def session_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one token cache folder of the whole session, every xdist worker's (each writes an entry
    under a temporary name and renames it, as the ranks of one node do:
    cpudist/train/token_cache.py)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps lie in the controller's
    folder = root / "tokens"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                   request: pytest.FixtureRequest, session_tokens: Path) -> None:
    """Every test gets its own ledger, runs and state, never the user's ~/.cpudist, but shares the
    session's token cache (its folder a link to `session_tokens`): this machine's runs on the same
    rows tokenize them once, as one user's runs do. Tokenizing is not what most runs test: MRPC's
    4,076 rows cost a rank ~1.3 s of CPU cold, next to ~0.3 s read back, and a rank of every local
    run of the suite paid it. A test marked `own_token_cache` starts with an empty one (the cache's
    miss then hit: test_run_local.py). Nodes of the namespace worlds keep their own homes and
    caches, as separate machines do. The home lies beside the test's tmp_path, not in it: a test may
    list its tmp_path."""
    home = tmp_path_factory.mktemp("cpudist-home")
    monkeypatch.setenv("CPUDIST_HOME", str(home))
    if request.node.get_closest_marker("own_token_cache") is None:
        from cpudist import state

        cache = state.token_cache_dir()
        assert home in cache.parents, cache
        cache.parent.mkdir()
        cache.symlink_to(session_tokens, target_is_directory=True)


# CI (.ci/run exports CPUDIST_CI=1; any value but empty or 0 turns it on): a skip hides a test as
# well as a deletion does, and a CI machine is set up to run every test (root,
# tests/harness/setup.sh, the shared data, at least 2 cores). So the session fails on every skip but
# the ones below, naming each. A developer's run (no CPUDIST_CI) skips freely: not root, no Slurm,
# no MPI venvs.
CI = os.environ.get("CPUDIST_CI", "") not in ("", "0")


@dataclass(frozen=True)
class AllowedSkip:
    """A skip a CI machine may take: a test under `where` (a node id prefix) whose reason matches
    `pattern`, on a machine where `applies()` holds; `why` says why it may."""

    where: str
    pattern: str
    applies: Callable[[], bool]
    why: str


ALLOWED_SKIPS = (
    # One of the real-quota tests (v1, v2) cannot run on any given kernel.
    AllowedSkip(
        "tests/integration/test_threads_cgroup.py::test_a_ranks_threads_follow_its_cgroup_quota[2]",
        r"^cgroup v1 holds the cpu controller", lambda: cpu_controller_version() == 1,
        "the kernel gave the cpu controller to cgroup v1 (as here), so no cgroup2 group has "
        "cpu.max; the v1 test and the v2 layout test run instead"),
    AllowedSkip(
        "tests/integration/test_threads_cgroup.py::test_a_ranks_threads_follow_its_cgroup_quota[1]",
        r"^cgroup v2 holds the cpu controller", lambda: cpu_controller_version() == 2,
        "a v2-only machine (stock Debian 12) has no cgroup v1 cpu controller; the v2 test "
        "runs instead"),
)
# Every other skip in tests/ means the CI machine lacks what it is set up with, so none is listed:
# not root, no sshd/ip/tc/nsenter/unshare/iptables (the namespace hosts), no cgroup cpu+cpuset
# controllers (test_capped), no Slurm or munge, no Intel MPI or Open MPI venv
# (tests/harness/setup.sh installs them all), fewer than 2 physical cores (test_capped,
# test_torchrun_hosts, test_threads_cgroup), no shared data beside the repository, no CPU topology
# in sysfs (test_cpu_and_dist). On the development machine (root, setup.sh run, v1 cpu controller)
# the only skip is test_threads_cgroup's v2 case, allowed above.


def allowed(nodeid: str, reason: str) -> AllowedSkip | None:
    """The allowlist entry that admits this test's skip with this reason on this machine, if any."""
    return next((a for a in ALLOWED_SKIPS if nodeid.startswith(a.where)
                 and re.search(a.pattern, reason)
                 and a.applies()), None)


def skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The reason pytest recorded for a skip (its longrepr is (file, line, 'Skipped: reason'))."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


_unexpected: list[str] = []
_accepted: list[str] = []


def _note(report: pytest.CollectReport | pytest.TestReport) -> None:
    # an xfail is reported as skipped; it is not one
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    entry = allowed(report.nodeid, reason)
    (_accepted if entry else _unexpected).append(f"{report.nodeid}: {reason}" +
                                                 (f" (allowed: {entry.why})" if entry else ""))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note(report)  # a module that skips itself while being collected


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if CI and _unexpected and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not CI or not (_unexpected or _accepted):
        return
    if _accepted:
        terminalreporter.section("skips allowed on CI (tests/conftest.py ALLOWED_SKIPS)")
        for line in _accepted:
            terminalreporter.line(line)
    if _unexpected:
        terminalreporter.section("skips not allowed on CI: the session fails (tests/conftest.py "
                                 "ALLOWED_SKIPS)",
                                 red=True)
        for line in _unexpected:
            terminalreporter.line(line, red=True)
