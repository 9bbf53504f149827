"""`cluster down`: remove everything tagged with the cluster, and this machine's record of it.

Only what carries the cluster's tag is removed: a user's own key pair, group or placement group under
the name `cpudist-NAME` is left alone (the provider checks the tag before each removal).
"""

from __future__ import annotations

from cpudist import state
from cpudist.cloud.cluster import Say
from cpudist.cloud.lock import cluster_lock
from cpudist.cloud.provider import Inventory, Provider
from cpudist.interrupts import shielded


def down(cloud: Provider, name: str, keep_image: bool, say: Say) -> Inventory:
    """Remove everything tagged with the cluster: instances, group, placement group, key, images; forget it."""
    with cluster_lock(name):
        found = cloud.inventory(name)
        say(f"terminating {len(found.instances)} instance(s)")
        with shielded(lambda: say("finishing the removal first; it stops by itself")):
            removed = cloud.remove(name, images=not keep_image)
            state.remove_cluster_dir(name)  # the key, the record and the pinned host keys
    return removed
