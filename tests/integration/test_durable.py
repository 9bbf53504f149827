"""Checkpoint mirroring (train/durable.py) over the S3 store (cloud/aws/objects.py) against moto's
S3 server over HTTP: the client is boto3's own, found by its env vars."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from hypothesis import given
from hypothesis import strategies as st

from cpudist.cloud.aws.objects import S3Objects, parse_s3_url
from cpudist.errors import BadInput, CpudistError
from cpudist.train.checkpoint_meta import COMPLETE
from cpudist.train.durable import Mirror, MirrorError, copy_or_warn, runs_in
from tests.harness.s3 import FAKE_CREDENTIALS, S3Server


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """boto3 pointed at the emulator the way a node would be, by environment only; a client for
    checks."""
    for key, value in {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3_server.url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return boto3.client("s3", endpoint_url=s3_server.url)


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def checkpoint(root: Path, step: int, size: int = 4096, complete: bool = True) -> Path:
    """A local checkpoint folder of random files (one in a subfolder), with its marker when
    complete."""
    ckpt = root / f"step-{step:06d}"
    (ckpt / "ranks").mkdir(parents=True)
    for rel in ("model.pt", "optim.pt", "ranks/rank-0.pt"):
        (ckpt / rel).write_bytes(os.urandom(size))
    if complete:
        (ckpt / COMPLETE).write_text(f"{step}\n")
    return ckpt


def keys(s3: Any, bucket: str) -> set[str]:
    return {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])}


def test_upload_list_download_round_trip(s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}/runs/sst2/"))
    first = checkpoint(tmp_path / "out", 900, size=9 * 2**20)  # above boto3's multipart threshold
    second = checkpoint(tmp_path / "out", 1000)
    mirror.upload(second)
    mirror.upload(first)
    assert mirror.complete() == ["step-000900", "step-001000"]
    assert "runs/sst2/step-000900/ranks/rank-0.pt" in keys(s3, bucket)
    got = mirror.download("step-000900", tmp_path / "fresh")
    assert got == tmp_path / "fresh" / "step-000900"
    for path in first.rglob("*"):
        if path.is_file():
            assert (got / path.relative_to(first)).read_bytes() == path.read_bytes()
    # no .part left
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["step-000900"]


def test_marker_is_uploaded_last(s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}"))
    order: list[str] = []
    mirror.store.client.meta.events.register("before-parameter-build.s3.PutObject",
                                       lambda params, **_: order.append(params["Key"]))
    mirror.upload(checkpoint(tmp_path, 40))
    assert len(order) == 4 and order[-1] == f"step-000040/{COMPLETE}"
    assert mirror.complete() == ["step-000040"]  # no prefix: checkpoints at the bucket's root


def test_checkpoint_without_marker_is_not_listed(s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}/run"))
    mirror.upload(checkpoint(tmp_path, 10))
    half = checkpoint(tmp_path, 20, complete=False)
    for path in half.rglob("*.pt"):  # an upload cut short before its marker
        s3.upload_file(str(path), bucket, f"run/{half.name}/{path.relative_to(half).as_posix()}")
    s3.put_object(Bucket=bucket, Key="run/notes.txt", Body=b"not a checkpoint")
    assert mirror.complete() == ["step-000010"]
    with pytest.raises(MirrorError, match=r"no complete checkpoint 'step-000020'.*step-000010"):
        mirror.download("step-000020", tmp_path / "fresh")


def test_reupload_replaces_the_earlier_copy(s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}/run"))
    ckpt = checkpoint(tmp_path, 60)
    (ckpt / "ranks" / "rank-1.pt").write_bytes(b"from a world of two")
    mirror.upload(ckpt)
    (ckpt / "ranks" / "rank-1.pt").unlink()
    (ckpt / "model.pt").write_bytes(b"retrained")
    mirror.upload(ckpt)
    kept = ("model.pt", "optim.pt", "ranks/rank-0.pt", COMPLETE)
    assert keys(s3, bucket) == {f"run/step-000060/{rel}" for rel in kept}
    got = mirror.download("step-000060", tmp_path / "fresh")
    assert (got / "model.pt").read_bytes() == b"retrained"


def test_download_replaces_a_stale_local_copy(s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}/run"))
    mirror.upload(checkpoint(tmp_path / "src", 30))
    stale = checkpoint(tmp_path / "dest", 30, complete=False)
    (tmp_path / "dest" / "step-000030.part").mkdir()  # left by an interrupted download
    got = mirror.download("step-000030", tmp_path / "dest")
    assert got == stale and (got / COMPLETE).read_text() == "30\n"
    assert (got / "model.pt").read_bytes() == (
        tmp_path / "src" / "step-000030" / "model.pt").read_bytes()
    assert not (tmp_path / "dest" / "step-000030.part").exists()


def test_prune_keeps_the_newest(s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}/run"))
    for step in (10, 20, 30, 40):
        mirror.upload(checkpoint(tmp_path, step))
    for step in (15, 50):  # one abandoned upload, one still under way
        s3.put_object(Bucket=bucket, Key=f"run/step-{step:06d}/model.pt", Body=b"partial")
    mirror.prune(keep=2)
    assert mirror.complete() == ["step-000030", "step-000040"]
    folders = {k.split("/")[1] for k in keys(s3, bucket)}
    assert folders == {"step-000030", "step-000040", "step-000050"}
    mirror.prune(keep=2)  # converges: nothing more to delete
    assert mirror.complete() == ["step-000030", "step-000040"]
    with pytest.raises(BadInput, match="keep=0"):
        mirror.prune(keep=0)


def test_upload_refuses_an_unfinished_checkpoint(s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}/run"))
    with pytest.raises(BadInput, match="no COMPLETE marker"):
        mirror.upload(checkpoint(tmp_path, 5, complete=False))
    (tmp_path / "latest").mkdir()
    with pytest.raises(BadInput, match="not named like a checkpoint"):
        mirror.upload(tmp_path / "latest")
    assert keys(s3, bucket) == set()


def test_missing_bucket_says_how_to_create_it(s3: Any, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects("s3://no-such-bucket-here/run"))
    with pytest.raises(MirrorError, match=r"NoSuchBucket.*aws s3 mb s3://no-such-bucket-here") as e:
        mirror.complete()
    assert e.value.code == "NoSuchBucket" and isinstance(e.value, CpudistError)
    with pytest.raises(MirrorError, match=r"cannot upload step-000001.*aws s3 mb"):
        mirror.upload(checkpoint(tmp_path, 1))


def test_no_credentials_says_how_to_configure(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance profile to find off EC2
    with pytest.raises(MirrorError, match=r"no AWS credentials.*aws configure") as e:
        Mirror(S3Objects("s3://some-bucket/run")).complete()
    assert e.value.exit_code == 2  # the user's setup, as bad input


def test_unreachable_endpoint_is_reported(s3: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    client = boto3.client("s3", endpoint_url=dead, config=Config(retries={"total_max_attempts": 1}))
    with pytest.raises(MirrorError, match=r"S3 is unreachable.*AWS_ENDPOINT_URL_S3"):
        Mirror(S3Objects("s3://some-bucket", client=client)).complete()


@pytest.mark.parametrize("url",
                         ["", "my-bucket/run", "s3:/my-bucket", "s3://", "s3://My_Bucket/run",
                          "s3://ab", "s3://bucket//run", "s3://bucket/../run",
                          "https://b.s3.amazonaws.com/x"])
def test_bad_url_is_bad_input(url: str) -> None:
    with pytest.raises(BadInput, match="s3://bucket/prefix"):
        parse_s3_url(url)


def test_parse_examples() -> None:
    assert parse_s3_url("s3://my-bucket") == ("my-bucket", "")
    assert parse_s3_url("s3://my-bucket/") == ("my-bucket", "")
    assert parse_s3_url("s3://my.bucket-1/runs/sst2/") == ("my.bucket-1", "runs/sst2")


segment = st.text(st.sampled_from("abcz019-_.="), min_size=1,
                  max_size=12).filter(lambda s: s not in (".", ".."))


@given(bucket=st.from_regex(r"[a-z0-9][a-z0-9-]{1,20}[a-z0-9]", fullmatch=True),
       parts=st.lists(segment, max_size=4))
def test_parse_round_trips(bucket: str, parts: list[str]) -> None:
    prefix = "/".join(parts)
    assert parse_s3_url(f"s3://{bucket}/{prefix}") == (bucket, prefix)


@given(st.text(max_size=40))
def test_parse_any_text_is_a_location_or_bad_input(url: str) -> None:
    try:
        bucket, prefix = parse_s3_url(url)
    except BadInput:
        return
    assert url.startswith(f"s3://{bucket}") and not prefix.startswith("/") and not prefix.endswith(
        "/")


def test_runs_sharing_a_location_keep_their_own_checkpoints(s3: Any, bucket: str,
                                                            tmp_path: Path) -> None:
    """The README's per-task prefix shared by two runs: each prunes and lists only its own part
    (<prefix>/<run id>/)."""
    first = Mirror(S3Objects(f"s3://{bucket}/runs/mrpc"), "20261126-090000-aaaaaa")
    for step in (4, 6):
        first.upload(checkpoint(tmp_path / "a", step))
        first.prune(keep=2)
    second = Mirror(S3Objects(f"s3://{bucket}/runs/mrpc"), "20261126-100000-bbbbbb")
    second.upload(checkpoint(tmp_path / "b", 1))
    second.prune(keep=2)
    assert second.url == f"s3://{bucket}/runs/mrpc/20261126-100000-bbbbbb"
    assert second.complete() == ["step-000001"]
    assert first.complete() == ["step-000004", "step-000006"]
    assert {k.split("/")[2] for k in keys(s3, bucket)} == {"20261126-090000-aaaaaa",
                                                           "20261126-100000-bbbbbb"}
    assert runs_in(S3Objects(f"s3://{bucket}/runs/mrpc")) == {
        "20261126-090000-aaaaaa": ["step-000004", "step-000006"],
        "20261126-100000-bbbbbb": ["step-000001"]}


def test_prune_after_a_resume_keeps_the_upload_and_sets_the_old_timeline_aside(
        s3: Any, bucket: str, tmp_path: Path) -> None:
    mirror = Mirror(S3Objects(f"s3://{bucket}/run"), "20261126-090000-aaaaaa")
    for step in (2, 4, 6):
        mirror.upload(checkpoint(tmp_path / "a", step))
    # resuming from step 2
    assert mirror.set_aside(2, "20261126-100000") == ["step-000004", "step-000006"]
    assert mirror.complete() == ["step-000002"]
    mirror.upload(checkpoint(tmp_path / "b", 3))
    mirror.prune(keep=1, written="step-000003")
    assert mirror.complete() == ["step-000003"]
    aside = {k.split("/", 3)[3] for k in keys(s3, bucket) if "/abandoned-20261126-100000/" in k}
    assert aside == {f"step-{s:06d}/{rel}" for s in (4, 6)
                     for rel in ("model.pt", "optim.pt", "ranks/rank-0.pt",
                                  COMPLETE)}
    # Without set_aside (an older cpudist's copy), prune still never deletes what was just uploaded.
    mirror.upload(checkpoint(tmp_path / "c", 9))
    mirror.upload(checkpoint(tmp_path / "d", 5))
    mirror.prune(keep=1, written="step-000005")
    assert mirror.complete() == ["step-000005", "step-000009"]


@pytest.mark.parametrize("hostile", ["absolute", "dot-dot"])
def test_a_key_that_leaves_the_checkpoint_folder_fails_the_download_and_writes_nothing(
        s3: Any, bucket: str, tmp_path: Path, hostile: str) -> None:
    """Keys come from whoever can write to the bucket: 'step-N//abs/path' or 'step-N/../../x' is
    refused by name."""
    mirror = Mirror(S3Objects(f"s3://{bucket}/runs/sst2"))
    mirror.upload(checkpoint(tmp_path / "out", 5))
    dest = tmp_path / "deep" / "checkpoints"
    outside = tmp_path / "planted" if hostile == "absolute" else tmp_path / "deep" / "planted"
    rel = str(outside) if hostile == "absolute" else "../../planted"  # from dest/step-000005.part/
    key = f"runs/sst2/step-000005/{rel}"
    assert ("//" in key) == (hostile == "absolute")
    s3.put_object(Bucket=bucket, Key=key, Body=b"planted")
    assert key in keys(s3, bucket)  # the emulator keeps the key as it was put
    with pytest.raises(MirrorError) as e:
        mirror.download("step-000005", dest)
    assert str(e.value).startswith(f"the key 'step-000005/{rel}' in s3://{bucket}/runs/sst2 would "
                                   "be written "
                                   "outside its checkpoint folder") and "\n" not in str(e.value)
    assert e.value.code == "UnsafeKey"
    assert not outside.exists() and not dest.exists()  # nothing written, not even the .part folder


def test_a_copy_that_fails_is_a_warning_and_the_local_checkpoint_stays(tmp_path: Path,
                                                                       s3: Any) -> None:
    """copy_or_warn, the checkpoint-time copy: the store stopped after one good upload (a server of
    its own)."""
    with S3Server() as server:
        client = boto3.client("s3", endpoint_url=server.url,
                              config=Config(retries={"total_max_attempts": 1}))
        client.create_bucket(Bucket="ckpt")
        mirror = Mirror(S3Objects("s3://ckpt/run", client=client), "r1")
        assert copy_or_warn(mirror, checkpoint(tmp_path, 5), keep=2) is None
        assert mirror.complete() == ["step-000005"]
    second = checkpoint(tmp_path, 10)
    before = {p.name: p.read_bytes() for p in second.rglob("*") if p.is_file()}
    warning = copy_or_warn(mirror, second, keep=2)
    assert warning is not None and warning.startswith("warning: step-000010 is not copied to "
                                                      "s3://ckpt/run/r1")
    assert ("S3 is unreachable" in warning and f"kept at {second}" in warning
            and "next checkpoint" in warning)
    # nothing lost locally
    assert {p.name: p.read_bytes() for p in second.rglob("*") if p.is_file()} == before
