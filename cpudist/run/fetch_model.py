"""A run from outside the cluster brings the model rank 0 saved on the head home: file by file over SFTP, each
checked against the sha256 the head computes of its own copy, into model.tmp/ renamed to model/ once whole.

    cpudist run mrpc --np 4 --ppn 1 --cluster cpudist --data-dir glue/MRPC            # runs/.../model/ here too
    cpudist run mrpc --np 4 --ppn 1 --cluster cpudist --data-dir glue/MRPC --fetch-model no   # left on the head

`from_host` does the same over the launcher's ssh for torchrun across a hostfile, whose rendezvous may put rank 0
on another host than the head: when the run folder is not shared, its model/ (and --report-to's folders) come
from there (run/outcome.fetch_from_rank0).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpudist.errors import JobFailed
from cpudist.results.card import MODEL_DIR
from cpudist.ssh.client import Remote
from cpudist.train.checkpoint_meta import file_sum
from cpudist.train.report_to import RUN_FOLDERS

FROM_RANK0 = (MODEL_DIR, *RUN_FOLDERS)  # what rank 0 writes in the run folder besides result.json and steps.jsonl
_SUMS = "find . -maxdepth 1 -type f -printf '%P\\0' | sort -z | xargs -0 -r sha256sum --"


def head_sums(head: Remote, remote_dir: str) -> dict[str, str]:
    """{file name: sha256} of the model folder on the head (flat, as save_pretrained writes it); {} when absent."""
    code, out, _ = head.run(f"cd {shlex.quote(remote_dir)} && {_SUMS}", timeout=600)
    return _parse_sums(out) if code == 0 else {}


def _parse_sums(out: str) -> dict[str, str]:
    sums = {}
    for line in out.splitlines():
        digest, _, name = line.partition("  ")
        if name:
            sums[name] = digest
    return sums


def fetch_model(head: Remote, remote_dir: str, local_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Copy the head's model folder to local_dir; what came (for result.json's staging); {} when there is none."""
    sums = head_sums(head, remote_dir)
    if not sums:
        return {}
    started = time.monotonic()
    tmp = local_dir.with_name(local_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    total = 0
    for name, digest in sums.items():
        head.fetch(f"{remote_dir}/{name}", tmp / name)
        got = file_sum(tmp / name).sha256
        if got != digest:
            raise JobFailed(f"model/{name} arrived from the head damaged (sha256 {got[:12]}, the head's {digest[:12]})",
                            f"The model is whole on the head in {remote_dir}; copy it again (scp -r), or re-run")
        size = (tmp / name).stat().st_size
        total += size
        say(f"fetched model/{name} ({size / 1e6:.1f} MB, sha256 checked)")
    if local_dir.exists():
        shutil.rmtree(local_dir)
    tmp.replace(local_dir)
    return {"from": remote_dir, "files": len(sums), "bytes": total, "seconds": round(time.monotonic() - started, 2),
            "sha256": sums}


def from_host(ssh: str, host: str, out: Path, timeout_s: float = 3600) -> list[str]:
    """Copy rank 0's model/ (each file checked against the sha256 `host` computes) and --report-to's folders from
    `host`'s copy of the run folder `out` (the same path there) into `out`; the names of what came."""
    remote = shlex.quote(str(out.resolve()))
    script = (f"cd {remote} && for d in {' '.join(FROM_RANK0)}; do if [ -d \"$d\" ]; then echo \"$d\"; fi; done; "
              f"echo; if [ -d {MODEL_DIR} ]; then cd {MODEL_DIR} && {_SUMS}; fi")
    listed = subprocess.run([ssh, host, script], capture_output=True, text=True, timeout=600,
                            stdin=subprocess.DEVNULL)
    present, _, sum_lines = listed.stdout.partition("\n\n")
    names = present.split() if listed.returncode == 0 else []
    if not names:
        return []
    tmp = out / ".from-rank0.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with subprocess.Popen([ssh, host, f"tar -C {remote} -cf - {' '.join(names)}"], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL) as sender:
            unpacked = subprocess.run(["tar", "-C", str(tmp), "-xf", "-"], stdin=sender.stdout, capture_output=True,
                                      timeout=timeout_s)
        if sender.returncode != 0 or unpacked.returncode != 0:
            why = unpacked.stderr.decode(errors="replace").strip()[-300:] or f"exit code {sender.returncode}"
            raise JobFailed(f"copying {', '.join(names)} from rank 0's host {host} failed ({why})",
                            f"They are whole on {host} in {out.resolve()}; copy them with scp -r")
        for name, digest in _parse_sums(sum_lines).items():
            got = file_sum(tmp / MODEL_DIR / name).sha256
            if got != digest:
                raise JobFailed(f"model/{name} arrived from {host} damaged (sha256 {got[:12]}, {host}'s {digest[:12]})",
                                f"The model is whole on {host} in {out.resolve() / MODEL_DIR}; copy it with scp -r")
        for name in names:
            shutil.rmtree(out / name, ignore_errors=True)  # an earlier part's or run's
            (tmp / name).replace(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return names
