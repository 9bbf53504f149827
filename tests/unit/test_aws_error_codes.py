"""Exit codes of AWS failures (cloud/aws/errors.py for EC2, cloud/aws/objects.py for S3,
train/durable.py's mirror): credentials missing, unknown to AWS or with the wrong secret are the
user's setup (2, as bad input); a refusal that is not about the user's input stays a failure (1).
The errors are botocore's own classes."""

from __future__ import annotations

from pathlib import Path

import botocore.exceptions
import pytest

from cpudist.cloud.aws import errors as ec2_errors
from cpudist.cloud.aws import objects as s3_objects
from cpudist.errors import BadInput
from cpudist.objects import StoreError
from cpudist.train.durable import Mirror, MirrorError


def client_error(code: str, op: str = "DescribeInstances") -> botocore.exceptions.ClientError:
    error = {"Error": {"Code": code, "Message": f"{code} says no"}}
    return botocore.exceptions.ClientError(error, op)


@pytest.mark.parametrize("error", [
    botocore.exceptions.NoCredentialsError(),
    botocore.exceptions.PartialCredentialsError(provider="env", cred_var="secret"),
    client_error("AuthFailure"),
    client_error("InvalidClientTokenId"),
])
def test_ec2_credentials_missing_or_invalid_exit_2(error: Exception) -> None:
    e = ec2_errors.translate(error)
    assert e.exit_code == 2 and isinstance(e, BadInput)
    assert "aws configure" in e.message


@pytest.mark.parametrize("code",
                         ["InsufficientInstanceCapacity", "RequestLimitExceeded", "InternalError"])
def test_ec2_failures_that_are_not_setup_exit_1(code: str) -> None:
    assert ec2_errors.translate(client_error(code)).exit_code == 1


@pytest.mark.parametrize("error", [botocore.exceptions.NoCredentialsError(),
                                   client_error("InvalidAccessKeyId", "PutObject"),
                                   client_error("SignatureDoesNotMatch", "PutObject")])
def test_s3_credentials_missing_or_invalid_exit_2(error: Exception) -> None:
    e = s3_objects.translate(error, "bucket")
    assert e.exit_code == 2 and isinstance(e, BadInput)


def test_s3_failures_that_are_not_setup_exit_1() -> None:
    assert s3_objects.translate(client_error("InternalError", "PutObject"), "bucket").exit_code == 1


class Refusing:
    """An object store whose every call fails as S3 does with `error` (what S3Objects raises)."""

    url = "s3://bucket/run"

    def __init__(self, error: StoreError) -> None:
        self.error = error

    def keys(self, under: str = "") -> list[str]:
        raise self.error

    def put(self, path: Path, key: str) -> None:
        raise self.error

    def get(self, key: str, path: Path) -> None:
        raise self.error

    def delete(self, keys: object) -> None:
        raise self.error


@pytest.mark.parametrize(("error", "code"), [(botocore.exceptions.NoCredentialsError(), 2),
                                             (client_error("InternalError", "ListObjectsV2"), 1)])
def test_the_mirror_keeps_the_stores_exit_code(error: Exception, code: int) -> None:
    with pytest.raises(MirrorError) as e:
        Mirror(Refusing(s3_objects.translate(error, "bucket"))).complete()
    assert e.value.exit_code == code and e.value.message.startswith("cannot list s3://bucket/run")
