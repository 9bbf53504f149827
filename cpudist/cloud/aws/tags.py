"""Cluster membership is a tag: every resource cpudist makes carries `cpudist:cluster=NAME`."""

from __future__ import annotations

from typing import Any

CLUSTER_TAG = "cpudist:cluster"
ROLE_TAG = "cpudist:role"
NODE_TAG = "cpudist:node"
# the `cluster up` that made a resource: a failed run removes exactly what it made
RUN_TAG = "cpudist:run"


def tags(cluster: str, name: str, **extra: str) -> list[dict[str, str]]:
    out = [{"Key": CLUSTER_TAG, "Value": cluster}, {"Key": "Name", "Value": name}]
    out += [{"Key": f"cpudist:{k}", "Value": v} for k, v in extra.items() if v]
    return out


def tag_spec(resource: str, cluster: str, name: str, **extra: str) -> list[dict[str, Any]]:
    return [{"ResourceType": resource, "Tags": tags(cluster, name, **extra)}]


def tag_value(resource: dict[str, Any], key: str) -> str | None:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), None)


def cluster_filter(cluster: str) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]}]


def run_filter(run_id: str) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{RUN_TAG}", "Values": [run_id]}]


def has_tag(resource: dict[str, Any], key: str, value: str) -> bool:
    return tag_value(resource, key) == value
