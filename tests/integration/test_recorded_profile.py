"""#23 item 8, the record keeps the profile it was made with: a cluster made without a profile
(boto3's default chain) keeps to that chain when AWS_PROFILE is set later, and one made with a
profile keeps to it when AWS_PROFILE names another. Which credentials sign the calls is read at
moto's EC2 over HTTP (the Authorization header)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

from cpudist.cloud.aws.client import ec2_client, resolve
from cpudist.cloud.provider import Place
from cpudist.cloud.record import ClusterRecord


class Signed:
    """moto's EC2 on a loopback port, keeping the access key id of every call it answers."""

    def __init__(self) -> None:
        self.moto = DomainDispatcherApplication(create_backend_app)
        self.keys: list[str] = []
        self.server = make_server("127.0.0.1", 0, self, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        found = re.search(r"Credential=([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
        self.keys.append(found.group(1) if found else "")
        return self.moto(environ, start_response)  # type: ignore[no-any-return]


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Signed]:
    """Two credentials: the default chain's (the [default] profile) and the `later` profile's; no
    AWS_* else."""
    (tmp_path / "credentials").write_text("[default]\naws_access_key_id = MADEWITHDEFAULT\n"
                                          "aws_secret_access_key = x\n"
                                          "[later]\naws_access_key_id = LATERPROFILE\n"
                                          "aws_secret_access_key = y\n"
                                          "[made]\naws_access_key_id = MADEWITHPROFILE\n"
                                          "aws_secret_access_key = z\n")
    (tmp_path / "config").write_text("[default]\nregion = us-east-1\n[profile later]\n"
                                     "region = eu-west-1\n"
                                     "[profile made]\nregion = us-east-1\n")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    server = Signed()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


def record(ec2: Signed, place: Place) -> ClusterRecord:
    """A cluster's record as `cluster up` writes it: the place resolved when it was made."""
    made = resolve(place)
    return ClusterRecord(name="c1", region=made.region or "", endpoint_url=made.endpoint_url,
                         instance_type="t3.micro", nodes=(), connect="public", user="ubuntu",
                         ssh_port=22, private_key="key", known_hosts="known", hostfile="hosts",
                         price_source="on-demand", created_at="2026-11-26T00:00:00Z",
                         profile=made.profile)


def signed_by(ec2: Signed, place: Place) -> str:
    ec2.keys.clear()
    ec2_client(place).describe_instances()
    return ec2.keys[-1]


def test_a_record_made_without_a_profile_keeps_to_the_default_chain(
        ec2: Signed, monkeypatch: pytest.MonkeyPatch) -> None:
    made = record(ec2, Place(None, ec2.url, None))
    assert made.profile is None and made.region == "us-east-1"
    assert signed_by(ec2, made.place) == "MADEWITHDEFAULT"
    monkeypatch.setenv("AWS_PROFILE", "later")  # set for other work, after the cluster was made
    assert signed_by(ec2, made.place) == "MADEWITHDEFAULT"
    assert signed_by(ec2, Place(None, ec2.url, None)) == "LATERPROFILE"  # a new cluster follows it
    # a profile that is not there any more: no matter to the record
    monkeypatch.setenv("AWS_PROFILE", "gone")
    monkeypatch.setenv("AWS_DEFAULT_PROFILE", "later")
    assert signed_by(ec2, made.place) == "MADEWITHDEFAULT"


def test_a_record_made_with_a_profile_keeps_it(ec2: Signed,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "made")
    made = record(ec2, Place(None, ec2.url, None))
    assert made.profile == "made"
    monkeypatch.setenv("AWS_PROFILE", "later")
    assert signed_by(ec2, made.place) == "MADEWITHPROFILE"
