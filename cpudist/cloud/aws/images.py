"""Images cpudist makes: an AMI cloned from a configured node, or baked from ami/bootstrap.sh."""

from __future__ import annotations

from typing import Any

from cpudist.cloud.aws.client import call, create, wait_for
from cpudist.cloud.aws.errors import AwsError
from cpudist.cloud.aws.tags import CLUSTER_TAG, run_filter, tag_spec
from cpudist.errors import CpudistError


def create_image(ec2: Any, instance_id: str, owner_tag: str, name: str, run_id: str = "",
                 timeout_s: float = 1800, **extra: str) -> str:
    """An AMI of `instance_id`, tagged (with its snapshots) `cpudist:cluster=owner_tag`; waits until
    available."""
    specs = [*tag_spec("image", owner_tag, name, run=run_id, **extra),
             *tag_spec("snapshot", owner_tag, name, run=run_id, **extra)]
    try:
        image_id: str = create(ec2.create_image, InstanceId=instance_id, Name=name, NoReboot=True,
                               Description=f"cpudist image for {owner_tag}",
                               TagSpecifications=specs)["ImageId"]
    except AwsError as e:  # a retry after a lost answer: the first try made it, with this run's tag
        again = [i for i in owned_images(ec2, owner_tag, run_id or None) if i.get("Name") == name]
        if e.code != "InvalidAMIName.Duplicate" or not run_id or not again:
            raise
        image_id = again[0]["ImageId"]
    if not wait_for(ec2, "image_available", f"image {image_id} to be available", timeout_s,
                    ImageIds=[image_id]):
        images = call(ec2.describe_images, ImageIds=[image_id])["Images"]
        state = images[0]["State"] if images else "missing"
        raise CpudistError(f"image {image_id} ended up {state}", "Check the instance, then re-run")
    return image_id


def _filters(owner_tag: str, run_id: str | None) -> list[dict[str, Any]]:
    return ([{"Name": f"tag:{CLUSTER_TAG}", "Values": [owner_tag]}]
            + (run_filter(run_id) if run_id else []))


def owned_images(ec2: Any, owner_tag: str, run_id: str | None = None) -> list[dict[str, Any]]:
    return call(ec2.describe_images, Owners=["self"], Filters=_filters(owner_tag, run_id))["Images"]


def delete_images(ec2: Any, owner_tag: str, run_id: str | None = None) -> list[str]:
    """Deregister the images tagged with `owner_tag` (and `run_id`, when given), with their
    snapshots."""
    removed = []
    for image in owned_images(ec2, owner_tag, run_id):
        snapshots = [m["Ebs"]["SnapshotId"] for m in image.get("BlockDeviceMappings", [])
                     if m.get("Ebs", {}).get("SnapshotId")]
        call(ec2.deregister_image, ImageId=image["ImageId"])
        for snap in snapshots:
            call(ec2.delete_snapshot, SnapshotId=snap)
        removed.append(image["ImageId"])
    tagged = call(ec2.describe_snapshots, OwnerIds=["self"],
                  Filters=_filters(owner_tag, run_id))["Snapshots"]
    for snap in tagged:
        call(ec2.delete_snapshot, SnapshotId=snap["SnapshotId"])
    return removed


def newest_clone(ec2: Any, cluster: str) -> str | None:
    """The newest available image tagged with the cluster (--clone-from-first's of node 0)."""
    found = [i for i in owned_images(ec2, cluster) if i.get("State") == "available"]
    return str(max(found, key=lambda i: i.get("CreationDate", ""))["ImageId"]) if found else None


def newest_base_image(ec2: Any, version: str) -> str | None:
    """The newest available image `cpudist ami build` made for this cpudist version, if any."""
    found = call(ec2.describe_images, Owners=["self"],
                 Filters=[{"Name": "tag:cpudist:version", "Values": [version]},
                          {"Name": "tag:cpudist:image", "Values": ["base"]},
                          {"Name": "state", "Values": ["available"]}])["Images"]
    if not found:
        return None
    return str(max(found, key=lambda i: i.get("CreationDate", ""))["ImageId"])
