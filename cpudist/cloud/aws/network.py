"""Key pair, security group, placement group and subnet: each get-or-create, each removable.

Only what carries cpudist's tag for its owner (`cpudist:cluster=OWNER`) is changed or removed: a
user's own group, key pair or placement group that happens to be named `cpudist-OWNER` is refused
before any change and never deleted.
"""

from __future__ import annotations

from typing import Any

from cpudist import state
from cpudist.cloud.aws.client import CHECK_AWS, call, create
from cpudist.cloud.aws.errors import AwsError
from cpudist.cloud.aws.tags import (
    CLUSTER_TAG,
    RUN_TAG,
    cluster_filter,
    has_tag,
    run_filter,
    tag_spec,
)
from cpudist.cloud.provider import KeyInfo, KeyRequest, Subnet
from cpudist.errors import BadInput, CpudistError
from cpudist.waits import wait_until

STRATEGY = "cluster"  # the placement group's: one rack, the lowest latency between the nodes


class NotOurs(BadInput):
    """A resource under cpudist's name for an owner lacks cpudist's tag for it: the user's, never
    touched."""


def _refuse(kind: str, name: str, owner: str) -> NotOurs:
    return NotOurs(f"{kind} {name} exists but is not cpudist's (no {CLUSTER_TAG}={owner} tag): "
                   "left as it is",
                   f"Rename or remove your {kind}, or pick another --name")


def resource_name(cluster: str) -> str:
    return f"cpudist-{cluster}"


def _exists(fn: Any, missing_code: str, **kwargs: Any) -> dict[str, Any] | None:
    try:
        return call(fn, **kwargs)
    except AwsError as e:
        if e.code.startswith(missing_code):
            return None
        raise


def resolve_subnet(ec2: Any, subnet_id: str | None) -> Subnet:
    """The given subnet, else the first subnet (by zone) of the default VPC: one AZ for all
    nodes."""
    if subnet_id:
        found = _exists(ec2.describe_subnets, "InvalidSubnetID", SubnetIds=[subnet_id])
        if not found or not found["Subnets"]:
            raise BadInput(f"subnet {subnet_id} not found", "Check --subnet and --region")
        s = found["Subnets"][0]
    else:
        vpcs = call(ec2.describe_vpcs, Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise BadInput("this region has no default VPC", "Pass --subnet SUBNET_ID")
        subnets = call(ec2.describe_subnets,
                       Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]}])["Subnets"]
        if not subnets:
            raise BadInput("the default VPC has no subnet", "Pass --subnet SUBNET_ID")
        s = sorted(subnets, key=lambda x: (x["AvailabilityZone"], x["SubnetId"]))[0]
    return Subnet(s["SubnetId"], s["VpcId"], s["AvailabilityZone"], s["CidrBlock"])


def ensure_key_pair(ec2: Any, request: KeyRequest) -> tuple[KeyInfo, bool]:
    """(key, created now): the user's key pair, or a new one from `new_key(comment) -> (private,
    public)` (OpenSSH text; the private half 0600 in `folder`)."""
    cluster, folder, key_name, identity = (request.owner, request.folder, request.key_name,
                                           request.identity)
    if key_name:
        if not _exists(ec2.describe_key_pairs, "InvalidKeyPair", KeyNames=[key_name]):
            raise BadInput(f"key pair {key_name} not found in this region",
                           "Check --key-name and --region")
        if identity is None or not identity.is_file():
            raise BadInput(f"--key-name {key_name} needs its private key",
                           "Pass --identity PATH_TO_PRIVATE_KEY")
        return KeyInfo(key_name, identity), False
    name, private = resource_name(cluster), folder / "id_ed25519"
    found = _exists(ec2.describe_key_pairs, "InvalidKeyPair", KeyNames=[name])
    if found and found["KeyPairs"]:
        if not has_tag(found["KeyPairs"][0], CLUSTER_TAG, cluster):
            raise _refuse("key pair", name, cluster)
        if not private.is_file():
            raise CpudistError(f"key pair {name} exists in AWS but its private key is not in "
                               f"{folder}",
                               f"Run `cpudist cluster down --name {cluster}` first, or pass "
                               "--key-name/--identity")
        return KeyInfo(name, private), False
    private_text, public = request.new_key(f"cpudist-{cluster}")
    state.write_private(private, private_text)
    state.write_atomic(folder / "id_ed25519.pub", public + "\n")
    try:
        create(ec2.import_key_pair, KeyName=name, PublicKeyMaterial=public.encode(),
               TagSpecifications=tag_spec("key-pair", cluster, name, run=request.run_id))
    except AwsError as e:  # a retry after a lost answer: the first try made it, with this run's tag
        again = _exists(ec2.describe_key_pairs, "InvalidKeyPair", KeyNames=[name])
        if not (e.code == "InvalidKeyPair.Duplicate"
                and _ours(again, "KeyPairs", cluster, request.run_id)):
            raise
    return KeyInfo(name, private), True


