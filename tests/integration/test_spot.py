"""Spot notices and durable checkpoints on this machine: a real IMDSv2 server over HTTP, moto's S3
server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.harness.imds import ImdsServer
from tests.harness.s3 import FAKE_CREDENTIALS, S3Server
from tests.integration.helpers import CPUDIST, cmdline, cpudist, descendants, output_of
from tests.integration.test_resume import common, logged, sigterm_ranks_at, steps

pytestmark = pytest.mark.slow


def test_a_spot_notice_stops_every_rank_with_a_checkpoint(shared_data: Path,
                                                          tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with ImdsServer("127.0.0.1") as imds:
        args = [*common(shared_data), "--max-steps", "100000", "--np", "2", "--output-dir",
                str(run_dir), "--imds-endpoint", imds.url, "--no-eval"]
        proc = subprocess.Popen([*CPUDIST, "run", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while logged(run_dir) < 10:
            assert proc.poll() is None and time.monotonic() < deadline, output_of(proc)
            time.sleep(0.05)
        # polled already
        assert any(path.endswith("/spot/instance-action") for _, _, path in imds.requests)
        imds.schedule("terminate", time="2026-11-22T12:00:00Z")
        noticed = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - noticed
    assert proc.returncode == 75, err
    assert took < 30, took  # polled every 5 s; AWS gives 120 s
    marker = json.loads((run_dir / "preempted.json").read_text())
    assert marker["reason"] == "spot interruption notice (terminate at 2026-11-22T12:00:00Z)"
    assert (run_dir / "checkpoints" / f"step-{marker['step']:06d}" / "COMPLETE").is_file()
    assert "Resume: the same command with --resume auto" in err
    assert not [p for p in descendants(os.getpid()) if "cpudist.rank" in cmdline(p)]


@pytest.fixture
def s3_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    with S3Server() as server:
        env = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": server.url,
               "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
               "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
        boto3.client("s3", endpoint_url=server.url, region_name="us-east-1",
                     aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="ckpt")
        yield env


def test_the_s3_copy_survives_losing_the_head_disk(shared_data: Path, tmp_path: Path,
                                                    s3_env: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    args = [*common(shared_data), "--np", "2", "--checkpoint-every", "10", "--checkpoint-s3",
            "s3://ckpt/runs/a"]
    old = {k: os.environ.get(k) for k in s3_env}
    os.environ.update(s3_env)  # the ranks inherit it, as nodes with an instance profile would
    try:
        stopped = sigterm_ranks_at([*args, "--output-dir", str(run_dir)], run_dir, 25, tmp_path)
        assert stopped.returncode == 75, stopped.stderr
        step = json.loads((run_dir / "preempted.json").read_text())["step"]
        shutil.rmtree(run_dir / "checkpoints")  # the head node went, and its disk with it
        resumed = cpudist("run", *args, "--output-dir", run_dir, "--resume", "auto")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert resumed.returncode == 0, resumed.stderr
    assert f"fetched step-{step:06d} from s3://ckpt/runs/a" in resumed.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from_step"] == step and result["checkpoints"]["s3"] == "s3://ckpt/runs/a"
    assert [s["step"] for s in steps(run_dir)] == list(range(1, 41))
    listed = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                          aws_access_key_id="testing",
                          aws_secret_access_key="testing").list_objects_v2(
        Bucket="ckpt", Prefix="runs/a/")
    run_id = result["run_id"]  # each run keeps its copy under <prefix>/<run id>/
    names = {o["Key"].split("/")[3] for o in listed.get("Contents", [])
             if o["Key"].split("/")[2] == run_id}
    assert names == {"step-000030", "step-000040"}, names  # --keep-checkpoints 2 holds in S3 too


def test_a_stop_with_s3_down_keeps_the_local_checkpoint_and_exits_75(shared_data: Path,
                                                                     tmp_path: Path) -> None:
    """S3 goes away mid-run (the server stopped after the first copy): the stop's checkpoint is
    written on the head, its copy fails with one warning line, and the run still ends as a stop
    (75), not a failure (1)."""
    run_dir = tmp_path / "run"
    args = [*common(shared_data), "--max-steps", "100000", "--np", "2", "--no-eval",
            "--checkpoint-every", "5",
            "--checkpoint-s3", "s3://ckpt/runs/a", "--output-dir", str(run_dir)]
    server = S3Server().start()
    check = boto3.client("s3", endpoint_url=server.url, region_name="us-east-1",
                         aws_access_key_id="testing", aws_secret_access_key="testing")
    check.create_bucket(Bucket="ckpt")
    env = {**os.environ, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": server.url,
           "AWS_MAX_ATTEMPTS": "2", "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    proc = subprocess.Popen([*CPUDIST, "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not any(o["Key"].endswith("step-000005/COMPLETE")
                      for o in check.list_objects_v2(Bucket="ckpt").get("Contents", [])):
            assert proc.poll() is None and time.monotonic() < deadline, output_of(proc)
            time.sleep(0.02)
    finally:
        server.stop()
    while logged(run_dir) < 12:
        assert proc.poll() is None and time.monotonic() < deadline, output_of(proc)
        time.sleep(0.02)
    for pid in [p for p in descendants(proc.pid) if "cpudist.rank" in cmdline(p)
                and "mpiexec" not in cmdline(p)]:
        os.kill(pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    step = json.loads((run_dir / "preempted.json").read_text())["step"]
    name = f"step-{step:06d}"
    assert (run_dir / "checkpoints" / name / "COMPLETE").is_file()
    assert f"warning: {name} is not copied to s3://ckpt/runs/a/" in err \
        and "S3 is unreachable" in err, err
    assert "Resume: the same command with --resume auto" in err
