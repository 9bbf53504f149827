"""`cpudist sweep` over 2 network-namespace hosts from the head: the series, its report and plot.

Needs root, iproute2 and openssh-server (tests/harness/setup.sh installs them; CI runs as root).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist import state
from cpudist.results.ledger import read_ledger
from tests.harness.netns import NetnsCluster, missing_requirements
from tests.integration.helpers import CPUDIST, keyed_hosts

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]



@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    """Two hosts with the cluster key set up, as `hosts ssh-setup` leaves them."""
    with keyed_hosts(2, tmp_path_factory.mktemp("pair"), "rpt") as c:
        yield c


def on_head(c: NetnsCluster, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """cpudist on the head (whose working directory is /: give absolute paths)."""
    return c.run(0, [*CPUDIST, *map(str, args)], timeout=240)


def sweep_args(data: Path, hostfile: Path, out: Path) -> list[str | Path]:
    return ["sweep", "mrpc", "--nodes", "1,2", "--ppn", "1", "--hostfile", hostfile, "--data-dir",
            data / "glue" / "MRPC", "--model", "tiny", "--max-steps", "3", "--no-eval",
            "--output-dir", out]


def test_sweep_runs_each_count_reports_and_plots(pair: NetnsCluster, shared_data: Path,
                                                 tmp_path: Path) -> None:
    r = on_head(pair, *sweep_args(shared_data, pair.hostfile, tmp_path / "sweep"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    header = next(line for line in r.stdout.splitlines() if "speedup" in line)
    assert "efficiency" in header and "sync=ddp" in r.stdout
    rows = [line for line in r.stdout.splitlines() if re.match(r"^│ [12] +│ [12] +│ 1 +│", line)]
    assert len(rows) == 2 and "1.00x" in rows[0], r.stdout
    # each run's summary: progress, not the report
    assert "done: mrpc tiny on 2 rank(s), 2 node(s)" in r.stderr
    ledger = read_ledger(state.ledger_path())
    assert [r.nodes for r in ledger] == [(pair.name(0),), (pair.name(0), pair.name(1))]
    assert [Path(r.run_dir) for r in ledger] == [tmp_path / "sweep" / "nodes1",
                                                 tmp_path / "sweep" / "nodes2"]
    plotted = on_head(pair, "report", "--plot", tmp_path / "s.png")
    assert plotted.returncode == 0, plotted.stderr
    assert ((tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            and "1.00x" in plotted.stdout)


def test_a_failed_run_stops_the_series_naming_its_count(pair: NetnsCluster, shared_data: Path,
                                                        tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    # nobody answers there: the 2-node run fails fast
    hostfile.write_text(f"{pair.name(0)}\n198.18.0.99\n")
    r = on_head(pair, *sweep_args(shared_data, hostfile, tmp_path / "sweep"), "--format", "md")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: sweep stopped: the run on 2 node(s) failed: cannot reach "
                           "198.18.0.99")
    table = [line for line in r.stdout.splitlines() if line.startswith("| 1 | 1 |")]
    assert len(table) == 1 and "| speedup |" in r.stdout  # the report of the run that finished
    assert [len(r.nodes) for r in read_ledger(state.ledger_path())] == [1]
