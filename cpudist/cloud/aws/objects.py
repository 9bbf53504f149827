"""S3 as the checkpoint mirror's object store (cpudist/objects.py: ObjectStore), with boto3.

    store = S3Objects("s3://my-bucket/runs/sst2")   # keys below are relative to runs/sst2/
    Mirror(store).upload(Path("out/step-000040"))

botocore's exceptions become StoreErrors that keep the AWS code and say what to do; the mirror adds
what it was doing ("cannot upload step-000040 to s3://...: NoSuchBucket: ...").
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cpudist.errors import BadInput, CpudistError
from cpudist.objects import StoreBadSetup, StoreError

# S3's naming rules, less the rarer exceptions
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
URL_HINT = "Give an S3 location as s3://bucket or s3://bucket/prefix, e.g. s3://my-bucket/runs/sst2"
HINTS = {
    "NoSuchBucket": "Create it with `aws s3 mb s3://{bucket}` (in the region the nodes run in), or "
                    "fix the URL",
    "AccessDenied": "Grant s3:ListBucket on the bucket and s3:GetObject/PutObject/DeleteObject on "
                    "s3://{bucket}/* to these credentials (the instance profile on EC2)",
    "InvalidAccessKeyId": "Check the AWS credentials (`aws configure`, AWS_PROFILE or the instance "
                          "profile)",
    "SignatureDoesNotMatch": "Check the AWS secret key (`aws configure`)",
    "PermanentRedirect": "The bucket is in another region: set AWS_DEFAULT_REGION to the bucket's "
                         "region",
}
DELETE_BATCH = 1000  # S3's limit of keys per DeleteObjects call


def s3_client(endpoint_url: str | None = None, attempts: int | None = None,
              timeout_s: float | None = None) -> Any:
    """An S3 client with explicit retries; the endpoint is `endpoint_url`, else boto3's own
    settings. `attempts` and `timeout_s` (connect and read) replace the copies' own for a quick
    probe."""
    import boto3  # here, not at import: the CLI validates --checkpoint-s3 without loading boto3
    from botocore.config import Config

    # boto3 >= 1.28 reads AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL (checked with boto3 1.43
    # against moto's server in tests/integration/test_durable.py): the emulator needs no code path
    # of its own. Standard mode retries throttling, 5xx and dropped connections with backoff; a
    # checkpoint upload that still fails is a warning (train/durable.py: copy_or_warn), and the next
    # checkpoint tries again. AWS_MAX_ATTEMPTS, boto3's own setting, is honoured: an explicit Config
    # would otherwise override it.
    given = os.environ.get("AWS_MAX_ATTEMPTS", "")
    total = attempts or (int(given) if given.isdigit() and int(given) > 0 else 6)
    config = Config(retries={"mode": "standard", "total_max_attempts": total},
                    connect_timeout=timeout_s or 10, read_timeout=timeout_s or 120)
    # A session of its own: boto3's default one is shared, not thread-safe, and caches the
    # credentials it found first (a mirror built in an upload thread, or after the environment
    # changed, must not use them).
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of s3://bucket[/prefix]; the prefix has no leading or trailing slash."""
    if not url.startswith("s3://"):
        raise BadInput(f"'{url}' is not an S3 URL", URL_HINT)
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not BUCKET.fullmatch(bucket) or ".." in bucket:
        raise BadInput(f"'{bucket}' in '{url}' is not a valid bucket name (3-63 characters: a-z, "
                       "0-9, '.', '-')",
                       URL_HINT)
    if prefix.startswith("/") or "//" in prefix:
        raise BadInput(f"the prefix '{prefix}' in '{url}' has an empty part ('//')", URL_HINT)
    prefix = prefix.rstrip("/")
    if any(part in (".", "..") for part in prefix.split("/")) or prefix != prefix.strip():
        raise BadInput(f"the prefix '{prefix}' in '{url}' has '.' or '..' parts or stray spaces",
                       URL_HINT)
    return bucket, prefix


