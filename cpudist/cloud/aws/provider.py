"""The provider verbs (cpudist/cloud/provider.py) on EC2, over one boto3 client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpudist.cloud.aws import images, instances
from cpudist.cloud.provider import LaunchSpec, Node

IMAGE_TIMEOUT_S = 1800.0  # create_image's own default


@dataclass(frozen=True)
class Ec2:
    """cloud/'s Provider on AWS EC2 (or any EC2-compatible endpoint the client points at)."""

    ec2: Any

    def launch(self, spec: LaunchSpec, indices: list[int]) -> list[Node]:
        return instances.launch_nodes(self.ec2, spec, indices)

    def wait(self, ids: list[str], state: str, timeout_s: float) -> list[Node]:
        return instances.wait_state(self.ec2, ids, state, timeout_s)

    def describe(self, ids: list[str]) -> list[Node]:
        return instances.describe(self.ec2, [{"Name": "instance-id", "Values": ids}])

    def terminate(self, ids: list[str]) -> None:
        instances.terminate(self.ec2, ids)

    def image(self, instance_id: str, owner: str, name: str, run_id: str, **tags: str) -> str:
        return images.create_image(self.ec2, instance_id, owner, name, run_id, timeout_s=IMAGE_TIMEOUT_S, **tags)
