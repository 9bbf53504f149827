"""`--on-preemption resume`: when the ranks stop for a reclaimed node, replace it and go on from the
checkpoint."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from cpudist.errors import Preempted
from cpudist.results.schema import RunResult
from cpudist.run import remote
from cpudist.run.request import Callbacks, RunRequest
from cpudist.run.where import Where, recover_cluster

MAX_RECOVERIES = 3
RECLAIM_WAIT_S = 150.0  # AWS gives two minutes' notice before it reclaims a spot instance


def run_remote(request: RunRequest, where: Where, ledger: Path, cb: Callbacks) -> RunResult:
    """A remote run; with `where.recover`, each stop replaces the lost nodes (`cluster up`) and
    resumes."""
    assert where.head is not None
    head, lost = where.head, list[float]()
    while True:
        try:
            launched = dataclasses.replace(request.launched, recoveries=len(lost),
                                           time_lost_s=round(sum(lost), 1))
            return remote.run(dataclasses.replace(request, launched=launched), head, ledger, cb)
        except Preempted as e:
            if not where.recover or where.cluster is None:
                raise
            if len(lost) >= MAX_RECOVERIES:
                raise Preempted(f"{e.message}; gave up after {MAX_RECOVERIES} recoveries") from None
            stopped = time.monotonic()
            cb.on_line(f"[cpudist] {e.what}: recovering ({len(lost) + 1}/{MAX_RECOVERIES})")
            head = recover_cluster(where.cluster, request.launch.nodes, head, RECLAIM_WAIT_S,
                                   cb.on_line)
            request = request.with_train(resume="auto", resume_required=True)  # never from step 0
            lost.append(time.monotonic() - stopped)
