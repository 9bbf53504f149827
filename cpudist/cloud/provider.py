"""The provider verbs: everything cloud/ (cluster up, down, recover; image bakes) asks of a cloud.

    instances  launch (spot, with on-demand fallback when allowed), number, wait, describe,
               terminate, start, nodes (a cluster's, by tag), of_run (a run's, by tag), tagged
               (every cluster's), foreign (in a group, not the cluster's), this_instance (the one
               this process runs on), builder and console (an image bake), image,
               cluster_image (a clone of node 0)
    network    subnet, key_pair, security_group, placement_group: each get-or-create, each refusing
               a resource of the same name that lacks cpudist's tag for the owner
    cleanup    inventory (what carries an owner's tag, or one run's) and remove (only what carries
               it)
    prices     price (spot from the market, else on-demand), on_demand
    images     newest_image (the newest `ami build` image of a version), base_image (the OS to
               bake on)

cloud/aws/provider.py (Ec2) is the one implementation; `cpudist.cloud.connect` makes one for a
`Place`. cli/ and run/ reach a cloud through these verbs only (tests/unit/test_layers.py checks that
they import nothing from cloud/aws). The records passed between the verbs are provider-neutral.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Place:
    """Where a cloud's resources live and which credentials reach them: recorded with a cluster, so
    every later command talks to the same account, region and endpoint whatever the environment says
    then."""

    region: str | None = None  # None: the profile's, AWS_DEFAULT_REGION, else us-east-1
    endpoint_url: str | None = None  # None: the environment's (AWS_ENDPOINT_URL), else AWS itself
    profile: str | None = None  # None: AWS_PROFILE, else boto3's default chain
    # resolved (a record's): the environment's region, endpoint and profile no longer count
    pinned: bool = False


@dataclass(kw_only=True, frozen=True)
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


@dataclass(kw_only=True, frozen=True)
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


@dataclass(frozen=True)
class Subnet:
    subnet_id: str
    vpc_id: str
    zone: str
    cidr: str


@dataclass(frozen=True)
class KeyInfo:
    """The key pair instances boot with, and where its private half lives."""

    name: str
    private_key: Path


@dataclass(kw_only=True, frozen=True)
class KeyRequest:
    """The key pair a cluster (or a bake) asks for: the user's (`key_name` + `identity`), or one
    cpudist makes with `new_key(comment) -> (private, public)` and keeps in `folder`."""

    owner: str
    folder: Path
    run_id: str
    new_key: Callable[[str], tuple[str, str]]
    key_name: str | None = None
    identity: Path | None = None


@dataclass(frozen=True)
class Price:
    """Per instance and hour, in USD, with where the number came from."""

    usd_per_hour: float | None
    source: str

    def total(self, nodes: int) -> float | None:
        return None if self.usd_per_hour is None else self.usd_per_hour * nodes


@dataclass(frozen=True)
class Inventory:
    """What carries an owner's tag (a cluster's, or a bake's), by kind."""

    instances: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()
    placement_group: str | None = None
    key_pair: str | None = None
    images: tuple[str, ...] = field(default=())

    def listed(self) -> list[str]:
        """Every resource, in the order `down` removes them."""
        return [*self.instances, *self.security_groups,
                *filter(None, (self.placement_group, self.key_pair)), *self.images]


class Provider(Protocol):
    """A cloud's verbs (over its own client); every resource it makes carries its owner's and run's
    tags."""

    @property
    def place(self) -> Place:
        """Where its resources live, resolved (pinned): what a cluster's record keeps."""

    def launch(self, spec: LaunchSpec, indices: list[int]) -> list[Node]:
        """Instances for node `indices`, each tagged with its index and `spec.run_id`."""

    def wait(self, ids: list[str], state: str, timeout_s: float) -> list[Node]:
        """Wait until every instance is in `state`; the instances then."""

    def describe(self, ids: list[str]) -> list[Node]:
        """The instances `ids`, in any state (a terminated one while the cloud still lists it)."""

    def terminate(self, ids: list[str]) -> None:
        """Terminate the instances and wait until they are."""

    def number(self, cluster: str, instance_id: str, index: int) -> None:
        """Give a cluster's instance its node index (one launched without it: a kill or a failure
        right after the launch)."""

    def start(self, ids: list[str]) -> None:
        """Start stopped instances."""

    def nodes(self, cluster: str, role: str | None = "node") -> list[Node]:
        """The cluster's live instances (of `role`, or all), in node order."""

    def of_run(self, run_id: str) -> list[Node]:
        """The live instances one run launched (also those whose launch answer was lost)."""

    def tagged(self) -> list[Node]:
        """Every live instance that carries a cluster's tag."""

    def this_instance(self, imds: str) -> str | None:
        """The instance this process runs on, as the metadata service `imds` says (auto: the
        cloud's own, asked only where this machine is one of its instances; off: none; else a
        URL); None where there is none to ask. One asked that does not answer: CpudistError."""

    def foreign(self, cluster: str, group_id: str) -> list[str]:
        """Live instances in the cluster's security group that are not the cluster's."""

    def builder(self, owner: str, image_id: str, instance_type: str, subnet: Subnet, user_data: str,
                key: str, group: str, run_id: str) -> Node:
        """A throw-away on-demand instance that runs `user_data` (an image bake)."""

    def console(self, instance_id: str) -> str:
        """The instance's console output."""

    def image(self, instance_id: str, owner: str, name: str, run_id: str, **tags: str) -> str:
        """An image of `instance_id`, tagged with `owner`, `run_id` and `tags`; its id once
        available."""

    def subnet(self, subnet_id: str | None) -> Subnet:
        """The given subnet, else the default network's first."""

    def key_pair(self, request: KeyRequest) -> KeyInfo:
        """The user's key pair, or the owner's (get-or-create)."""

    def security_group(self, owner: str, vpc_id: str, ssh_cidr: str, run_id: str) -> str:
        """The owner's group (get-or-create): SSH from `ssh_cidr`, all traffic from itself, nothing
        else."""

    def placement_group(self, owner: str, run_id: str) -> str:
        """The owner's placement group (get-or-create), strategy `cluster`."""

    def inventory(self, owner: str, run_id: str | None = None) -> Inventory:
        """What carries the owner's tag (and the run's, when given)."""

    def remove(self, owner: str, run_id: str | None = None, images: bool = True) -> Inventory:
        """Remove what carries the owner's tag (and the run's, when given); instances first. What
        was removed."""

    def price(self, instance_type: str, spot: bool, zone: str | None) -> Price:
        """The hourly price: spot from the market when `spot` (and known), else on-demand."""

    def on_demand(self, instance_type: str) -> Price:
        """The on-demand hourly price."""

    def cluster_image(self, cluster: str) -> str | None:
        """The newest available image cloned from the cluster's node 0 (--clone-from-first)."""

    def newest_image(self, version: str) -> str | None:
        """The newest image `cpudist ami build` made for cpudist `version`, if any."""

    def base_image(self) -> str:
        """The operating system image a bake starts from."""
