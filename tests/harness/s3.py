"""S3 as moto's server emulates it, over HTTP on a loopback port, in a thread.

    python -m tests.harness.s3 --port 5056        # then: AWS_ENDPOINT_URL_S3=http://127.0.0.1:5056

Code under test talks to it the way it talks to AWS (boto3 over HTTP), not through moto's in-process
mock.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
from types import TracebackType

from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}


class _Quiet(WSGIRequestHandler):
    # one line per call drowns test output
    def log_request(self, *args: object, **kwargs: object) -> None:
        pass


class S3Server:
    """moto's S3 on a port, in a thread; buckets persist until `stop` (tests make their own)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        # moto picks the backend from the request's signature (service "s3"), as for EC2 in ec2.py.
        self.app = DomainDispatcherApplication(create_backend_app)
        self.server = make_server(host, port, self.app, threaded=True, request_handler=_Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="s3",
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    def start(self) -> S3Server:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=5056)
    a = ap.parse_args()
    with S3Server(port=a.port) as s3:
        print(f"S3 emulator on {s3.url}; export AWS_ENDPOINT_URL_S3={s3.url} "
              + " ".join(f"{k}={v}" for k, v in FAKE_CREDENTIALS.items()), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
