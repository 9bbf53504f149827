"""Bad input is one line and exit 2, before anything is created, launched or touched outside
~/.cpudist."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.ec2 import FAKE_CREDENTIALS
from tests.integration.helpers import cpudist, in_process


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A user's home with files cpudist must never touch."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "known_hosts").write_text("example.org ssh-ed25519 AAAA\n")
    (h / ".ssh" / "id_ed25519").write_text("secret\n")
    (h / ".cpudist").mkdir()
    return h


def run_as_user(home: Path, *args: str | Path) -> tuple[int, str, dict[str, bytes]]:
    before = snapshot(home)
    r = in_process(*args, env={**os.environ, **FAKE_CREDENTIALS, "HOME": str(home),
                               "CPUDIST_HOME": str(home / ".cpudist")})
    outside = {k: v for k, v in snapshot(home).items() if not k.startswith(".cpudist")}
    assert outside == {k: v for k, v in before.items()
                       if not k.startswith(".cpudist")}, "touched outside ~/.cpudist"
    return r.returncode, r.stderr, snapshot(home / ".cpudist")


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


@pytest.mark.parametrize("name", ["../../.ssh", "UPPER", "a" * 41, "with space", "dots.dots", ""])
@pytest.mark.parametrize("command", [("cluster", "down", "--yes"), ("cluster", "status"),
                                     ("cluster", "up", "--nodes", "1", "--yes", "--ssh-cidr",
                                      "203.0.113.7/32")])
def test_cluster_names_that_are_not_names(home: Path, name: str, command: tuple[str, ...]) -> None:
    code, err, local = run_as_user(home, *command, "--name", name, "--endpoint-url",
                                   "http://127.0.0.1:9")
    assert code == 2 and "is not allowed" in one_error_line(err)
    assert local == {}


def test_run_with_a_cluster_name_that_is_a_path(home: Path) -> None:
    code, err, _ = run_as_user(home, "run", "synthetic", "--np", "2", "--ppn", "1", "--cluster",
                               "../../.ssh", "--model", "tiny")
    assert code == 2 and "is not allowed" in one_error_line(err)


@pytest.mark.parametrize(("cidr", "needle"),
                         [("0.0.0.0/0", "would let SSH in"), ("10.0.0.0/8", "would let SSH in"),
                          ("2001:db8::/32", "would let SSH in"), ("my-laptop", "not an address")])
def test_ssh_cidrs_that_admit_the_world_or_nothing(home: Path, cidr: str, needle: str) -> None:
    code, err, local = run_as_user(home, "cluster", "up", "--nodes", "1", "--yes", "--ssh-cidr",
                                   cidr, "--endpoint-url", "http://127.0.0.1:9")
    assert code == 2 and needle in one_error_line(err) and local == {}


def test_anywhere_is_allowed_when_said(home: Path) -> None:
    code, err, _ = run_as_user(home, "cluster", "up", "--nodes", "1", "--yes", "--ssh-cidr",
                               "0.0.0.0/0",
                               "--allow-ssh-from-anywhere", "--endpoint-url", "http://127.0.0.1:9")
    # past the check, at the network
    assert code == 1 and "cannot reach the EC2 endpoint" in one_error_line(err)


@pytest.mark.parametrize("url", ["not-a-url", "ftp://example.org", "http://"])
def test_endpoint_urls_that_are_not_urls(home: Path, url: str) -> None:
    code, err, _ = run_as_user(home, "cluster", "status", "--endpoint-url", url)
    assert code == 2 and "is not an http(s) URL" in one_error_line(err)


@pytest.fixture
def web_page() -> Iterator[str]:
    """Something that answers HTTP, but not like EC2 (a captive portal, a wrong port)."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = b"<html><body>Welcome to the hotel Wi-Fi</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_endpoint_that_is_not_ec2(home: Path, web_page: str) -> None:
    code, err, _ = run_as_user(home, "cluster", "status", "--endpoint-url", web_page)
    assert code == 2 and "did not answer like EC2" in one_error_line(err)


@pytest.mark.parametrize(("option", "value"),
                         [("--lr", "-1"), ("--lr", "0"), ("--weight-decay", "-0.1"),
                          ("--seed", "-3"), ("--max-seq-len", "100000"), ("--dropout", "1")])
def test_numbers_out_of_range_stop_before_launch(tmp_path: Path, option: str, value: str) -> None:
    out = tmp_path / "run"
    r = cpudist("run", "synthetic", "--np", "2", "--model", "tiny", "--max-steps", "2",
                "--output-dir", out, f"{option}={value}", timeout=60)
    assert (r.returncode == 2 and f"Invalid value for '{option}'" in r.stderr
            and "Traceback" not in r.stderr)
    assert not out.exists()


def test_the_layout_error_comes_before_any_ssh_probe(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n192.0.2.1\n")  # the second answers nothing (TEST-NET-1)
    r = cpudist("run", "synthetic", "--np", "3", "--ppn", "2", "--hostfile", hostfile, "--model",
                "tiny", timeout=60)
    assert r.returncode == 2 and "not divisible by --ppn 2" in one_error_line(r.stderr)


def test_a_dry_run_with_a_hostfile_creates_and_probes_nothing(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n192.0.2.1 slots = 2\n")
    out = tmp_path / "run"
    r = cpudist("run", "synthetic", "--np", "2", "--ppn", "1", "--hostfile", hostfile, "--model",
                "tiny", "--output-dir", out, "--dry-run", timeout=30)
    assert r.returncode == 0, r.stderr
    assert not out.exists()
    assert "localhost:1\n192.0.2.1:1\n" in r.stdout and "-f " in r.stdout