class S3Objects:
    """The objects under s3://bucket/prefix/, by key relative to the prefix."""

    def __init__(self, url: str, client: Any | None = None) -> None:
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_s3_url(url)
        self.client = client if client is not None else s3_client()
        # the probe's client: one attempt, short timeouts (made at the first probe)
        self._quick: Any = client

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def keys(self, under: str = "") -> list[str]:
        """Every key that starts with `under`, relative to the prefix."""
        start = f"{self.prefix}/" if self.prefix else ""
        found: list[str] = []
        with self._errors():
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=start + under):
                found += [obj["Key"][len(start):] for obj in page.get("Contents", [])]
        return found

    def put(self, path: Path, key: str) -> None:
        """Upload a local file to `key` (multipart above boto3's threshold)."""
        with self._errors():
            self.client.upload_file(str(path), self.bucket, self._key(key))

    def get(self, key: str, path: Path) -> None:
        """Download `key` into a local file."""
        with self._errors():
            self.client.download_file(self.bucket, self._key(key), str(path))

    def delete(self, keys: Sequence[str]) -> None:
        """Delete keys, 1,000 a call (a missing one is no error); a key S3 refused fails the
        call."""
        with self._errors():
            for i in range(0, len(keys), DELETE_BATCH):
                batch = [{"Key": self._key(k)} for k in keys[i:i + DELETE_BATCH]]
                reply = self.client.delete_objects(Bucket=self.bucket,
                                                   Delete={"Objects": batch, "Quiet": True})
                if reply.get("Errors"):
                    first = reply["Errors"][0]
                    raise StoreError(f"S3 did not delete {len(reply['Errors'])} keys, e.g. "
                                     f"{first.get('Key')}: {first.get('Message')}",
                                     "Check s3:DeleteObject on the bucket, then re-run",
                                     first.get("Code", ""))

    def probe(self, timeout_s: float) -> None:
        """One listing of at most one key under the prefix, in one attempt of at most `timeout_s`
        per connect and read (the copies' client retries for a minute); StoreError naming the
        endpoint when it does not answer."""
        if self._quick is None:
            self._quick = s3_client(attempts=1, timeout_s=timeout_s)
        try:
            with self._errors():
                self._quick.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}/"
                                            if self.prefix else "",
                                            MaxKeys=1)
        except StoreError as e:
            raise StoreError(f"S3 endpoint {self._quick.meta.endpoint_url}: {e.what}", e.hint,
                             e.code) from e

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """botocore's exceptions, raised in the block, as StoreErrors that say what to do."""
        import botocore.exceptions
        from boto3.exceptions import S3UploadFailedError

        try:
            yield
        except CpudistError:
            raise
        except S3UploadFailedError as e:  # boto3 wraps the ClientError of a managed upload
            raise translate(e.__context__ or e, self.bucket) from e
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise translate(e, self.bucket) from e


def translate(e: BaseException, bucket: str) -> StoreError:
    """The StoreError for a botocore exception met with `bucket`."""
    import botocore.exceptions

    if isinstance(e, botocore.exceptions.NoCredentialsError
                  | botocore.exceptions.PartialCredentialsError):
        return StoreBadSetup("no AWS credentials found",
                          "Run `aws configure`, set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                          "AWS_PROFILE, "
                          "or attach an instance profile that may use the bucket", "NoCredentials")
    if isinstance(e, botocore.exceptions.EndpointConnectionError
                  | botocore.exceptions.ConnectionError):
        return StoreError(f"S3 is unreachable ({e})",
                          "Check the network and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL if set",
                          type(e).__name__)
    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", "Unknown"))
        # HEAD answers carry no body
        code = {"404": "NoSuchKey", "403": "AccessDenied"}.get(code, code)
        hint = HINTS.get(code,
                         "See the AWS S3 documentation for this error code").format(bucket=bucket)
        cls = StoreBadSetup if code in ("InvalidAccessKeyId",
                                        "SignatureDoesNotMatch") else StoreError
        return cls(f"{code}: {err.get('Message', e)}", hint, code)
    return StoreError(str(e), "Re-run with --debug for details", type(e).__name__)
