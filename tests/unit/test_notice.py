"""Spot notices read over real HTTP from the IMDSv2 harness: tokens, per-client notices, the watcher
thread."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.cloud.aws.notice import ImdsUnreachable, Notice, NoticeWatcher, fetch_notice, on_ec2
from tests.harness.imds import ACTION_PATH, TOKEN_PATH, ImdsServer
from tests.integration.helpers import wait_for


@pytest.fixture
def imds() -> Iterator[ImdsServer]:
    with ImdsServer() as server:
        yield server


def _closed_port() -> str:
    """An endpoint where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _get_action(port: int, source: str, token: str | None) -> int:
    """The status of a GET of instance-action from `source`, a loopback address of this host."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    conn.request("GET", ACTION_PATH, headers={"X-aws-ec2-metadata-token": token} if token else {})
    status = conn.getresponse().status
    conn.close()
    return status


def _token(port: int, source: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    conn.request("PUT", TOKEN_PATH, headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    token = conn.getresponse().read().decode()
    conn.close()
    return token


def test_nothing_scheduled_is_none(imds: ImdsServer) -> None:
    assert fetch_notice(imds.url) is None
    assert [(m, p) for _, m, p in imds.requests] == [("PUT", TOKEN_PATH), ("GET", ACTION_PATH)]


def test_terminate_for_all_clients(imds: ImdsServer) -> None:
    imds.schedule("terminate", time="2026-05-01T12:00:00Z")
    assert fetch_notice(imds.url) == Notice("terminate", "2026-05-01T12:00:00Z")
    imds.clear()
    assert fetch_notice(imds.url) is None


def test_notice_for_one_client_only(imds: ImdsServer) -> None:
    imds.schedule("stop", for_client="10.0.0.7")
    assert fetch_notice(imds.url) is None  # we are 127.0.0.1
    imds.schedule("terminate", for_client="127.0.0.1")
    notice = fetch_notice(imds.url)
    assert notice is not None and notice.action == "terminate" and notice.time


def test_server_answers_per_source_address(imds: ImdsServer) -> None:
    imds.schedule("terminate", for_client="127.0.0.2")
    assert _get_action(imds.port, "127.0.0.2", _token(imds.port, "127.0.0.2")) == 200
    assert _get_action(imds.port, "127.0.0.3", _token(imds.port, "127.0.0.3")) == 404
    assert ("127.0.0.2", "GET", ACTION_PATH) in imds.requests


def test_server_plays_imdsv2_rules(imds: ImdsServer) -> None:
    imds.schedule("terminate")
    assert _get_action(imds.port, "127.0.0.1", None) == 401
    assert _get_action(imds.port, "127.0.0.1", "forged") == 401
    conn = http.client.HTTPConnection("127.0.0.1", imds.port, timeout=5)
    conn.request("PUT", TOKEN_PATH)
    assert conn.getresponse().status == 400  # no TTL header
    conn.close()
    # The client always takes a token first, so a server that demands one is no obstacle.
    assert fetch_notice(imds.url) is not None


def test_malformed_body_is_a_notice(imds: ImdsServer) -> None:
    imds.schedule(raw="<html>not json</html>")
    assert fetch_notice(imds.url) == Notice("unknown", None)
    imds.schedule(raw='{"time": "2026-05-01T12:00:00Z"}')
    assert fetch_notice(imds.url) == Notice("unknown", None)


def test_unreachable_raises() -> None:
    with pytest.raises(ImdsUnreachable, match="cannot reach"):
        fetch_notice(_closed_port(), timeout_s=1.0)


def test_watcher_sees_a_notice_posted_after_start(imds: ImdsServer) -> None:
    with NoticeWatcher(imds.url, interval_s=0.2) as watcher:
        wait_for(lambda: watcher.polls >= 2, 30, "two polls", lambda: f"{watcher.polls} polls")
        assert watcher.notice is None
        imds.schedule("terminate")
        notice = wait_for(lambda: watcher.notice, 30, "the watcher to see the notice")
        assert notice.action == "terminate"
        imds.clear()
        # Two more polls of the cleared service, or none can come (the watcher stops once it has a
        # notice).
        polls = watcher.polls
        wait_for(lambda: watcher.polls >= polls + 2 or not watcher._thread.is_alive(), 30,
                 "two polls after the notice was cleared, or the watcher to stop")
        assert watcher.notice == notice  # sticky: the node is going whatever IMDS says next
    assert watcher.errors == 0


def test_stop_is_prompt(imds: ImdsServer) -> None:
    """stop() wakes the watcher from its wait between polls: it takes a request's time, not the
    interval's."""
    watcher = NoticeWatcher(imds.url, interval_s=600, timeout_s=2.0).start()
    wait_for(lambda: watcher.polls >= 1, 30, "the first poll")  # then it waits out the interval
    started = time.monotonic()
    watcher.stop()  # joins for at most 2 * timeout_s + 1 s
    assert not watcher._thread.is_alive(), "stop() left the watcher waiting out its interval"
    # Not a speed check: a stop that waited for the interval would take 600 s, or leave the thread
    # alive.
    assert time.monotonic() - started < watcher.interval_s / 10


def test_unreachable_endpoint_is_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with NoticeWatcher(_closed_port(), interval_s=0.05) as watcher:
        wait_for(lambda: watcher.errors >= 6, 30, "six failed polls",
                 lambda: f"{watcher.errors} errors")
        assert watcher._thread.is_alive()
    assert watcher.errors >= 6 and watcher.notice is None
    said = [r for r in caplog.records if "in a row failed" in r.getMessage()]
    assert len(said) == 1  # said once, not once a poll


def test_on_ec2_reads_dmi(tmp_path: Path) -> None:
    assert on_ec2(tmp_path) is False  # unreadable: not EC2
    (tmp_path / "board_asset_tag").write_text("i-0123456789abcdef0\n")
    assert on_ec2(tmp_path) is True
    (tmp_path / "board_asset_tag").unlink()
    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    assert on_ec2(tmp_path) is True
    (tmp_path / "sys_vendor").write_text("QEMU\n")
    assert on_ec2(tmp_path) is False


def test_the_stop_reported_is_the_spot_notice_when_any_rank_saw_one() -> None:
    from cpudist.train.preempt import PEER, stop_reason

    notice = "spot interruption notice (terminate at 2026-11-24T14:25:00Z)"
    # rank 0 got a SIGTERM in the same step as rank 1's notice: the notice names the cause
    assert stop_reason([("n0", "SIGTERM"), ("n1", notice), ("n2", PEER)]) == ("n1", notice)
    assert stop_reason([("n0", PEER), ("n1", "SIGTERM")]) == ("n1", "SIGTERM")
    assert stop_reason([("n0", PEER), ("n1", PEER)]) == ("n0", PEER)
