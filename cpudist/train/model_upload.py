"""`--model-s3 s3://bucket/prefix`: rank 0 copies the saved model to the object store after writing
it.

Layout: `<prefix>/<run id>/model/<file>` for every file of the model folder, then `SHA256SUMS`
(sha256sum's format, one line per file) last: a folder whose SHA256SUMS is there is whole, and every
file can be checked against it (`aws s3 cp --recursive` then `sha256sum -c SHA256SUMS`). The card
(README.md) is the run folder's, final when rank 0 writes it. A failed copy is one warning line and
a `model_s3.error` in result.json: the model stays in the run folder, and the run does not fail
after training.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from cpudist.objects import ObjectStore, StoreError
from cpudist.train.checkpoint_meta import file_sum

SUMS = "SHA256SUMS"


def model_prefix(run_id: str) -> str:
    """Where a run's model goes under the store's prefix."""
    return f"{run_id}/model"


def upload(store: ObjectStore, model_dir: Path, run_id: str) -> dict[str, Any]:
    """Copy every file of `model_dir`, then its SHA256SUMS; what result.json records as
    `model_s3`."""
    began = time.perf_counter()
    where = model_prefix(run_id)
    url = f"{store.url}/{where}"
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and not p.is_symlink())
    sums: list[str] = []
    try:
        for path in files:
            rel = path.relative_to(model_dir).as_posix()
            sums.append(f"{file_sum(path).sha256}  {rel}")
            store.put(path, f"{where}/{rel}")
        with tempfile.TemporaryDirectory() as tmp:
            listing = Path(tmp) / SUMS
            listing.write_text("\n".join(sums) + "\n")
            store.put(listing, f"{where}/{SUMS}")  # last: its presence says the folder is whole
    except StoreError as e:
        return {"url": url, "error": e.message}
    return {"url": url, "files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "seconds": round(time.perf_counter() - began, 2)}
