"""The mark of how much of a detached run's head log its local cpudist.log holds
(run/life/headlog.py): the next follower (`logs -f`) reads on from there. The following itself:
test_remote_onprem's detached-run test."""

from __future__ import annotations

import json
from pathlib import Path

from cpudist.run.life.headlog import HEAD_LOG_MARK, read_mark, write_mark

LOG = "/root/.cpudist/runs/r-20261126-171500-ab12/agent.log"


def test_the_mark_is_per_head_log_and_anything_unreadable_is_the_start(tmp_path: Path) -> None:
    mark = tmp_path / HEAD_LOG_MARK
    assert read_mark(mark, LOG) == 0  # none yet
    write_mark(mark, LOG, 4096)
    assert read_mark(mark, LOG) == 4096
    write_mark(mark, LOG, 5000)
    # replaced whole, no temp left
    assert read_mark(mark, LOG) == 5000 and not list(tmp_path.glob(".*"))
    # another run's log: from its start
    assert read_mark(mark, "/root/.cpudist/runs/other/agent.log") == 0
    for garbage in ("", "{", "[1]", json.dumps({"log": LOG, "offset": "12"}),
                    json.dumps({"log": LOG, "offset": -3})):
        mark.write_text(garbage)
        assert read_mark(mark, LOG) == 0, garbage
