"""Cluster membership is a tag: every resource cpudist makes carries `cpudist:cluster=NAME`."""

from __future__ import annotations

from typing import Any

CLUSTER_TAG = "cpudist:cluster"
ROLE_TAG = "cpudist:role"
NODE_TAG = "cpudist:node"


def tags(cluster: str, name: str, **extra: str) -> list[dict[str, str]]:
    out = [{"Key": CLUSTER_TAG, "Value": cluster}, {"Key": "Name", "Value": name}]
    out += [{"Key": f"cpudist:{k}", "Value": v} for k, v in extra.items()]
    return out


def tag_spec(resource: str, cluster: str, name: str, **extra: str) -> list[dict[str, Any]]:
    return [{"ResourceType": resource, "Tags": tags(cluster, name, **extra)}]


def tag_value(resource: dict[str, Any], key: str) -> str | None:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), None)


def cluster_filter(cluster: str) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]}]
