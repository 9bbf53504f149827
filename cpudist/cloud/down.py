"""`cluster down`: remove everything tagged with the cluster, and this machine's record of it.

Only what carries the cluster's tag is removed: a user's own key pair, group or placement group
under the name `cpudist-NAME` is left alone (the provider checks the tag before each removal).

It never runs on one of the cluster's own nodes: it would terminate the machine it runs on
first, and the group and key (removable only once every instance is gone) would stay behind.
Which instance this machine is comes from the metadata service; where none answers (a laptop
has none), the machine counts as outside the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

from cpudist import state
from cpudist.cloud.cluster import Say
from cpudist.cloud.lock import cluster_lock
from cpudist.cloud.provider import Inventory, Provider
from cpudist.errors import BadInput, CpudistError
from cpudist.interrupts import shielded


def this_node(cloud: Provider, imds: str, say: Say) -> str | None:
    """The instance this process runs on; None where no metadata service says (in a line when
    the one asked did not answer): this machine then counts as outside every cluster."""
    try:
        return cloud.this_instance(imds)
    except CpudistError as e:
        say(f"could not tell which instance this machine is ({e.what}): "
            "taking it to be outside the cluster")
        return None


def check_outside(name: str, instances: Sequence[str], here: str | None) -> None:
    """Refuse to remove cluster `name` from `here`, one of its own instances."""
    if here is not None and here in instances:
        raise BadInput(f"this machine is {here}, a node of cluster {name}: `cluster down` "
                       "would terminate it first and leave the rest behind",
                       f"Run `cpudist cluster down --name {name}` from a machine outside the "
                       "cluster (where `cluster up` ran, e.g. your laptop)")


def down(cloud: Provider, name: str, keep_image: bool, say: Say,
         here: str | None = None) -> Inventory:
    """Remove everything tagged with the cluster: instances, group, placement group, key,
    images; forget it. `here`: the instance this runs on (`this_node`), refused if the cluster's."""
    with cluster_lock(name):
        found = cloud.inventory(name)
        check_outside(name, found.instances, here)
        say(f"terminating {len(found.instances)} instance(s)")
        with shielded(lambda: say("finishing the removal first; it stops by itself")):
            removed = cloud.remove(name, images=not keep_image)
            state.remove_cluster_dir(name)  # the key, the record and the pinned host keys
    return removed
