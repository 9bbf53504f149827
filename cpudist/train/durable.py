"""A durable copy of checkpoints in S3: a reclaimed spot head node takes its disk, not the run, with it.

    mirror = S3Mirror("s3://my-bucket/runs/sst2")
    mirror.upload(Path("out/step-000040"))          # after the local COMPLETE marker is written
    latest = mirror.complete()[-1]                   # on resume, on a fresh node
    mirror.download(latest, Path("out"))

A checkpoint is a folder `step-NNNNNN/` of opaque files and a `COMPLETE` marker written last, locally
and in S3 alike: only a checkpoint whose marker exists is ever listed, downloaded or kept.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
from boto3.exceptions import S3UploadFailedError
from botocore.config import Config

from cpudist.cloud.aws.errors import AwsError
from cpudist.errors import BadInput, CpudistError

MARKER = "COMPLETE"
STEP = re.compile(r"step-(\d+)")
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # S3's naming rules, less the rarer exceptions
URL_HINT = "Give an S3 location as s3://bucket or s3://bucket/prefix, e.g. s3://my-bucket/runs/sst2"
HINTS = {
    "NoSuchBucket": "Create it with `aws s3 mb s3://{bucket}` (in the region the nodes run in), or fix the URL",
    "AccessDenied": "Grant s3:ListBucket on the bucket and s3:GetObject/PutObject/DeleteObject on "
                    "s3://{bucket}/* to these credentials (the instance profile on EC2)",
    "InvalidAccessKeyId": "Check the AWS credentials (`aws configure`, AWS_PROFILE or the instance profile)",
    "SignatureDoesNotMatch": "Check the AWS secret key (`aws configure`)",
    "PermanentRedirect": "The bucket is in another region: set AWS_DEFAULT_REGION to the bucket's region",
}


class MirrorError(AwsError):
    """Copying checkpoints to or from S3 failed; `code` keeps the AWS error code."""


def s3_client(endpoint_url: str | None = None) -> Any:
    """An S3 client with explicit retries; the endpoint is `endpoint_url`, else boto3's own settings."""
    # boto3 >= 1.28 reads AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL (checked with boto3 1.43 against
    # moto's server in tests/integration/test_durable.py): the emulator needs no code path of its own.
    # Standard mode retries throttling, 5xx and dropped connections with backoff; a checkpoint upload
    # that still fails is reported, and the next checkpoint tries again.
    config = Config(retries={"mode": "standard", "total_max_attempts": 6}, connect_timeout=10, read_timeout=120)
    # A session of its own: boto3's default one is shared, not thread-safe, and caches the credentials it
    # found first (a mirror built in an upload thread, or after the environment changed, must not use them).
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of s3://bucket[/prefix]; the prefix has no leading or trailing slash."""
    if not url.startswith("s3://"):
        raise BadInput(f"'{url}' is not an S3 URL", URL_HINT)
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not BUCKET.fullmatch(bucket) or ".." in bucket:
        raise BadInput(f"'{bucket}' in '{url}' is not a valid bucket name (3-63 characters: a-z, 0-9, '.', '-')",
                       URL_HINT)
    if prefix.startswith("/") or "//" in prefix:
        raise BadInput(f"the prefix '{prefix}' in '{url}' has an empty part ('//')", URL_HINT)
    prefix = prefix.rstrip("/")
    if any(part in (".", "..") for part in prefix.split("/")) or prefix != prefix.strip():
        raise BadInput(f"the prefix '{prefix}' in '{url}' has '.' or '..' parts or stray spaces", URL_HINT)
    return bucket, prefix


def step_of(name: str) -> int | None:
    """The step number of a checkpoint folder name (step-000040 -> 40), or None for another name."""
    m = STEP.fullmatch(name)
    return int(m.group(1)) if m else None


