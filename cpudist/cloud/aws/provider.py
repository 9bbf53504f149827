"""The provider verbs (cpudist/cloud/provider.py) on EC2, over one boto3 client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpudist.cloud.aws import images as amis
from cpudist.cloud.aws import instances, network, notice, pricing
from cpudist.cloud.aws.client import DEFAULT_REGION, call, ec2_client, resolve, ssm_client
from cpudist.cloud.aws.tags import CLUSTER_TAG
from cpudist.cloud.provider import (
    Inventory,
    KeyInfo,
    KeyRequest,
    LaunchSpec,
    Node,
    Place,
    Price,
    Subnet,
)

IMAGE_TIMEOUT_S = 1800.0  # create_image's own default
UBUNTU_PARAMETER = (
    "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id")


@dataclass(frozen=True)
class Ec2:
    """cloud/'s Provider on AWS EC2 (or any EC2-compatible endpoint the client points at)."""

    ec2: Any
    place: Place

    @classmethod
    def connect(cls, place: Place) -> Ec2:
        """A provider for `place`: its region, endpoint and profile resolved, so a record can keep
        them."""
        resolved = resolve(place)
        return cls(ec2_client(resolved), resolved)

    def launch(self, spec: LaunchSpec, indices: list[int]) -> list[Node]:
        return instances.launch_nodes(self.ec2, spec, indices)

    def wait(self, ids: list[str], state: str, timeout_s: float) -> list[Node]:
        return instances.wait_state(self.ec2, ids, state, timeout_s)

    def describe(self, ids: list[str]) -> list[Node]:
        return instances.describe(self.ec2, [{"Name": "instance-id", "Values": ids}])

    def terminate(self, ids: list[str]) -> None:
        instances.terminate(self.ec2, ids)

    def number(self, cluster: str, instance_id: str, index: int) -> None:
        instances.number(self.ec2, cluster, instance_id, index)

    def start(self, ids: list[str]) -> None:
        instances.start(self.ec2, ids)

    def nodes(self, cluster: str, role: str | None = "node") -> list[Node]:
        return instances.find_nodes(self.ec2, cluster, role)

    def of_run(self, run_id: str) -> list[Node]:
        return instances.of_run(self.ec2, run_id)

    def tagged(self) -> list[Node]:
        return instances.describe(self.ec2, [{"Name": "tag-key", "Values": [CLUSTER_TAG]},
                                            {"Name": "instance-state-name",
                                             "Values": instances.LIVE_STATES}])

    def this_instance(self, imds: str) -> str | None:
        endpoint = notice.imds_endpoint(imds)
        return notice.fetch_instance_id(endpoint) if endpoint else None

    def foreign(self, cluster: str, group_id: str) -> list[str]:
        return instances.foreign_in_group(self.ec2, cluster, group_id)

    def builder(self, owner: str, image_id: str, instance_type: str, subnet: Subnet, user_data: str,
                key: str, group: str, run_id: str) -> Node:
        return instances.launch_builder(self.ec2, owner, image_id, instance_type, subnet.subnet_id,
                                        user_data, key, group, run_id)

    def console(self, instance_id: str) -> str:
        return instances.console_output(self.ec2, instance_id)

    def image(self, instance_id: str, owner: str, name: str, run_id: str, **tags: str) -> str:
        return amis.create_image(self.ec2, instance_id, owner, name, run_id,
                                 timeout_s=IMAGE_TIMEOUT_S, **tags)

    def subnet(self, subnet_id: str | None) -> Subnet:
        return network.resolve_subnet(self.ec2, subnet_id)

    def key_pair(self, request: KeyRequest) -> KeyInfo:
        return network.ensure_key_pair(self.ec2, request)[0]

    def security_group(self, owner: str, vpc_id: str, ssh_cidr: str, run_id: str) -> str:
        return network.ensure_security_group(self.ec2, owner, vpc_id, ssh_cidr, run_id)[0]

    def placement_group(self, owner: str, run_id: str) -> str:
        return network.ensure_placement_group(self.ec2, owner, run_id)[0]

    def inventory(self, owner: str, run_id: str | None = None) -> Inventory:
        made = self.of_run(run_id) if run_id else self.nodes(owner, role=None)
        name = network.resource_name(owner)
        return Inventory(
            instances=tuple(n.instance_id for n in made if n.cluster == owner),
            security_groups=tuple(g["GroupId"]
                                  for g in network.security_groups(self.ec2, owner, run_id)),
            placement_group=name if network.placement_group_exists(self.ec2, owner, run_id)
            else None,
            key_pair=name if network.key_pair_exists(self.ec2, owner, run_id) else None,
            images=tuple(i["ImageId"] for i in amis.owned_images(self.ec2, owner, run_id)))

    def remove(self, owner: str, run_id: str | None = None, images: bool = True) -> Inventory:
        found = self.inventory(owner, run_id)
        self.terminate(list(found.instances))
        removed = amis.delete_images(self.ec2, owner, run_id) if images else []
        network.delete_placement_group(self.ec2, owner, run_id)
        network.delete_security_group(self.ec2, owner, run_id)
        network.delete_key_pair(self.ec2, owner, run_id)
        return Inventory(found.instances, found.security_groups, found.placement_group,
                         found.key_pair, tuple(removed))

    def price(self, instance_type: str, spot: bool, zone: str | None) -> Price:
        return pricing.hourly_price(self.ec2, instance_type, self.place.region or DEFAULT_REGION,
                                    spot, zone)

    def on_demand(self, instance_type: str) -> Price:
        return pricing.on_demand_price(instance_type, self.place.region or DEFAULT_REGION)

    def cluster_image(self, cluster: str) -> str | None:
        return amis.newest_clone(self.ec2, cluster)

    def newest_image(self, version: str) -> str | None:
        return amis.newest_base_image(self.ec2, version)

    def base_image(self) -> str:
        """The current Ubuntu 24.04 LTS AMI of the region, from Canonical's public SSM parameter."""
        ssm = ssm_client(self.place)
        return str(call(ssm.get_parameter, Name=UBUNTU_PARAMETER)["Parameter"]["Value"])
