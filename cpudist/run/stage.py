"""Content-addressed staging: what the ranks need, sent once to the head and fanned out from it.

Every item (a data folder, a data file, a local model folder, a wheel of cpudist) lands in
`~/.cpudist/stage/<sha256>/` on every node. The digest covers names and bytes, so a second run with
the same inputs finds `.complete` markers everywhere and sends nothing.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import cpudist
from cpudist import state

COMPLETE = ".complete"
CHUNK = 1 << 20
# What AutoTokenizer reads from a model folder: a tokenizer alone need not drag the weights along.
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "vocab.json", "merges.txt", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model")


@dataclass(frozen=True)
class StageItem:
    """One local file or folder to put on every node."""

    what: str  # e.g. "data", "model", "cpudist"
    local: Path
    digest: str
    only: tuple[str, ...] = ()  # a folder's top-level files to take; empty: everything

    @property
    def is_dir(self) -> bool:
        return self.local.is_dir()

    def remote_dir(self, home: str) -> str:
        """The folder that holds the item on a node."""
        return f"{home}/{state.STAGE_DIR}/{self.digest[:32]}"

    def remote_path(self, home: str) -> str:
        """The path that replaces `local` in the job: the folder itself, or the file inside the folder."""
        return self.remote_dir(home) if self.is_dir else f"{self.remote_dir(home)}/{self.local.name}"


def _files(root: Path, only: tuple[str, ...] = ()) -> list[Path]:
    if root.is_file():
        return [root]
    if only:
        return [root / name for name in only if (root / name).is_file()]
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def digest_of(path: Path, only: tuple[str, ...] = ()) -> str:
    """sha256 over relative names and contents (a folder) or name and content (a file)."""
    h = hashlib.sha256()
    base = path if path.is_dir() else path.parent
    for f in _files(path, only):
        h.update(str(f.relative_to(base)).encode() + b"\0")
        h.update(str(f.stat().st_size).encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()


def item(what: str, path: Path, only: tuple[str, ...] = ()) -> StageItem:
    return StageItem(what, path.resolve(), digest_of(path.resolve(), only), only)


def tar_bytes(it: StageItem) -> bytes:
    """The item as a gzipped tar whose members are relative to the item's remote folder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        base = it.local if it.is_dir else it.local.parent
        for f in _files(it.local, it.only):
            tar.add(str(f), arcname=str(f.relative_to(base)), recursive=False)
    return buf.getvalue()


def code_fingerprint(root: Path | None = None) -> str:
    """sha256 of the cpudist package's files: nodes whose fingerprint differs get this code."""
    return digest_of(root or Path(cpudist.__file__).resolve().parent)


def receive_script(remote_dir: str, gzip: bool = True) -> str:
    """Shell that unpacks a tar from stdin into `remote_dir` atomically (a `.part` folder, then a rename)."""
    d = shlex.quote(remote_dir)
    part = shlex.quote(remote_dir + ".part")
    return (f"set -e; rm -rf {part}; mkdir -p {part}; tar -x{'z' if gzip else ''}f - -C {part}; "
            f"touch {part}/{COMPLETE}; rm -rf {d}; mv {part} {d}")


def fan_out_script(remote_dirs: Iterable[str], hosts: Iterable[str], ssh: str) -> str:
    """Shell, run on the head, that copies each folder to every host lacking it, hosts in parallel.

    Prints `sent HOST DIR` or `have HOST DIR` per pair, and `fail HOST DIR` when a copy failed.
    """
    lines = ["cd /"]
    for host in hosts:
        h = shlex.quote(host)
        steps = []
        for remote_dir in remote_dirs:
            d = shlex.quote(remote_dir)
            marker = shlex.quote(f"{remote_dir}/{COMPLETE}")
            receive = shlex.quote(receive_script(remote_dir, gzip=False))
            copy = f"tar -C {d} -cf - --exclude={COMPLETE} . | {ssh} {h} {receive}"
            steps.append(f"if {ssh} {h} test -e {marker} </dev/null; then echo have {h} {d}; "
                         f"elif {copy}; then echo sent {h} {d}; else echo fail {h} {d}; fi")
        lines.append("( " + "; ".join(steps) + " ) &")
    lines.append("wait")
    return "\n".join(lines)
