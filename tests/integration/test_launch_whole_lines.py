"""`cpudist launch` hands the user whole lines, each tagged with one rank, whatever pieces the
script prints them in: every rank writes each of its lines word by word (a write each, flushed,
yielding the CPU in between) on stdout and stderr at once, on this machine through Hydra and through
one torchrun per node (whose workers share its stdout), and across two network-namespace hosts
through one torchrun per node and through torchrun's own agent per host."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.run.rank_lines import TAGGED
from tests.harness.netns import NetnsCluster, missing_requirements
from tests.integration.helpers import CPUDIST, cpudist, keyed_hosts

pytestmark = pytest.mark.slow
LINES = 30
WORDS = "~a ~b ~c ~d ~e ~f ~g ~h ~i ~j ~k ~l ~m ~n ~o ~p"  # "~": a piece of the script's
SCRIPT = f'''
import os, sys, time
rank = os.environ["RANK"]
for i in range({LINES}):
    for stream, first in ((sys.stdout, "~out"), (sys.stderr, "~err")):
        for word in (first, rank, str(i), *"{WORDS}".split()):
            stream.write(word + " ")
            stream.flush()
            time.sleep(0)
    print("~end")
    print("~end", file=sys.stderr)
'''
# A line as the user gets it: [host] from torchrun's agent per host, then one rank's tag, then the
# line whole
WHOLE = re.compile(rf"(?:\[[\w.-]+\] )?\[[\w.-]+:(\d+)\] (~out|~err) \1 (\d+) {WORDS} ~end")


def check_whole(text: str, ranks: int) -> None:
    """Every line the script printed came whole, once, with its own rank's tag and no other."""
    mine = [line for line in text.splitlines() if "~" in line]
    assert all(WHOLE.fullmatch(line) and len(TAGGED.findall(line)) == 1 for line in mine), \
        [line for line in mine if not WHOLE.fullmatch(line)][:5]
    got = Counter((m.group(1), m.group(2)) for m in map(WHOLE.fullmatch, mine) if m)
    assert got == Counter({(str(r), s): LINES for r in range(ranks)
                           for s in ("~out", "~err")}), text[-2000:]


@pytest.mark.parametrize("per_node", [False, True], ids=["hydra", "torchrun-per-node"])
def test_every_rank_line_comes_whole_and_tagged_on_this_machine(tmp_path: Path,
                                                                per_node: bool) -> None:
    (tmp_path / "pieces.py").write_text(SCRIPT)
    r = cpudist("launch", "--np", "2", *(["--per-node"] if per_node else []), "--output-dir",
                tmp_path / "run", "--ledger", tmp_path / "ledger.jsonl", "--workdir", tmp_path,
                "--", "python", "pieces.py", timeout=240)
    assert r.returncode == 0, r.stderr
    check_whole(r.stderr, 2)
    check_whole((tmp_path / "run" / "ranks.log").read_text(), 2)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    if missing_requirements() is not None:
        pytest.skip(str(missing_requirements()))
    with keyed_hosts(2, tmp_path_factory.mktemp("lines"), "wl") as c:
        yield c


@pytest.mark.parametrize("route", [["--per-node"], ["--launcher", "torchrun"]],
                         ids=["per-node", "torchrun-agents"])
def test_every_rank_line_comes_whole_and_tagged_across_hosts(hosts: NetnsCluster, tmp_path: Path,
                                                             route: list[str]) -> None:
    (tmp_path / "pieces.py").write_text(SCRIPT)
    tmp_path.chmod(0o755)
    r = hosts.run(0,
                  [*CPUDIST, "launch", "--np", "4", "--ppn", "2", "--hostfile", str(hosts.hostfile),
                   *route, "--output-dir", str(tmp_path / "run"), "--ledger",
                   str(tmp_path / "ledger.jsonl"), "--workdir", str(tmp_path), "--", "python",
                   "pieces.py"], timeout=300)
    assert r.returncode == 0, r.stderr
    check_whole(r.stderr, 4)
