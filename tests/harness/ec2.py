"""EC2 as moto's server emulates it, over HTTP, with a thin WSGI layer for what moto lacks.

    python -m tests.harness.ec2 --port 5055        # then: AWS_ENDPOINT_URL=http://127.0.0.1:5055

The layer in front of moto adds: placement groups (moto answers HTTP 500), DependencyViolation
when a security group still has live instances (moto deletes it), InvalidAMIName.Duplicate for a
name an image of the account holds (moto makes a second), fault injection (the next N
calls of an action fail with a given AWS error code), and, optionally, what cloud-init would do
on a real instance: install the key pair's public key on the host that owns the instance's
private address, and stop instances whose user data ends by shutting down (a finished AMI bake).

What real EC2 does and moto does not, always: RunInstances with a ClientToken it has seen answers
with the instances that token launched (idempotency: a retry after a lost answer launches nothing
more). What real EC2 does and moto does not, on request: instances stay `pending` for `pending_s`
after RunInstances and StartInstances (moto makes them `running` at once), and new instances are
unknown to calls naming them by id for `unseen_s`, and to the first such call however late (EC2's
eventual consistency: InvalidInstanceID.NotFound on CreateTags right after RunInstances). Public
addresses are handed out from TEST-NET-2 (198.51.100.0/24, RFC 5737), never from moto's
54.214.0.0/16, which is real internet space: a test that connects to an instance's public address
sends nothing to anyone.
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import json
import re
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from moto import settings
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models import elastic_network_interfaces as moto_enis
from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server

# moto validates AMIs, instance types and key pairs only when asked: ask, as AWS always does.
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}
NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
THROTTLING = {"RequestLimitExceeded", "Throttling"}
# Calls after which who may reach whom can differ: `on_change` runs after each.
MUTATING = {"RunInstances", "TerminateInstances", "StopInstances", "StartInstances",
            "RebootInstances",
            "AuthorizeSecurityGroupIngress", "RevokeSecurityGroupIngress", "CreateSecurityGroup",
            "DeleteSecurityGroup", "ModifyInstanceAttribute", "ModifyNetworkInterfaceAttribute"}
# Calls that name instances by id, and the parameters that hold the ids (InstanceId.1, ResourceId.1,
# ...).
BY_INSTANCE_ID = {"CreateTags", "DescribeInstances", "TerminateInstances", "StopInstances",
                  "StartInstances",
                  "RebootInstances", "CreateImage", "GetConsoleOutput", "ModifyInstanceAttribute"}
TEST_NET_2 = "198.51.100"
_public_hosts = itertools.cycle(range(1, 255))


def _test_net_public_ip() -> str:
    """moto's `random_public_ip`, in documentation space instead of 54.214.0.0/16 (someone's real
    addresses)."""
    return f"{TEST_NET_2}.{next(_public_hosts)}"


# moto calls this module-level name when a network interface gets its automatic public address.
moto_enis.random_public_ip = _test_net_public_ip


@dataclass
class Fault:
    action: str
    code: str
    count: int = 1
    skip: int = 0  # let this many matching calls through first
    lost: bool = False  # the call is carried out, but its answer is lost (the client sees an error)


    def reply(self, action: str) -> tuple[str, bytes]:
        status = "503 Service Unavailable" if self.code in THROTTLING else "400 Bad Request"
        if self.lost:
            status = "500 Internal Server Error"
        return status, _error(self.code, f"injected {self.code} for {action}")


@dataclass
class PlacementGroup:
    name: str
    strategy: str
    group_id: str
    tags: list[tuple[str, str]] = field(default_factory=list)


def _xml(action: str, body: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><{action}Response xmlns="{NS}">'
            f"<requestId>{uuid.uuid4()}</requestId>{body}</{action}Response>").encode()


def _error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID>"
            "</Response>").encode()


def _tag_specs(params: dict[str, str], resource: str) -> list[tuple[str, str]]:
    tags = []
    for key, value in params.items():
        m = re.match(r"TagSpecification\.(\d+)\.ResourceType", key)
        if m and value == resource:
            n = m.group(1)
            j = 1
            while f"TagSpecification.{n}.Tag.{j}.Key" in params:
                tags.append((params[f"TagSpecification.{n}.Tag.{j}.Key"],
                             params.get(f"TagSpecification.{n}.Tag.{j}.Value", "")))
                j += 1
    return tags


class _Quiet(WSGIRequestHandler):
    # one line per call drowns test output
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class Emulator:
    """moto's EC2 server plus the layer described above, on a loopback port, in a thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 on_key_installed: Callable[[str, str], None] | None = None,
                 on_change: Callable[[str], None] | None = None) -> None:
        # moto reads these once at import: set them on its settings module, for this process.
        settings.ENABLE_AMI_VALIDATION = settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = True
        settings.ENABLE_KEYPAIR_VALIDATION = True
        self.moto = DomainDispatcherApplication(create_backend_app)
        self.faults: list[Fault] = []
        self.groups: dict[str, PlacementGroup] = {}
        self.calls: list[str] = []
        self.delays: dict[str, float] = {}
        self.public_keys: dict[str, str] = {}
        # (private address, public key): the host's cloud-init
        self.on_key_installed = on_key_installed
        self.on_change = on_change  # (region): after each MUTATING call, once moto has answered
        # (instance id, private address, user data, region): a machine that runs its user data (the
        # World's)
        self.on_boot: Callable[[str, str, str, str], None] | None = None
        self.console: dict[str, str] = {}  # instance id -> its console output (GetConsoleOutput)
        self.ssm_parameters: dict[str, str] = {}  # public SSM parameters (the current Ubuntu AMI)
        self.bootstrap_fails_at: str | None = None  # the step an emulated image bootstrap fails at
        # How EC2 behaves (kept by `reset`, like the hooks above): how long an instance stays
        # `pending` after RunInstances/StartInstances, and how long a new instance is unknown to
        # calls that name it by id.
        self.pending_s = 0.0
        self.unseen_s = 0.0
        self._unseen: dict[str, float] = {}  # instance id -> monotonic time it becomes visible
        # ids no call has named yet: the first call naming one is refused however late it comes (a
        # test of the retry must not depend on the caller's speed; a loaded machine took over
        # unseen_s to send CreateTags)
        self._never_named: set[str] = set()
        # RunInstances' ClientToken -> its answer (EC2's idempotency)
        self.launched: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.server = make_server(host, port, self, threaded=True, request_handler=_Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Emulator:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join()

    def inject(self, action: str, code: str, count: int = 1, skip: int = 0,
               lost: bool = False) -> None:
        """The next `count` calls of `action` (after `skip` more) fail with AWS error `code`; with
        `lost`, each is carried out first and only its answer is replaced by the error (a reply lost
        on the way)."""
        with self.lock:
            self.faults.append(Fault(action, code, count, skip, lost))

    def slow_down(self, action: str, seconds: float) -> None:
        """Every later call of `action` takes `seconds` longer (a window to interrupt a run in)."""
        self.delays[action] = seconds

    def reset(self) -> None:
        """Forget everything: moto's state, placement groups, faults, delays, recorded calls."""
        # moto rebuilds its backends (seconds of CPU): 10 s timed out on a 2-core machine at load
        # 40.
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"),
                               timeout=120)
        with self.lock:
            self.faults.clear()
            self.groups.clear()
            self.delays.clear()
            self.calls.clear()
            self._unseen.clear()
            self._never_named.clear()
            self.launched.clear()

    def backend(self, region: str = "us-east-1") -> Any:
        return ec2_backends[DEFAULT_ACCOUNT_ID][region]

    # --- WSGI --------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        if environ.get("HTTP_X_AMZ_TARGET") == "AmazonSSM.GetParameter":
            return self._ssm_parameter(json.loads(body or b"{}").get("Name", ""), start_response)
        params = dict(urllib.parse.parse_qsl(body.decode()))
        action = params.get("Action", "")
        region = self._region(environ)
        if action:
            self.calls.append(action)
        time.sleep(self.delays.get(action, 0.0))
        fault = self._fault(action) or self._not_yet_visible(action, params)
        if fault is not None and fault.lost and self._handle(action, params, region) is None:
            self._forward(environ, body, action, params, region)
        reply = (fault.reply(action) if fault else None) or self._handle(action, params, region)
        if reply is not None:
            status, payload = reply
            start_response(status,
                           [("Content-Type", "text/xml"), ("Content-Length", str(len(payload)))])
            return [payload]
        return self._forward(environ, body, action, params, region, start_response)

    def _forward(self, environ: dict[str, Any], body: bytes, action: str, params: dict[str, str],
                 region: str, start_response: Callable[..., Any] | None = None) -> list[bytes]:
        """Let moto carry out the call (and what it sets off here); its answer, or none for a lost
        one."""
        snapshot_tags: list[tuple[str, str]] = []
        if action == "CreateImage":
            # moto cannot tag the snapshot of a new image (NotImplementedError): do it after the
            # call.
            snapshot_tags = _tag_specs(params, "snapshot")
            body = self._without_spec(params, "snapshot")
            environ["CONTENT_LENGTH"] = str(len(body))
        environ["wsgi.input"] = io.BytesIO(body)
        result: list[bytes] = list(self.moto(environ, start_response or (lambda *a, **k: None)))
        if action in ("RunInstances", "StartInstances") and self.pending_s > 0:
            self._pend(re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", b"".join(result)),
                       region)
        if action in MUTATING and self.on_change:
            # before cloud-init below: a new machine boots, then gets its key
            self.on_change(region)
        if action == "RunInstances":
            if params.get("ClientToken") and b"<instancesSet>" in b"".join(result):
                self.launched[params["ClientToken"]] = b"".join(result)
            self._after_run(params, b"".join(result), region)
        m = re.search(rb"<imageId>(ami-[0-9a-f]+)</imageId>", b"".join(result))
        if snapshot_tags and m:
            snapshot = self.backend(region).amis[m.group(1).decode()].ebs_snapshot
            self.backend(region).create_tags([snapshot.id], dict(snapshot_tags))
        return result

    @staticmethod
    def _without_spec(params: dict[str, str], resource: str) -> bytes:
        """The request body without the TagSpecification entries of `resource`."""
        drop = {m.group(1) for k, v in params.items()
                if (m := re.match(r"TagSpecification\.(\d+)\.ResourceType", k)) and v == resource}
        kept = {k: v for k, v in params.items()
                if not any(k.startswith(f"TagSpecification.{n}.") for n in drop)}
        return urllib.parse.urlencode(kept).encode()

    @staticmethod
    def _region(environ: dict[str, Any]) -> str:
        m = re.search(r"Credential=[^/]+/\d+/([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
        return m.group(1) if m else "us-east-1"

    def _fault(self, action: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.action != action or f.count <= 0:
                    continue
                if f.skip > 0:
                    f.skip -= 1
                    return None
                f.count -= 1
                return f
        return None

    def _not_yet_visible(self, action: str, params: dict[str, str]) -> Fault | None:
        """InvalidInstanceID.NotFound for a call naming an instance launched less than `unseen_s`
        ago."""
        if action not in BY_INSTANCE_ID or not self._unseen:
            return None
        named = [v for k, v in params.items()
                 if re.fullmatch(r"(InstanceId|ResourceId)(\.\d+)?", k)]
        now = time.monotonic()
        with self.lock:
            unseen = [i for i in named if self._unseen.get(i, 0.0) > now or i in self._never_named]
            self._never_named.difference_update(named)
        return Fault(action, "InvalidInstanceID.NotFound") if unseen else None

    def _pend(self, ids: list[bytes], region: str) -> None:
        """Show `ids` as pending now, and running `pending_s` from now (unless something else moved
        them)."""
        backend = self.backend(region)
        for raw in ids:
            inst = backend.get_instance(raw.decode())
            inst._state.name, inst._state.code = "pending", 0
        threading.Timer(self.pending_s, self._run_pending,
                        args=([i.decode() for i in ids], region)).start()

    def _run_pending(self, ids: list[str], region: str) -> None:
        wanted = set(ids)  # looked up afresh: a reset may have emptied the backend since
        with self.lock:
            for reservation in self.backend(region).all_reservations():
                for inst in reservation.instances:
                    if inst.id in wanted and inst.state == "pending":
                        inst._state.name, inst._state.code = "running", 16
        if self.on_change:
            self.on_change(region)

    def _ssm_parameter(self, name: str, start_response: Callable[..., Any]) -> list[bytes]:
        """SSM's GetParameter for the public parameters the test set (moto[ec2] brings no SSM)."""
        if name in self.ssm_parameters:
            status = "200 OK"
            payload = json.dumps({"Parameter": {"Name": name, "Type": "String",
                                                "Value": self.ssm_parameters[name],
                                                "Version": 1}}).encode()
        else:
            status = "400 Bad Request"
            payload = json.dumps({"__type": "ParameterNotFound",
                                  "message": f"{name} not found"}).encode()
        start_response(status,
                       [("Content-Type", "application/x-amz-json-1.1"),
                        ("Content-Length", str(len(payload))),
                        ("x-amzn-RequestId", str(uuid.uuid4()))])
        return [payload]

    def _handle(self, action: str, p: dict[str, str], region: str) -> tuple[str, bytes] | None:
        ok = "200 OK"
        if action == "GetConsoleOutput" and p.get("InstanceId") in self.console:
            text = base64.b64encode(self.console[p["InstanceId"]].encode()).decode()
            return ok, _xml(action,
                            f"<instanceId>{p['InstanceId']}</instanceId>"
                            f"<timestamp>2026-01-01T00:00:00Z</timestamp><output>{text}</output>")
        if action == "RunInstances" and p.get("ClientToken") in self.launched:
            return ok, self.launched[p["ClientToken"]]
        if action == "CreatePlacementGroup":
            name = p["GroupName"]
            if name in self.groups:
                return "400 Bad Request", _error("InvalidPlacementGroup.Duplicate",
                                                 f"{name} exists")
            group = PlacementGroup(name, p.get("Strategy", "cluster"),
                                   f"pg-{uuid.uuid4().hex[:17]}", _tag_specs(p, "placement-group"))
            self.groups[name] = group
            return ok, _xml(action,
                            f"<placementGroup>{self._group_xml(group)}</placementGroup>"
                            "<return>true</return>")
        if action == "DescribePlacementGroups":
            wanted = {v for k, v in p.items() if k.startswith("GroupName.")}
            groups = [g for g in self.groups.values() if not wanted or g.name in wanted]
            missing = wanted - {g.name for g in groups}
            if missing:
                return "400 Bad Request", _error("InvalidPlacementGroup.Unknown",
                                                 f"{missing.pop()} is unknown")
            items = "".join(f"<item>{self._group_xml(g)}</item>" for g in groups)
            return ok, _xml(action, f"<placementGroupSet>{items}</placementGroupSet>")
        if action == "DeletePlacementGroup":
            if self.groups.pop(p["GroupName"], None) is None:
                return "400 Bad Request", _error("InvalidPlacementGroup.Unknown",
                                                 f"{p['GroupName']} is unknown")
            return ok, _xml(action, "<return>true</return>")
        if action == "DeleteSecurityGroup" and self._group_in_use(p.get("GroupId", ""), region):
            return "400 Bad Request", _error("DependencyViolation",
                                             f"resource {p.get('GroupId')} has a dependent object")
        if action == "CreateImage" and (taken := self._image_named(p.get("Name", ""), region)):
            return "400 Bad Request", _error("InvalidAMIName.Duplicate",
                                             f"AMI name {p.get('Name')} is already in use by AMI "
                                             f"{taken}")
        if action == "ImportKeyPair":
            self.public_keys[p["KeyName"]] = base64.b64decode(
                p["PublicKeyMaterial"]).decode().strip()
        return None

    @staticmethod
    def _group_xml(g: PlacementGroup) -> str:
        tags = "".join(f"<item><key>{k}</key><value>{v}</value></item>" for k, v in g.tags)
        return (
            f"<groupName>{g.name}</groupName><strategy>{g.strategy}</strategy>"
            f"<state>available</state><groupId>{g.group_id}</groupId><tagSet>{tags}</tagSet>")

    def _image_named(self, name: str, region: str) -> str | None:
        """The account's image of that name (AMI names are unique per region in AWS; moto allows
        two)."""
        return next((i.id for i in self.backend(region).amis.values() if name and i.name == name
                     and i.owner_id == DEFAULT_ACCOUNT_ID), None)

    def _group_in_use(self, group_id: str, region: str) -> bool:
        for reservation in self.backend(region).all_reservations():
            for inst in reservation.instances:
                live = inst.state not in ("terminated",)
                if live and any(g.id == group_id for g in inst.security_groups):
                    return True
        return False

    def _after_run(self, params: dict[str, str], response: bytes, region: str) -> None:
        ids = re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", response)
        key = params.get("KeyName")
        user_data = base64.b64decode(params.get("UserData", "")).decode(errors="replace")
        if self.unseen_s > 0:
            with self.lock:
                self._unseen.update((raw.decode(), time.monotonic() + self.unseen_s) for raw in ids)
                self._never_named.update(raw.decode() for raw in ids)
        for raw in ids:
            inst = self.backend(region).get_instance(raw.decode())
            if key and key in self.public_keys and self.on_key_installed:
                self.on_key_installed(inst.private_ip, self.public_keys[key])
            if self.on_boot:
                self.on_boot(inst.id, inst.private_ip, user_data, region)
            elif user_data.rstrip().endswith(("shutdown -h now", "poweroff")):
                # The bootstrap of an AMI bake ends by powering off: emulate that after a moment.
                threading.Timer(0.5, self._stop, args=(inst.id, region)).start()

    def _stop(self, instance_id: str, region: str) -> None:
        self.backend(region).stop_instances([instance_id])
        if self.on_change:
            self.on_change(region)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=5055)
    a = ap.parse_args()
    emu = Emulator(port=a.port).start()
    print(f"EC2 emulator on {emu.url}; export AWS_ENDPOINT_URL={emu.url} "
          + " ".join(f"{k}={v}" for k, v in FAKE_CREDENTIALS.items()), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        emu.stop()


if __name__ == "__main__":
    main()