class S3Mirror:
    """Checkpoint folders under s3://bucket/prefix/<name>/, each with its COMPLETE marker uploaded last."""

    def __init__(self, url: str, client: Any | None = None) -> None:
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_s3_url(url)
        self.client = client if client is not None else s3_client()

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def upload(self, ckpt: Path) -> None:
        """Upload a finished checkpoint folder; its COMPLETE marker goes last, after every other file."""
        if step_of(ckpt.name) is None:
            raise BadInput(f"{ckpt} is not named like a checkpoint", "Name checkpoint folders step-NNNNNN")
        if not (ckpt / MARKER).is_file():
            raise BadInput(f"{ckpt} has no {MARKER} marker", "Upload a checkpoint only once it is fully written")
        files = {p.relative_to(ckpt).as_posix(): p for p in ckpt.rglob("*") if p.is_file() and p.name != MARKER}
        with self._errors(f"upload {ckpt.name} to {self.url}"):
            # A re-upload of the same step must not look complete while its files are half replaced,
            # nor keep files of the earlier upload that this one lacks (a rank file of a larger world).
            self.client.delete_object(Bucket=self.bucket, Key=self._key(ckpt.name, MARKER))
            earlier = self._listing(ckpt.name).get(ckpt.name, {})
            for rel in sorted(files):
                self.client.upload_file(str(files[rel]), self.bucket, self._key(ckpt.name, rel))
            self._delete([key for rel, key in earlier.items() if rel not in files])
            self.client.upload_file(str(ckpt / MARKER), self.bucket, self._key(ckpt.name, MARKER))

    def complete(self) -> list[str]:
        """Names of the checkpoints whose COMPLETE marker is in S3, oldest step first."""
        return _complete(self._listing())

    def download(self, name: str, dest_dir: Path) -> Path:
        """Download a complete checkpoint to dest_dir/<name> (via <name>.part and a rename); its path."""
        listing = self._listing()
        if MARKER not in listing.get(name, {}):
            raise MirrorError(f"no complete checkpoint '{name}' in {self.url}",
                              f"Pick one of: {', '.join(self.complete()) or 'none (start from scratch)'}",
                              "NoSuchCheckpoint")
        final, part = dest_dir / name, dest_dir / f"{name}.part"
        shutil.rmtree(part, ignore_errors=True)  # what an interrupted download left
        with self._errors(f"download {name} from {self.url}"):
            for rel, key in sorted(listing[name].items(), key=lambda item: item[0] == MARKER):
                target = part / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, key, str(target))
        if final.exists():
            shutil.rmtree(final)  # a stale or half-written local copy: S3's complete one wins
        part.rename(final)
        return final

    def prune(self, keep: int) -> None:
        """Delete all but the newest `keep` complete checkpoints, and incomplete ones older than the newest."""
        if keep < 1:
            raise BadInput(f"keep={keep} would delete every checkpoint", "Keep at least 1 to be able to resume")
        listing = self._listing()
        done = _complete(listing)
        if not done:
            return
        newest = step_of(done[-1]) or 0
        stale = [n for n in listing if n not in done[-keep:] and (n in done or (step_of(n) or 0) < newest)]
        # Markers first: a checkpoint interrupted mid-delete must not be listed as complete.
        markers = [listing[n][MARKER] for n in stale if MARKER in listing[n]]
        rest = [key for n in stale for rel, key in listing[n].items() if rel != MARKER]
        with self._errors(f"prune {self.url}"):
            self._delete(markers)
            self._delete(rest)

    def _delete(self, keys: list[str]) -> None:
        """Delete keys, 1,000 a call (S3's limit); a key S3 refused fails the whole prune."""
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i:i + 1000]]
            reply = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if reply.get("Errors"):
                first = reply["Errors"][0]
                raise MirrorError(f"S3 did not delete {len(reply['Errors'])} keys, e.g. {first.get('Key')}: "
                                  f"{first.get('Message')}", "Check s3:DeleteObject on the bucket, then re-run",
                                  first.get("Code", ""))

    def _listing(self, only: str = "") -> dict[str, dict[str, str]]:
        """Checkpoint folder name -> {path inside the folder: S3 key}, for folders named step-N (or `only`)."""
        found: dict[str, dict[str, str]] = {}
        start = f"{self.prefix}/" if self.prefix else ""
        under = f"{start}{only}/" if only else start
        with self._errors(f"list {self.url}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=under):
                for obj in page.get("Contents", []):
                    name, _, rel = obj["Key"][len(start):].partition("/")
                    if step_of(name) is not None and rel and ".." not in rel.split("/"):
                        found.setdefault(name, {})[rel] = obj["Key"]
        return found

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """botocore's exceptions, raised in the block, as MirrorErrors that say what to do."""
        try:
            yield
        except CpudistError:
            raise
        except S3UploadFailedError as e:  # boto3 wraps the ClientError of a managed upload
            raise translate(e.__context__ or e, doing, self.bucket) from e
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise translate(e, doing, self.bucket) from e


def _complete(listing: dict[str, dict[str, str]]) -> list[str]:
    """The names in a listing whose marker is there, oldest step first."""
    return sorted((n for n, keys in listing.items() if MARKER in keys), key=lambda n: step_of(n) or 0)


def translate(e: BaseException, doing: str, bucket: str) -> MirrorError:
    """The MirrorError for a botocore exception met while `doing` something with `bucket`."""
    if isinstance(e, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return MirrorError(f"cannot {doing}: no AWS credentials found",
                           "Run `aws configure`, set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
                           "or attach an instance profile that may use the bucket", "NoCredentials")
    if isinstance(e, botocore.exceptions.EndpointConnectionError | botocore.exceptions.ConnectionError):
        return MirrorError(f"cannot {doing}: S3 is unreachable ({e})",
                           "Check the network and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL if set", type(e).__name__)
    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", "Unknown"))
        code = {"404": "NoSuchKey", "403": "AccessDenied"}.get(code, code)  # HEAD answers carry no body
        hint = HINTS.get(code, "See the AWS S3 documentation for this error code").format(bucket=bucket)
        return MirrorError(f"cannot {doing}: {code}: {err.get('Message', e)}", hint, code)
    return MirrorError(f"cannot {doing}: {e}", "Re-run with --debug for details", type(e).__name__)
