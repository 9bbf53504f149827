"""Node images: bake one from the ami/ recipe with this cpudist inside, and find the newest one.

    cpudist ami build  ->  builder (user data: bootstrap.sh) <-ssh- wheel of this cpudist
                       ->  builder powers off  ->  console says OK or the failing step
                       ->  AMI or error

The builder, its key pair and its security group carry the bake's run tag and are removed when the
bake ends, whichever way it ends.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cpudist
from cpudist import state
from cpudist.cloud.access import NodeAccess, address
from cpudist.cloud.provider import KeyRequest, Provider
from cpudist.errors import CpudistError
from cpudist.interrupts import shielded, signals_interrupt

Say = Callable[[str], None]
RESULT = re.compile(r"cpudist-bootstrap: (OK|FAILED at step (\S+).*)")
# measured on nothing yet: the bootstrap's downloads dominate (torch CPU is ~200 MB)
BAKE_MINUTES = 15


@dataclass(kw_only=True, frozen=True)
class BakeSpec:
    """What `cpudist ami build` was asked for."""

    name: str
    base_image: str
    instance_type: str = "c6i.large"
    subnet: str | None = None
    ssh_cidr: str = ""
    user: str = "ubuntu"
    connect: str = "public"
    timeout_s: float = 3600
    boot_timeout_s: float | None = None  # for the builder to run and answer SSH (None: timeout_s)


def recipe_dir() -> Path:
    """The ami/ recipe: beside the package in a source tree, inside it (cpudist/_ami) in a wheel."""
    package = Path(cpudist.__file__).resolve().parent
    for folder in (package.parent / "ami", package / "_ami"):
        if (folder / "bootstrap.sh").is_file():
            return folder
    raise CpudistError("the image recipe (ami/bootstrap.sh) is missing from this cpudist "
                       "installation",
                       "Reinstall cpudist from its wheel or source tree")


def bootstrap_result(console: str) -> tuple[bool, str | None]:
    """(succeeded, failing step) from the builder's console; (False, None) when it said nothing."""
    for line in reversed(console.splitlines()):
        m = RESULT.search(line)
        if m:
            return m.group(1) == "OK", m.group(2)
    return False, None


def _upload(node: str, spec: BakeSpec, key: Path, wheel: Path, known: Path,
            ssh: NodeAccess) -> None:
    with ssh.login(node, spec.user, 22, key, known) as builder:
        builder.check(f"mkdir -p ~/{state.UPLOAD_DIR}")
        home = builder.check('printf %s "$HOME"').strip()
        builder.put(wheel, f"{home}/{state.UPLOAD_DIR}/{wheel.name}")
        builder.check(f"touch ~/{state.UPLOAD_DIR}/ready")


def _cleanup(cloud: Provider, owner: str, run_id: str, name: str, keep_image: bool) -> None:
    cloud.remove(owner, run_id, images=not keep_image)
    state.remove_dir(state.image_dir(name))


def bake(cloud: Provider, spec: BakeSpec, wheel: Path, ssh: NodeAccess, say: Say) -> str:
    """Build the image with `wheel` (this cpudist) inside; its id. Nothing but the image is left,
    and nothing at all on failure. SSH to the builder goes through `ssh`, from the caller."""
    run_id, owner, folder = uuid.uuid4().hex[:12], f"image-{spec.name}", state.image_dir(spec.name)
    script = (recipe_dir() / "bootstrap.sh").read_text()
    image: str | None = None
    try:
        with signals_interrupt() as signals:
            subnet = cloud.subnet(spec.subnet)
            key = cloud.key_pair(KeyRequest(owner=owner, folder=folder, run_id=run_id,
                                            new_key=ssh.new_key))
            group = cloud.security_group(owner, subnet.vpc_id, spec.ssh_cidr, run_id)
            builder = cloud.builder(owner, spec.base_image, spec.instance_type, subnet, script,
                                    key.name, group, run_id)
            say(f"builder {builder.instance_id} is booting from {spec.base_image}; uploading "
                f"{wheel.name} when it answers SSH")
            boot_s = spec.boot_timeout_s or spec.timeout_s
            builder = cloud.wait([builder.instance_id], "running", boot_s)[0]
            reach = address(builder.private_ip, builder.public_ip, spec.connect,
                            f"builder {builder.instance_id}",
                            "Use a subnet that assigns public addresses, or --connect private")
            ssh.wait_banner(reach, 22, boot_s)
            _upload(reach, spec, key.private_key, wheel, folder / "known_hosts", ssh)
            say("wheel uploaded; the builder powers off when its bootstrap ends")
            cloud.wait([builder.instance_id], "stopped", spec.timeout_s)
            ok, step = bootstrap_result(cloud.console(builder.instance_id))
            if not ok:
                raise CpudistError("the image bootstrap failed at step "
                                   f"{step or 'unknown (no result on the console)'}",
                                   f"See ami/README.md for what step {step} does; fix it and "
                                   "re-run `cpudist ami build`")
            made = cloud.image(builder.instance_id, owner, spec.name, run_id,
                               version=cpudist.__version__, image="base")
            signals.check()  # a Ctrl-C swallowed on the way removes the image too
            image = made
    finally:
        with shielded(lambda: say("finishing the cleanup first; it stops by itself")):
            _cleanup(cloud, owner, run_id, spec.name, keep_image=image is not None)
    return image
