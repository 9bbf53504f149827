"""The IAM policy cpudist needs (cpudist/cloud/aws/iam-policy.json) against the AWS calls the code
makes.

Every boto3 call in the package (found in the source with ast: `ec2.x(...)`, `ssm.x(...)`,
`self.client.x(...)`, passed bare to `call`/`create` or called) must be allowed by some statement,
and the policy grants nothing the code does not call. Whatever changes or deletes a resource is
allowed only on what carries cpudist's cluster tag. botocore's service models turn a method name
into its API name; S3's IAM actions differ from its API names.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
from pathlib import Path

import botocore.session
import pytest

import cpudist

PACKAGE = Path(cpudist.__file__).resolve().parent
POLICY = PACKAGE / "cloud" / "aws" / "iam-policy.json"
# the name a module gives its client -> its service
CLIENTS = {"ec2": "ec2", "ssm": "ssm", "client": "s3"}
# S3's IAM actions for the API calls objects.py makes (the transfer manager's uploads and downloads
# included).
S3_ACTIONS = {"list_objects_v2": "ListBucket", "upload_file": "PutObject",
              "download_file": "GetObject", "delete_objects": "DeleteObject"}


def _api_names(service: str) -> dict[str, str]:
    model = botocore.session.get_session().get_service_model(service)
    return {botocore.xform_name(op): op for op in model.operation_names}


@functools.cache  # one scan of the package serves every test here
def calls_in(root: Path = PACKAGE) -> frozenset[str]:
    """Every AWS action the package's source calls, as `service:Action`."""
    names = {service: _api_names(service) for service in set(CLIENTS.values())}
    found: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get_paginator" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                found.add(f"s3:{S3_ACTIONS[str(node.args[0].value)]}")
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value.attr if isinstance(node.value,
                                                  ast.Attribute) else getattr(node.value, "id",
                                                                              None)
            service = CLIENTS.get(owner or "")
            if service is None or node.attr in ("get_paginator", "meta", "exceptions"):
                continue
            if service == "s3" and node.attr in S3_ACTIONS:
                found.add(f"s3:{S3_ACTIONS[node.attr]}")
            elif node.attr in names[service]:
                found.add(f"{service}:{names[service][node.attr]}")
    return frozenset(found)


def _statements() -> list[dict[str, object]]:
    return list(json.loads(POLICY.read_text())["Statement"])


def _actions(statement: dict[str, object]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)  # type: ignore[arg-type]


def allowed(action: str) -> list[dict[str, object]]:
    return [s for s in _statements() if s["Effect"] == "Allow"
            and any(fnmatch.fnmatchcase(action, a)
                      for a in _actions(s))]


def test_the_source_scan_finds_the_calls_it_should() -> None:
    found = calls_in()
    # One of each kind, so a scan that finds nothing cannot pass the next test.
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:DescribeSpotPriceHistory",
            "ssm:GetParameter", "s3:ListBucket", "s3:PutObject"} <= found
    assert len(found) >= 25


def test_every_call_the_code_makes_is_in_the_policy() -> None:
    missing = sorted(a for a in calls_in() if not allowed(a))
    assert missing == [], f"add these to {POLICY.name}: {missing}"


def test_the_policy_grants_only_what_the_code_calls() -> None:
    granted = {a for s in _statements() for a in _actions(s)}
    assert not [a for a in granted if "*" in a], "no wildcard actions: least privilege"
    assert sorted(granted - calls_in()) == []


@pytest.mark.parametrize("action",
                         ["ec2:TerminateInstances", "ec2:DeleteSecurityGroup", "ec2:DeleteKeyPair",
                          "ec2:DeletePlacementGroup", "ec2:DeregisterImage", "ec2:DeleteSnapshot",
                          "ec2:RevokeSecurityGroupIngress", "ec2:StartInstances"])
def test_changes_only_on_what_carries_the_cluster_tag(action: str) -> None:
    for statement in allowed(action):
        assert statement.get("Condition") == {
            "Null": {"aws:ResourceTag/cpudist:cluster": "false"}}, statement["Sid"]


def test_a_scratch_call_outside_the_policy_is_found(tmp_path: Path) -> None:
    (tmp_path / "rogue.py").write_text("def f(ec2):\n    return ec2.delete_vpc(VpcId='vpc-1')\n")
    assert calls_in(tmp_path) == {"ec2:DeleteVpc"}
    assert allowed("ec2:DeleteVpc") == []
