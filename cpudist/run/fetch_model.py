"""A run from outside the cluster brings the model rank 0 saved on the head home: file by file over SFTP, each
checked against the sha256 the head computes of its own copy, into model.tmp/ renamed to model/ once whole.

    cpudist run mrpc --np 4 --ppn 1 --cluster cpudist --data-dir glue/MRPC            # runs/.../model/ here too
    cpudist run mrpc --np 4 --ppn 1 --cluster cpudist --data-dir glue/MRPC --fetch-model no   # left on the head
"""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpudist.errors import JobFailed
from cpudist.ssh.client import Remote
from cpudist.train.checkpoint_meta import file_sum


def head_sums(head: Remote, remote_dir: str) -> dict[str, str]:
    """{file name: sha256} of the model folder on the head (flat, as save_pretrained writes it); {} when absent."""
    code, out, _ = head.run(f"cd {shlex.quote(remote_dir)} && find . -maxdepth 1 -type f -printf '%P\\0' | "
                            "sort -z | xargs -0 -r sha256sum --", timeout=600)
    if code != 0:
        return {}
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
