"""The cluster's instances: launch (spot, with on-demand fallback), find by tag, wait, terminate."""

from __future__ import annotations

import dataclasses
from typing import Any

from cpudist.cloud.aws.client import CHECK_AWS, NOT_YET_VISIBLE, call, create, wait_for
from cpudist.cloud.aws.client import GROUP_NOT_YET_VISIBLE as GROUP_UNSEEN
from cpudist.cloud.aws.errors import AwsError
from cpudist.cloud.aws.tags import (
    CLUSTER_TAG,
    NODE_TAG,
    ROLE_TAG,
    cluster_filter,
    run_filter,
    tag_spec,
    tag_value,
)
from cpudist.cloud.provider import LaunchSpec, Node
from cpudist.errors import CpudistError
from cpudist.waits import wait_until

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
# Instance metadata only with a session token (IMDSv2): the spot notice poller (notice.py) asks for
# one.
IMDS_V2 = {"HttpTokens": "required", "HttpEndpoint": "enabled"}
# Spot capacity or price refusals, where an on-demand instance may still be had.
SPOT_REFUSALS = frozenset({"InsufficientInstanceCapacity", "SpotMaxPriceTooLow",
                           "MaxSpotInstanceCountExceeded", "InsufficientCapacity"})


def to_node(inst: dict[str, Any]) -> Node:
    return Node(instance_id=inst["InstanceId"], index=int(tag_value(inst, NODE_TAG) or -1),
                role=tag_value(inst, ROLE_TAG) or "node", state=inst["State"]["Name"],
                private_ip=inst.get("PrivateIpAddress"), public_ip=inst.get("PublicIpAddress"),
                lifecycle="spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand",
                launch_time=str(inst.get("LaunchTime", "")), image_id=inst.get("ImageId", ""),
                instance_type=inst.get("InstanceType", ""),
                security_groups=tuple(g["GroupId"] for g in inst.get("SecurityGroups", [])),
                cluster=tag_value(inst, CLUSTER_TAG))


def describe(ec2: Any, filters: list[dict[str, Any]]) -> list[Node]:
    pages = call(ec2.describe_instances, Filters=filters)["Reservations"]
    return [to_node(i) for r in pages for i in r["Instances"]]


def find_nodes(ec2: Any, cluster: str, role: str | None = "node") -> list[Node]:
    """Live instances of the cluster (by tag), in node order."""
    nodes = describe(ec2,
                     [*cluster_filter(cluster),
                      {"Name": "instance-state-name", "Values": LIVE_STATES}])
    return sorted((n for n in nodes if role is None or n.role == role), key=lambda n: n.index)


def foreign_in_group(ec2: Any, cluster: str, group_id: str) -> list[str]:
    """Live instances in the cluster's security group that are not the cluster's."""
    pages = call(ec2.describe_instances,
                 Filters=[{"Name": "instance.group-id", "Values": [group_id]},
                          {"Name": "instance-state-name", "Values": LIVE_STATES}])
    return [i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]
            if tag_value(i, CLUSTER_TAG) != cluster]


def _run(ec2: Any, spec: LaunchSpec, count: int, role: str, spot: bool, token: str) -> list[Node]:
    """One RunInstances call for `count` instances: all of them or none (MinCount = MaxCount)."""
    kwargs: dict[str, Any] = dict(
        ImageId=spec.image_id, InstanceType=spec.instance_type, MinCount=count, MaxCount=count,
        KeyName=spec.key_name, SecurityGroupIds=[spec.security_group], SubnetId=spec.subnet_id,
        # The same token on a retry after a lost answer makes AWS return the instances it already
        # made.
        ClientToken=token, MetadataOptions=IMDS_V2,
        TagSpecifications=[*tag_spec("instance", spec.cluster, f"{spec.cluster}-{role}", role=role,
                                     run=spec.run_id),
                           *tag_spec("volume", spec.cluster, f"{spec.cluster}-{role}", role=role,
                                     run=spec.run_id)])
    if spec.placement_group:
        kwargs["Placement"] = {"GroupName": spec.placement_group}
    if spot:
        options: dict[str, Any] = {"SpotInstanceType": "one-time",
                                   "InstanceInterruptionBehavior": "terminate"}
        if spec.max_price:
            options["MaxPrice"] = spec.max_price
        kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    if spec.user_data:
        kwargs["UserData"] = spec.user_data  # boto3 base64-encodes it
    reply = create(ec2.run_instances, also_retry=GROUP_UNSEEN, **kwargs)  # the group just made
    return [to_node(i) for i in reply["Instances"]]


