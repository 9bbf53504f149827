"""`cluster down`: remove everything tagged with the cluster, and this machine's record of it."""

from __future__ import annotations

from typing import Any

from cpudist import state
from cpudist.cloud.aws import images, instances, network
from cpudist.cloud.aws.provider import Ec2
from cpudist.cloud.cluster import Say
from cpudist.interrupts import shielded


def inventory(ec2: Any, name: str) -> dict[str, Any]:
    """Everything tagged with the cluster, by kind (what `down` would remove)."""
    return {"instances": [n.instance_id for n in instances.find_nodes(ec2, name, role=None)],
            "security_groups": [g["GroupId"] for g in network.security_groups(ec2, name)],
            "placement_group": network.resource_name(name) if network.placement_group_exists(ec2, name) else None,
            "key_pair": network.resource_name(name) if network.key_pair_exists(ec2, name) else None,
            "images": [i["ImageId"] for i in images.owned_images(ec2, name)]}


def down(ec2: Any, name: str, keep_image: bool, say: Say) -> dict[str, Any]:
    """Remove everything tagged with the cluster: instances, group, placement group, key, images; forget it."""
    removed = inventory(ec2, name)
    say(f"terminating {len(removed['instances'])} instance(s)")
    with shielded(lambda: say("finishing the removal first; it stops by itself")):
        Ec2(ec2).terminate(removed["instances"])
        network.delete_security_group(ec2, name)
        network.delete_placement_group(ec2, name)
        network.delete_key_pair(ec2, network.resource_name(name))
        removed["images"] = [] if keep_image else images.delete_images(ec2, name)
        state.remove_cluster_dir(name)  # the key, the record and the pinned host keys
    return removed