def _desired_rules(group_id: str, ssh_cidr: str) -> list[dict[str, Any]]:
    ssh = ({"Ipv6Ranges": [{"CidrIpv6": ssh_cidr}]} if ":" in ssh_cidr
           else {"IpRanges": [{"CidrIp": ssh_cidr}]})
    return [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ssh},
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}]


def _rule_key(rule: dict[str, Any]) -> tuple[Any, ...]:
    """What a rule admits: IPv4 and IPv6 ranges, prefix lists and groups all count (a rule that
    differs in any of them is not ours and is revoked)."""
    cidrs = tuple(sorted(r["CidrIp"] for r in rule.get("IpRanges", [])))
    cidrs6 = tuple(sorted(r["CidrIpv6"] for r in rule.get("Ipv6Ranges", [])))
    lists = tuple(sorted(p["PrefixListId"] for p in rule.get("PrefixListIds", [])))
    groups = tuple(sorted(p["GroupId"] for p in rule.get("UserIdGroupPairs", [])))
    return (rule["IpProtocol"], rule.get("FromPort"), rule.get("ToPort"), cidrs, cidrs6, lists,
            groups)


def _idempotent(fn: Any, done_code: str, **kwargs: Any) -> None:
    """A rule change whose retry (after a lost answer) finds it done: `done_code` means it took."""
    try:
        call(fn, **kwargs)
    except AwsError as e:
        if e.code != done_code:
            raise


