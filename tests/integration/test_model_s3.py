"""`--model-s3` (issue 22): rank 0 copies the saved model to S3, SHA256SUMS last, against moto's S3
server over HTTP; the rank finds it as a node would, by boto3's environment only. A failed copy
leaves the model in the run folder, says so, and does not fail the run after training."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.harness.s3 import FAKE_CREDENTIALS, S3Server
from tests.integration.helpers import cpudist

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def node_env(s3_server: S3Server, tmp_path: Path) -> dict[str, str]:
    return {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3_server.url,
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_MAX_ATTEMPTS": "2"}


def client(s3_server: S3Server) -> Any:
    return boto3.client("s3", endpoint_url=s3_server.url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def run(shared_data: Path, out: Path, env: dict[str, str], *extra: str) -> Any:
    return cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", "tiny",
                   "--np", "1",
                   "--max-steps", "2", "--no-eval", "--output-dir", out, *extra, env=env)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_model_lands_in_s3_whole_checkable_and_loadable(
        shared_data: Path, s3_server: S3Server, node_env: dict[str, str], tmp_path: Path) -> None:
    s3, bucket = client(s3_server), f"models-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    r = run(shared_data, tmp_path / "run", node_env, "--model-s3", f"s3://{bucket}/team/")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    copied = result["model_s3"]
    prefix = f"team/{result['run_id']}/model"
    assert copied["url"] == f"s3://{bucket}/{prefix}" and "error" not in copied, copied
    assert f"and s3://{bucket}/{prefix}" in r.stdout and "model copied to" in r.stderr
    local = {p.relative_to(tmp_path / "run" / "model").as_posix(): p
             for p in (tmp_path / "run" / "model").rglob("*") if p.is_file()}
    # Everything came back, SHA256SUMS (sha256sum's format) names each file with its digest, and
    # every file, the card too, is byte for byte the run folder's: rank 0 writes the final card
    # once, the command in it.
    home = tmp_path / "downloaded"
    objects = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]
    for key in (o["Key"] for o in objects):
        (home / key[len(prefix) + 1:]).parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(home / key[len(prefix) + 1:]))
    sums = dict(reversed(line.split("  ", 1))
                for line in (home / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == set(local) and {o["Key"][len(prefix) + 1:]
                                        for o in objects} == set(local) | {"SHA256SUMS"}
    assert copied["files"] == len(local)
    assert copied["bytes"] == sum(o["Size"] for o in objects
                                  if not o["Key"].endswith("/SHA256SUMS"))
    for rel, path in local.items():
        assert sums[rel] == sha256(home / rel), rel
        assert sha256(path) == sums[rel], rel
    card = (home / "README.md").read_text()
    assert card.startswith(
        "---") and "mrpc" in card and f"--model-s3 s3://{bucket}/team/" in card, card[-800:]
    assert card == (tmp_path / "run" / "model" / "README.md").read_text()
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(home)
    assert model.config.id2label == {0: "not_equivalent", 1: "equivalent"}


def test_a_copy_that_fails_warns_and_keeps_the_model_in_the_run_folder(
        shared_data: Path, node_env: dict[str, str], tmp_path: Path) -> None:
    r = run(shared_data, tmp_path / "run", node_env, "--model-s3",
            f"s3://no-such-{uuid.uuid4().hex[:8]}/m", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING: the model was not copied to s3://no-such-" in r.stderr  # even with --quiet
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["model_s3"]["error"] and (tmp_path / "run" / "model" / "config.json").is_file()
    assert " and s3://" not in r.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--model-s3", "s3://bucket/m", "--save-model", "none"], "--save-model none saves none"),
    (["--model-s3", "https://bucket/m"], "is not an S3 URL"),
])
def test_a_model_s3_that_cannot_mean_what_it_says_is_refused_before_any_rank(
        shared_data: Path, tmp_path: Path, args: list[str], says: str) -> None:
    r = run(shared_data, tmp_path / "run", {}, *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "run" / "result.json").exists()
