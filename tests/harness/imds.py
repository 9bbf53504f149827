"""EC2's instance metadata service (IMDSv2) as far as spot notices and instance ids go, over
real HTTP, per client address.

    python -m tests.harness.imds --port 8169
    # then: curl -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' ...

Every node of a namespace test cluster reaches the same server from its own private address, so a
notice is scheduled for one client address (or for all): only that node hears "terminate".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
ID_PATH = "/latest/meta-data/instance-id"


class _Handler(BaseHTTPRequestHandler):
    server: _Http

    def do_PUT(self) -> None:
        imds = self.server.imds
        imds.record(self.client_address[0], "PUT", self.path)
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if self.path != TOKEN_PATH:
            self._reply(404, b"Not Found")
        elif not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            self._reply(400, b"Bad Request")  # what IMDS answers to a missing or out-of-range TTL
        else:
            self._reply(200, imds.new_token(int(ttl)).encode())

    def do_GET(self) -> None:
        imds = self.server.imds
        client = self.client_address[0]
        imds.record(client, "GET", self.path)
        if not imds.valid(self.headers.get("X-aws-ec2-metadata-token", "")):
            self._reply(401, b"Unauthorized")
        elif self.path == ID_PATH and (instance := imds.instance_of(client)) is not None:
            self._reply(200, instance.encode())
        elif self.path != ACTION_PATH or (body := imds.body_for(client)) is None:
            self._reply(404, b"Not Found")
        else:
            self._reply(200, body.encode(), "application/json")

    def _reply(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # one line per poll drowns test output
    def log_message(self, format: str, *args: object) -> None:
        pass


class _Http(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], imds: ImdsServer) -> None:
        super().__init__(address, _Handler)
        self.imds = imds


class ImdsServer:
    """IMDSv2 tokens and spot/instance-action on a port, in a thread; notices scheduled per
    client."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        self._host = host
        self.requests: list[tuple[str, str, str]] = []  # (client address, method, path)
        self._tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        # client address (None: every client) -> instance-action body
        self._bodies: dict[str | None, str] = {}
        self._instances: dict[str | None, str] = {}  # client address (None: all) -> instance id
        self._lock = threading.Lock()
        self._http = _Http((host, port), self)
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), name="imds",
                                        daemon=True)

    @property
    def url(self) -> str:
        """The endpoint to give fetch_notice (loopback where the server listens on every
        address)."""
        return f"http://{'127.0.0.1' if self._host == '0.0.0.0' else self._host}:{self.port}"

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    def start(self) -> ImdsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def __enter__(self) -> ImdsServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def schedule(self, action: str = "terminate", for_client: str | None = None,
                 time: str | None = None,
                 raw: str | None = None) -> None:
        """Post a notice for one client address (None: all); `raw` replaces the JSON body (a
        malformed one)."""
        when = time or (datetime.now(UTC) + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._lock:
            self._bodies[for_client] = (raw if raw is not None
                                        else json.dumps({"action": action, "time": when}))

    def identify(self, instance_id: str, for_client: str | None = None) -> None:
        """Answer instance-id with `instance_id` to one client address (None: all)."""
        with self._lock:
            self._instances[for_client] = instance_id

    def instance_of(self, client: str) -> str | None:
        with self._lock:
            return self._instances.get(client, self._instances.get(None))

    def clear(self) -> None:
        """Withdraw every notice (IMDS answers 404 again)."""
        with self._lock:
            self._bodies.clear()

    def record(self, client: str, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((client, method, path))

    def new_token(self, ttl_s: int) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl_s
        return token

    def valid(self, token: str) -> bool:
        with self._lock:
            return self._tokens.get(token, 0.0) > time.monotonic()

    def body_for(self, client: str) -> str | None:
        with self._lock:
            return self._bodies.get(client, self._bodies.get(None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8169)
    ap.add_argument("--terminate", metavar="CLIENT",
                    help="post a terminate notice for this client address")
    ap.add_argument("--control", type=Path, metavar="FILE",
                    help="follow FILE: each line 'CLIENT ACTION' schedules a notice; an empty file "
                         "clears them "
                         "(how a test in another network namespace steers this server)")
    a = ap.parse_args()
    with ImdsServer(a.host, a.port) as imds:
        if a.terminate:
            imds.schedule("terminate", for_client=a.terminate)
        print(f"IMDS on {imds.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            if a.control is None:
                threading.Event().wait()
            seen = None
            while True:
                text = a.control.read_text() if a.control.is_file() else ""
                if text != seen:
                    imds.clear()
                    for line in text.splitlines():
                        client, action = line.split()
                        imds.schedule(action, for_client=client)
                    seen = text
                time.sleep(0.2)


if __name__ == "__main__":
    main()
