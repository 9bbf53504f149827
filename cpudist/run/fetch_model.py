"""A run from outside the cluster brings the model rank 0 saved on the head home: file by file over
SFTP, each checked against the sha256 the head computes of its own copy, into model.tmp/ renamed to
model/ once whole.

    # runs/.../model/ here too
    cpudist run mrpc --np 4 --ppn 1 --cluster cpudist --data-dir glue/MRPC
    # left on the head
    cpudist run mrpc --np 4 --ppn 1 --cluster cpudist --data-dir glue/MRPC --fetch-model no

`from_host` does the same over the launcher's ssh for torchrun across a hostfile, whose rendezvous
may put rank 0 on another host than the head: when the run folder is not shared, its model/ (and
--report-to's folders) come from there (run/outcome.fetch_from_rank0).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpudist.errors import JobFailed
from cpudist.ssh.client import Remote
from cpudist.train.checkpoint_meta import file_sum
from cpudist.train.report_to import RUN_FOLDERS
from cpudist.wire import names

# what rank 0 writes in the run folder besides result.json and steps.jsonl
FROM_RANK0 = (names.MODEL, *RUN_FOLDERS)
_SUMS = "find . -maxdepth 1 -type f -printf '%P\\0' | sort -z | xargs -0 -r sha256sum --"


def head_sums(head: Remote, remote_dir: str) -> dict[str, str]:
    """{file name: sha256} of the model folder on the head (flat, as save_pretrained writes it); {}
    when absent."""
    code, out, _ = head.run(f"cd {shlex.quote(remote_dir)} && {_SUMS}", timeout=600)
    return _parse_sums(out, remote_dir) if code == 0 else {}


def _parse_sums(out: str, where: str) -> dict[str, str]:
    """{name: sha256} from sha256sum's lines; a name it had to escape (a backslash or a line break)
    is refused."""
    sums = {}
    for line in out.splitlines():
        digest, _, name = line.partition("  ")
        # sha256sum's mark of an escaped name: \\ for \, \n for a line break
        if digest.startswith("\\"):
            plain = re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m[1], m[1]), name)
            raise JobFailed(f"model file {plain!r} in {where}: cpudist fetches no file whose name "
                            "holds a backslash or a line break",
                            f"Rename or remove it in {where}, then copy the model with scp -r")
        if name:
            sums[name] = digest
    return sums


def fetch_model(head: Remote, remote_dir: str, local_dir: Path,
                say: Callable[[str], None]) -> dict[str, Any]:
    """Copy the head's model folder to local_dir; what came (for result.json's staging); {} when
    there is none."""
    sums = head_sums(head, remote_dir)
    if not sums:
        return {}
    started = time.monotonic()
    tmp = local_dir.with_name(local_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    total = 0
    try:
        for name, digest in sums.items():
            total += _fetch_one(head, remote_dir, tmp, name, digest)
            say(f"fetched model/{name} ({(tmp / name).stat().st_size / 1e6:.1f} MB, "
                "sha256 checked)")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # refused or cut off: no bytes of it stay here
        raise
    if local_dir.exists():
        shutil.rmtree(local_dir)
    tmp.replace(local_dir)
    return {"from": remote_dir, "files": len(sums), "bytes": total,
            "seconds": round(time.monotonic() - started, 2), "sha256": sums}


def _fetch_one(head: Remote, remote_dir: str, tmp: Path, name: str, digest: str) -> int:
    """Copy one file of the head's model folder into tmp, checked against the head's sha256; its
    size."""
    if not head.fetch(f"{remote_dir}/{name}", tmp / name):
        raise JobFailed(f"model/{name} went from the head's {remote_dir} before it was fetched",
                        "Copy the model from the head with scp -r once it is "
                        f"whole in {remote_dir}")
    got = file_sum(tmp / name).sha256
    if got != digest:
        raise JobFailed(f"model/{name} arrived from the head damaged (sha256 {got[:12]}, the "
                        f"head's {digest[:12]})",
                        f"The model is whole on the head in {remote_dir}; copy it again (scp -r), "
                        "or re-run")
    return (tmp / name).stat().st_size


def from_host(ssh: str, host: str, out: Path, timeout_s: float = 3600) -> list[str]:
    """Copy rank 0's model/ (each file checked against the sha256 `host` computes) and --report-to's
    folders from `host`'s copy of the run folder `out` (the same path there) into `out`; the names
    of what came."""
    remote = shlex.quote(str(out.resolve()))
    script = (f"cd {remote} && for d in {' '.join(FROM_RANK0)}; do if [ -d \"$d\" ]; then echo "
              "\"$d\"; fi; done; "
              f"echo; if [ -d {names.MODEL} ]; then cd {names.MODEL} && {_SUMS}; fi")
    listed = subprocess.run([ssh, host, script], capture_output=True, text=True, timeout=600,
                            stdin=subprocess.DEVNULL)
    present, _, sum_lines = listed.stdout.partition("\n\n")
    came = present.split() if listed.returncode == 0 else []
    if not came:
        return []
    tmp = out / ".from-rank0.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with subprocess.Popen([ssh, host, f"tar -C {remote} -cf - {' '.join(came)}"],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as sender:
            unpacked = subprocess.run(["tar", "-C", str(tmp), "-xf", "-"], stdin=sender.stdout,
                                      capture_output=True, timeout=timeout_s)
        if sender.returncode != 0 or unpacked.returncode != 0:
            said = unpacked.stderr.decode(errors="replace").strip()
            why = said[-300:] or f"exit code {sender.returncode}"
            raise JobFailed(f"copying {', '.join(came)} from rank 0's host {host} failed ({why})",
                            f"They are whole on {host} in {out.resolve()}; copy them with scp -r")
        for name, digest in _parse_sums(sum_lines, f"{host}:{out.resolve() / names.MODEL}").items():
            got = file_sum(tmp / names.MODEL / name).sha256
            if got != digest:
                raise JobFailed(f"model/{name} arrived from {host} damaged (sha256 {got[:12]}, "
                                f"{host}'s {digest[:12]})",
                                f"The model is whole on {host} in {out.resolve() / names.MODEL}; "
                                "copy it with scp -r")
        for name in came:
            shutil.rmtree(out / name, ignore_errors=True)  # an earlier part's or run's
            (tmp / name).replace(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return came
