"""#23 item 2, the S3 endpoint's loss noticed within 30 s (train/store_watch.py): the rank that
copies checkpoints probes the store while it trains, against moto's S3 server over HTTP, stopped
mid-run."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from cpudist.cloud.aws.objects import S3Objects
from cpudist.train.durable import Mirror
from cpudist.train.store_watch import DETECTION_BOUND_S, StoreWatch
from tests.harness.s3 import FAKE_CREDENTIALS, S3Server
from tests.integration.helpers import CPUDIST, kill_tree, output_of
from tests.integration.test_resume import common, logged


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """boto3's settings of a node, pointing at no endpoint yet (each test starts its own server)."""
    env = {**FAKE_CREDENTIALS, "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


def make_bucket(url: str) -> str:
    name = f"watch-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=name)
    return name


class Lines:
    """What the watch says, with when."""

    def __init__(self) -> None:
        self.said: list[tuple[float, str]] = []

    def __call__(self, line: str) -> None:
        self.said.append((time.monotonic(), line))

    def wait(self, count: int, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while len(self.said) < count:
            assert time.monotonic() < deadline, self.said
            time.sleep(0.05)


def test_a_stopped_endpoint_is_said_once_and_its_return_too(
        s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    server = S3Server().start()
    port, url = server.server.port, server.url
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
    bucket = make_bucket(url)
    said = Lines()
    watch = StoreWatch(Mirror(S3Objects(f"s3://{bucket}/runs"), "run-1").store, said, every_s=0.2)
    with watch:
        while watch.probes < 5:
            time.sleep(0.05)
        assert said.said == [] and watch.lost is None  # an endpoint that answers is not reported
        server.stop()
        stopped = time.monotonic()
        said.wait(1, within_s=DETECTION_BOUND_S)
        at, line = said.said[0]
        assert at - stopped < DETECTION_BOUND_S
        assert line.startswith("warning: the store of the checkpoint copies "
                               f"s3://{bucket}/runs/run-1 stopped "
                               f"answering (S3 endpoint {url}: S3 is unreachable"), line
        assert "training goes on" in line and "--resume auto" in line and "\n" not in line
        seen = watch.probes
        while watch.probes < seen + 3:  # more failed probes: still one line
            time.sleep(0.05)
        assert len(said.said) == 1 and watch.lost is not None
        # moto's buckets live in this process: the same store, back
        again = S3Server(port=port).start()
        try:
            said.wait(2, within_s=DETECTION_BOUND_S)
        finally:
            again.stop()
    assert said.said[1][1] == (f"the store of the checkpoint copies s3://{bucket}/runs/run-1 "
                               "answers again; the next checkpoint is copied there")


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    server = S3Server().start()
    try:
        yield server
    finally:
        if server.thread.is_alive():
            server.stop()


@pytest.mark.slow
def test_a_run_says_its_s3_endpoint_stopped_long_before_its_next_checkpoint(
        shared_data: Path, tmp_path: Path, s3_env: dict[str, str], s3_server: S3Server) -> None:
    """One rank copying checkpoints to S3 every 100000 steps: the server stopped mid-run is said in
    one line within the bound, naming the endpoint, and training goes on (test_spot: a stop then
    still ends as a stop, 75)."""
    bucket = make_bucket(s3_server.url)
    run_dir = tmp_path / "run"
    args = [*common(shared_data), "--max-steps", "100000", "--np", "1", "--no-eval",
            "--checkpoint-every", "100000",
            "--checkpoint-s3", f"s3://{bucket}/runs", "--output-dir", str(run_dir)]
    env = {**os.environ, **s3_env, "AWS_ENDPOINT_URL_S3": s3_server.url}
    proc = subprocess.Popen([*CPUDIST, "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr or ():
            lines.append((time.monotonic(), line))

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while logged(run_dir) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, output_of(proc)
            time.sleep(0.05)
        s3_server.stop()
        stopped = time.monotonic()
        while not (warned := [(at, line) for at, line in lines if "stopped answering" in line]):
            assert proc.poll() is None and time.monotonic() < stopped + 60, "".join(line for _,
                                                                                    line in lines)
            time.sleep(0.1)
        at, line = warned[0]
        assert at - stopped < 30, (at - stopped, line)  # the bound; the watch's own is 20 s
        assert f"[cpudist] warning: the store of the checkpoint copies s3://{bucket}/runs/" \
            in line, line
        assert f"(S3 endpoint {s3_server.url}: S3 is unreachable" in line, line
        going = logged(run_dir)
        while logged(run_dir) < going + 2:  # training goes on
            assert proc.poll() is None, "".join(line for _, line in lines)
            time.sleep(0.05)
    finally:
        kill_tree(proc)
