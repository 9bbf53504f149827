"""After a spot notice: wait for the reclaimed node to go, then converge like `cluster up` (replace
it)."""

from __future__ import annotations

from cpudist.cloud.access import NodeAccess
from cpudist.cloud.cluster import Say, price_of, spec_of
from cpudist.cloud.provider import Provider
from cpudist.cloud.record import ClusterRecord
from cpudist.cloud.up import up
from cpudist.errors import CpudistError
from cpudist.waits import wait_until


def recover(cloud: Provider, record: ClusterRecord, wait_gone_s: float, ssh: NodeAccess,
            say: Say) -> ClusterRecord:
    """Wait (up to `wait_gone_s`) for a node to go, then converge like `up` (replace it) over `ssh`.
    `cloud` is the record's place (`connect(record.place)`): where the cluster was made."""
    spec = spec_of(record)
    ids = [n.instance_id for n in record.nodes]

    def gone() -> list[str] | None:
        left = {n.instance_id for n in cloud.describe(ids) if n.state == "running"}
        lost = [i for i in ids if i not in left]
        return lost or None

    try:
        lost = wait_until(gone, "a reclaimed node to go", wait_gone_s, interval_s=2.0)
        say(f"node(s) {', '.join(lost)} of cluster {record.name} are gone: replacing them")
    except CpudistError:
        say(f"every node of cluster {record.name} is still running after {wait_gone_s:g}s: "
            "resuming on them")
    return up(cloud, spec, price_of(cloud, spec), ssh, say)