def launch_nodes(ec2: Any, spec: LaunchSpec, indices: list[int], role: str = "node") -> list[Node]:
    """Instances for node `indices` in one call, each tagged with its index; a spot refusal falls
    back to on-demand (again one call) when the spec allows it."""
    if not indices:
        return []
    token = f"{spec.run_id}-{role}-{indices[0]}"
    try:
        nodes = _run(ec2, spec, len(indices), role, spec.spot, token
                     + ("-spot" if spec.spot else ""))
    except AwsError as e:
        if not (spec.spot and spec.on_demand_fallback and e.code in SPOT_REFUSALS):
            raise
        nodes = _run(ec2, spec, len(indices), role, False, token)
    for node, index in zip(nodes, indices, strict=True):
        number(ec2, spec.cluster, node.instance_id, index, role)
    return [dataclasses.replace(n, index=i) for n, i in zip(nodes, indices, strict=True)]


def number(ec2: Any, cluster: str, instance_id: str, index: int, role: str = "node") -> None:
    """Tag an instance with its node index (and name): after the launch, since one call launches
    them all."""
    call(ec2.create_tags, also_retry=NOT_YET_VISIBLE, Resources=[instance_id],
         Tags=[{"Key": NODE_TAG, "Value": str(index)},
               {"Key": "Name", "Value": f"{cluster}-{role}{index}"}])


def start(ec2: Any, ids: list[str]) -> None:
    """Start stopped instances (a re-run of `up` on a cluster someone stopped)."""
    if ids:
        call(ec2.start_instances, InstanceIds=ids)


def of_run(ec2: Any, run_id: str) -> list[Node]:
    """Live instances a `cluster up` run launched (by its tag): also those whose launch answer was
    lost."""
    return describe(ec2,
                    [*run_filter(run_id), {"Name": "instance-state-name", "Values": LIVE_STATES}])


WAITERS = {"running": "instance_running", "stopped": "instance_stopped"}  # boto3's, where they fit


def wait_state(ec2: Any, ids: list[str], state: str, timeout_s: float) -> list[Node]:
    """Wait until every instance is in `state`; an instance that dies on the way is an error."""
    if not ids:
        return []
    if state in WAITERS:
        what = f"{len(ids)} instance(s) to be {state}"
        if wait_for(ec2, WAITERS[state], what, timeout_s, InstanceIds=ids):
            return describe(ec2, [{"Name": "instance-id", "Values": ids}])
        # A failure state (terminated, shutting-down, ...): the check below names the instance.

    def check() -> list[Node] | None:
        nodes = describe(ec2, [{"Name": "instance-id", "Values": ids}])
        dead = [n for n in nodes if n.state in ("terminated", "shutting-down")
                and state != "terminated"]
        if dead:
            raise CpudistError(f"instance {dead[0].instance_id} ended while starting "
                               f"({dead[0].state})",
                               "A spot instance may have been reclaimed: re-run `cpudist cluster "
                               "up`")
        return nodes if len(nodes) == len(ids) and all(n.state == state for n in nodes) else None

    return wait_until(check, f"{len(ids)} instance(s) to be {state}", timeout_s, hint=CHECK_AWS)


def terminate(ec2: Any, ids: list[str], timeout_s: float = 600) -> None:
    if ids:
        # A rollback can follow RunInstances within EC2's consistency window: the ids come from AWS
        # itself.
        call(ec2.terminate_instances, also_retry=NOT_YET_VISIBLE, InstanceIds=ids)
        wait_state(ec2, ids, "terminated", timeout_s)


def launch_builder(ec2: Any, owner: str, image_id: str, instance_type: str, subnet_id: str,
                   user_data: str, key_name: str, group_id: str, run_id: str) -> Node:
    """A throw-away instance that runs `user_data` (an image bake), tagged with `owner` and the
    run."""
    reply = create(ec2.run_instances, also_retry=GROUP_UNSEEN,
                 ImageId=image_id, InstanceType=instance_type, MinCount=1, MaxCount=1,
                 # boto3 base64-encodes UserData
                 SubnetId=subnet_id, UserData=user_data, MetadataOptions=IMDS_V2,
                 KeyName=key_name, SecurityGroupIds=[group_id], ClientToken=f"{run_id}-builder",
                 TagSpecifications=[*tag_spec("instance", owner, f"{owner}-builder", role="builder",
                                              run=run_id),
                                    *tag_spec("volume", owner, f"{owner}-builder", role="builder",
                                              run=run_id)])
    return to_node(reply["Instances"][0])


def console_output(ec2: Any, instance_id: str) -> str:
    """The instance's console log (what its boot and user data printed), as text."""
    reply = call(ec2.get_console_output, InstanceId=instance_id, Latest=True)
    return str(reply.get("Output") or "")
