"""A run started on the head itself (issue 23 items 1 and 3), one cheap run on two namespace hosts:

- its data lies in the head's own ~/.cpudist (the other host does not see it: no shared filesystem),
  and rank 1 on the other host reads it all the same (staged from the head; before, "data directory
  not found");
- `--secret` and `--env-file` values reach every rank (the file's CPUDIST_THREADS=3 sizes both
  ranks' threads) while `ps` on every node never shows the token, and no file cpudist leaves behind
  holds it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.netns import missing_requirements
from tests.harness.world import World
from tests.integration.helpers import CPUDIST, cmdline, on_prem_site

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
TOKEN = "tok-4b1d9e07c2"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Iterator[World]:
    """Two hosts that reach each other with the cluster key; MRPC in the head's ~/.cpudist only."""
    with on_prem_site(2, tmp_path_factory.mktemp("site"), "chs") as w:
        copy = w.hosts.run(0,
                           ["sh", "-c",
                            f"mkdir -p ~/.cpudist/mine && cp -r {shared_data}/glue/MRPC "
                            "~/.cpudist/mine/"])
        assert copy.returncode == 0, copy.stderr
        yield w


def _watch_ps(seen: list[str], stop: threading.Event) -> None:
    """Every process's command line (the hosts share the PID namespace: `ps` of every node), while
    the run goes."""
    while not stop.wait(0.2):
        for pid in os.listdir("/proc"):
            if pid.isdigit() and TOKEN in (line := cmdline(int(pid))):
                seen.append(line)


def test_a_run_from_the_head_stages_its_inputs_and_keeps_secrets_off_every_line(
        site: World, tmp_path: Path) -> None:
    env_file = tmp_path / "ranks.env"
    env_file.write_text("CPUDIST_THREADS=3\n")
    out = tmp_path / "run"
    seen: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_ps, args=(seen, stop), daemon=True)
    watcher.start()
    try:
        r = site.hosts.run(0,
                           ["env", f"CPD_TOKEN={TOKEN}", *CPUDIST, "run", "mrpc", "--np", "2",
                            "--ppn", "1", "--hostfile", str(site.state / "site-hostfile"),
                            "--model", "tiny", "--data-dir", "/root/.cpudist/mine/MRPC",
                            "--max-steps", "3", "--max-eval-samples", "32", "--secret", "CPD_TOKEN",
                            "--env-file", str(env_file), "--output-dir", str(out)])
    finally:
        stop.set()
        watcher.join()
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert sorted(result["nodes"]) == [site.hosts.name(0), site.hosts.name(1)]
    assert result["rank_threads"] == [3, 3]  # both ranks read the secrets file of their own node
    # data (+ tokenizer)
    assert result["staging"]["from"] == "head" and result["staging"]["copies_to_nodes"] >= 1
    assert "input(s) on 1 other node(s)" in r.stderr
    assert seen == [], seen[:3]  # the ssh/env lines between the head and the ranks
    # no file left holding the token: run folder, either node's ~/.cpudist (its secrets gone)
    for i in range(2):
        grep = site.hosts.run(i, ["grep", "-rl", TOKEN, str(out), "/root/.cpudist"])
        assert grep.returncode == 1 and grep.stdout == "", grep.stdout
        left = site.hosts.run(i, ["sh", "-c", "ls -A ~/.cpudist/secrets 2>/dev/null"])
        assert left.stdout == "", left.stdout
