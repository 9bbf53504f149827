"""The provider verbs: what cloud/ (cluster up, down, recover; image bakes) asks of a cloud's instances.

    launch     instances for node indices in one call (spot, with on-demand fallback when allowed)
    wait       until every instance is in a state (one that dies on the way is an error)
    describe   instances by id, in any state
    terminate  instances, waiting until they are gone
    image      an image of an instance, tagged with its owner and run, once it is available

cloud/aws/provider.py (Ec2) is the one implementation. The records passed between the verbs are
provider-neutral (Node, LaunchSpec). What else a cluster needs of its cloud (the network pieces:
subnet, key pair, security group, placement group; finding and removing what carries a cluster's or a
run's tag; prices) is still called on cloud/aws directly by up, down and the bake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Node:
    """One instance of a cluster."""

    instance_id: str
    index: int
    role: str
    state: str
    private_ip: str | None
    public_ip: str | None
    lifecycle: str  # spot | on-demand
    launch_time: str
    image_id: str
    instance_type: str
    security_groups: tuple[str, ...]
    cluster: str | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """What every node of a cluster is launched with."""

    cluster: str
    image_id: str
    instance_type: str
    key_name: str
    security_group: str
    subnet_id: str
    placement_group: str | None
    spot: bool
    max_price: str | None
    on_demand_fallback: bool
    user_data: str | None = None
    run_id: str = ""


class Provider(Protocol):
    """A cloud's instance verbs (over its own client)."""

    def launch(self, spec: LaunchSpec, indices: list[int]) -> list[Node]:
        """Instances for node `indices`, each tagged with its index and `spec.run_id`."""

    def wait(self, ids: list[str], state: str, timeout_s: float) -> list[Node]:
        """Wait until every instance is in `state`; the instances then."""

    def describe(self, ids: list[str]) -> list[Node]:
        """The instances `ids`, in any state (a terminated one while the cloud still lists it)."""

    def terminate(self, ids: list[str]) -> None:
        """Terminate the instances and wait until they are."""

    def image(self, instance_id: str, owner: str, name: str, run_id: str, **tags: str) -> str:
        """An image of `instance_id`, tagged with `owner`, `run_id` and `tags`; its id once available."""
