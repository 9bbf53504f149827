"""AWS spot interruption notices, and which instance this is, read from the instance metadata
service (IMDSv2) with the stdlib.

    endpoint = imds_endpoint("auto")                 # AWS's own on EC2, else None
    watcher = NoticeWatcher(endpoint).start() if endpoint else None
    ...  # each step: if watcher and watcher.notice: checkpoint now and leave

AWS posts the notice about two minutes before it reclaims a spot instance and advises polling every
5 s. The rank's entry point (cpudist/rank.py) hands the watcher to the trainer as its notice poller
(cpudist/train/preempt.py: NoticePoller).
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cpudist.errors import CpudistError

DEFAULT_IMDS = "http://169.254.169.254"
# the longest AWS allows: one token would do, but each poll takes a fresh one anyway
TOKEN_TTL_S = 21600
QUIET_AFTER = 3  # failures in a row after which the watcher says once that IMDS is unreachable
DMI = Path("/sys/devices/virtual/dmi/id")
log = logging.getLogger(__name__)
# IMDS is link-local: an http_proxy from the environment must never see these requests.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ImdsUnreachable(CpudistError):
    """The metadata service did not answer (or refused us): whether a notice is posted is
    unknown."""


@dataclass(frozen=True)
class Notice:
    """A posted interruption: `action` is terminate, stop, hibernate (or unknown); `time` is AWS's
    UTC time."""

    action: str
    time: str | None


def on_ec2(dmi: Path = DMI) -> bool:
    """Whether this machine is an EC2 instance (by its DMI data: Nitro's vendor and asset tag,
    the Xen generation's BIOS version); False where that cannot be read."""
    return (_read(dmi / "board_asset_tag").startswith("i-")
            or "Amazon EC2" in _read(dmi / "sys_vendor") or "amazon" in _read(dmi / "bios_version"))


def imds_endpoint(setting: str) -> str | None:
    """The metadata service to poll: `auto` is AWS's own on EC2 only, `off` none, else the URL
    given."""
    if setting == "off":
        return None
    if setting == "auto":
        return DEFAULT_IMDS if on_ec2() else None
    return setting.rstrip("/")


def _read(path: Path) -> str:
    """A DMI field, or '' where it cannot be read (not Linux, no permission, no such field)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _request(req: urllib.request.Request, timeout_s: float) -> tuple[int, bytes]:
    """The status and body of one request; HTTP errors are answers too, network errors raise."""
    try:
        with _opener.open(req, timeout=timeout_s) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    # URLError, timeouts, refused connections, a malformed endpoint
    except (OSError, ValueError) as e:
        raise ImdsUnreachable(f"cannot reach the instance metadata service at {req.full_url} ({e})",
                              "Check the endpoint; on EC2, check that IMDS is enabled with a hop "
                              "limit of 2 for containers") from e


def _parse(body: bytes) -> Notice:
    """The notice in an instance-action body; one we cannot read counts as 'unknown' (the node is
    going)."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Notice("unknown", None)
    if not isinstance(value, dict) or not isinstance(value.get("action"), str):
        return Notice("unknown", None)
    when = value.get("time")
    return Notice(value["action"], when if isinstance(when, str) else None)


def _get(endpoint: str, path: str, timeout_s: float) -> tuple[int, bytes]:
    """A session token, then GET `path` with it: the status and body (ImdsUnreachable: no token)."""
    base = endpoint.rstrip("/")
    put = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
    status, token = _request(put, timeout_s)
    if status != 200:
        raise ImdsUnreachable(f"the metadata service refused a session token (HTTP {status})",
                              "Check that IMDSv2 is enabled on the instance (metadata options: "
                              "http-endpoint)")
    token_header = {"X-aws-ec2-metadata-token": token.decode(errors="replace")}
    return _request(urllib.request.Request(f"{base}{path}", headers=token_header), timeout_s)


def fetch_notice(endpoint: str, timeout_s: float = 2.0) -> Notice | None:
    """The spot interruption notice posted for this instance, or None; ImdsUnreachable if IMDS
    fails."""
    status, body = _get(endpoint, "/latest/meta-data/spot/instance-action", timeout_s)
    if status == 404:
        return None
    if status != 200:
        raise ImdsUnreachable(f"the metadata service answered HTTP {status} for "
                              "spot/instance-action",
                              "Check the IMDS endpoint and the instance's metadata options")
    return _parse(body)


def fetch_instance_id(endpoint: str, timeout_s: float = 2.0) -> str:
    """The id of the instance this process runs on; ImdsUnreachable if IMDS fails or gives none."""
    status, body = _get(endpoint, "/latest/meta-data/instance-id", timeout_s)
    text = body.decode(errors="replace").strip()
    if status != 200 or not text.startswith("i-"):
        raise ImdsUnreachable(f"the metadata service answered HTTP {status} without an instance id",
                              "Check the IMDS endpoint and the instance's metadata options")
    return text


class NoticeWatcher:
    """Polls IMDS in a daemon thread; `notice` is the first notice seen, and stays once set."""

    def __init__(self, endpoint: str, interval_s: float = 5.0, timeout_s: float = 2.0) -> None:
        self.endpoint = endpoint
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.errors = 0  # failed polls in all
        self.polls = 0  # polls done, answered or not
        self._failing = 0  # failed polls in a row
        self._notice: Notice | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spot-notice", daemon=True)

    @property
    def notice(self) -> Notice | None:
        """The first notice seen, or None."""
        return self._notice

    def start(self) -> NoticeWatcher:
        """Start polling (the first poll at once); returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling; waits at most one request's time for a poll under way."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.timeout_s + 1)

    def __enter__(self) -> NoticeWatcher:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopping.is_set() and self._notice is None:
            try:
                self._poll()
            # a watcher that dies silently is worse than one that logs and goes on
            except Exception as e:
                self.errors += 1
                log.exception("spot notice watcher: unexpected error, polling on: %s", e)
            self._stopping.wait(self.interval_s)

    def _poll(self) -> None:
        """One poll: record a notice, or count a failure and say so once when failures pile up."""
        try:
            notice = fetch_notice(self.endpoint, self.timeout_s)
        except ImdsUnreachable as e:
            self.errors += 1
            self._failing += 1
            if self._failing == QUIET_AFTER:
                log.warning("spot notice watcher: %d polls in a row failed, polling on quietly: %s",
                            QUIET_AFTER, e)
            return
        finally:
            self.polls += 1
        if self._failing >= QUIET_AFTER:
            log.warning("spot notice watcher: %s answers again", self.endpoint)
        self._failing = 0
        if notice is not None:
            log.warning("spot notice: %s at %s", notice.action, notice.time)
            self._notice = notice