def _groups_named(ec2: Any, name: str, vpc_id: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = call(ec2.describe_security_groups, Filters=[
        {"Name": "group-name", "Values": [name]},
        {"Name": "vpc-id", "Values": [vpc_id]}])["SecurityGroups"]
    return groups


def ensure_security_group(ec2: Any, cluster: str, vpc_id: str, ssh_cidr: str,
                          run_id: str = "") -> tuple[str, bool]:
    """(group id, created now): SSH from `ssh_cidr` only, all traffic from the group itself, nothing
    else."""
    name = resource_name(cluster)
    found = _groups_named(ec2, name, vpc_id)
    created = not found
    if created:
        try:
            group_id = create(ec2.create_security_group, GroupName=name, VpcId=vpc_id,
                              Description=f"cpudist cluster {cluster}: SSH from the operator, all "
                                          "traffic inside",
                              TagSpecifications=tag_spec("security-group", cluster, name,
                                                         run=run_id))["GroupId"]
        # a retry after a lost answer: the first try made it, with this run's tag
        except AwsError as e:
            again = {"SecurityGroups": _groups_named(ec2, name, vpc_id)}
            if not (e.code == "InvalidGroup.Duplicate"
                    and _ours(again, "SecurityGroups", cluster, run_id)):
                raise
            group_id = again["SecurityGroups"][0]["GroupId"]
        current: list[dict[str, Any]] = []
    else:
        if not has_tag(found[0], CLUSTER_TAG, cluster):  # before any rule of it is touched
            raise _refuse("security group", f"{name} ({found[0]['GroupId']})", cluster)
        group_id, current = found[0]["GroupId"], found[0].get("IpPermissions", [])
    desired = _desired_rules(group_id, ssh_cidr)
    have = {_rule_key(r) for r in current}
    want = {_rule_key(r) for r in desired}
    extra = [r for r in current if _rule_key(r) not in want]
    if extra:
        _idempotent(ec2.revoke_security_group_ingress, "InvalidPermission.NotFound",
                    GroupId=group_id, IpPermissions=extra)
    missing = [r for r in desired if _rule_key(r) not in have]
    if missing:
        _idempotent(ec2.authorize_security_group_ingress, "InvalidPermission.Duplicate",
                    GroupId=group_id, IpPermissions=missing)
    return group_id, created


def ensure_placement_group(ec2: Any, cluster: str, run_id: str = "") -> tuple[str, bool]:
    """(name, created now) of the cluster's placement group (strategy `cluster`: one rack, low
    latency)."""
    name = resource_name(cluster)
    found = _exists(ec2.describe_placement_groups, "InvalidPlacementGroup", GroupNames=[name])
    if found and found.get("PlacementGroups"):
        group = found["PlacementGroups"][0]
        if not has_tag(group, CLUSTER_TAG, cluster):
            raise _refuse("placement group", name, cluster)
        if group.get("Strategy") != STRATEGY:
            raise BadInput(f"placement group {name} has strategy {group.get('Strategy')}, not "
                           f"{STRATEGY}",
                           f"Remove it (`cpudist cluster down --name {cluster}`), or pass "
                           "--no-placement-group")
        return name, False
    try:
        create(ec2.create_placement_group, GroupName=name, Strategy=STRATEGY,
               TagSpecifications=tag_spec("placement-group", cluster, name, run=run_id))
    except AwsError as e:  # a retry after a lost answer: the first try made it, with this run's tag
        again = _exists(ec2.describe_placement_groups, "InvalidPlacementGroup", GroupNames=[name])
        if not (e.code == "InvalidPlacementGroup.Duplicate"
                and _ours(again, "PlacementGroups", cluster, run_id)):
            raise
    return name, True


def _ours(found: dict[str, Any] | None, key: str, owner: str, run_id: str | None) -> bool:
    """Whether a described resource exists, carries the owner's tag and (when `run_id` is given)
    that run made it."""
    items = (found or {}).get(key, [])
    return (bool(items) and has_tag(items[0], CLUSTER_TAG, owner)
            and (run_id is None or has_tag(items[0], RUN_TAG, run_id)))


def delete_key_pair(ec2: Any, owner: str, run_id: str | None = None) -> bool:
    """Delete the owner's key pair (only if it carries the owner's tag, and `run_id`'s when
    given)."""
    name = resource_name(owner)
    if not _ours(_exists(ec2.describe_key_pairs, "InvalidKeyPair", KeyNames=[name]), "KeyPairs",
                 owner, run_id):
        return False
    call(ec2.delete_key_pair, KeyName=name)
    return True


def delete_security_group(ec2: Any, cluster: str, run_id: str | None = None,
                          timeout_s: float = 300) -> bool:
    """Delete the cluster's group (only if `run_id` made it, when given), retrying while AWS still
    sees terminated instances in it."""
    groups = security_groups(ec2, cluster, run_id)
    for g in groups:
        def attempt(group_id: str = g["GroupId"]) -> bool | None:
            try:
                call(ec2.delete_security_group, GroupId=group_id)
                return True
            except AwsError as e:
                if e.code == "DependencyViolation":
                    return None
                if e.code.startswith("InvalidGroup"):
                    return True
                raise

        wait_until(attempt, f"security group {g['GroupId']} to be free of instances", timeout_s,
                   3.0, hint=CHECK_AWS)
    return bool(groups)


def delete_placement_group(ec2: Any, cluster: str, run_id: str | None = None) -> bool:
    name = resource_name(cluster)
    found = _exists(ec2.describe_placement_groups, "InvalidPlacementGroup", GroupNames=[name])
    if not _ours(found, "PlacementGroups", cluster, run_id):
        return False
    call(ec2.delete_placement_group, GroupName=name)
    return True


def security_groups(ec2: Any, cluster: str, run_id: str | None = None) -> list[dict[str, Any]]:
    """The groups that carry the cluster's tag (and the run's, when given)."""
    filters = cluster_filter(cluster) + (run_filter(run_id) if run_id is not None else [])
    groups: list[dict[str, Any]] = call(ec2.describe_security_groups,
                                        Filters=filters)["SecurityGroups"]
    return groups


def placement_group_exists(ec2: Any, cluster: str, run_id: str | None = None) -> bool:
    found = _exists(ec2.describe_placement_groups, "InvalidPlacementGroup",
                    GroupNames=[resource_name(cluster)])
    return _ours(found, "PlacementGroups", cluster, run_id)


def key_pair_exists(ec2: Any, cluster: str, run_id: str | None = None) -> bool:
    return _ours(_exists(ec2.describe_key_pairs, "InvalidKeyPair",
                         KeyNames=[resource_name(cluster)]), "KeyPairs",
                 cluster, run_id)
