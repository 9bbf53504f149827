"""Content-addressed staging: what the ranks need, sent once to the head and fanned out from it.

Every item (a data folder, a data file, a local model folder, a wheel of cpudist) lands in
`~/.cpudist/stage/<sha256>/` on every node. The digest covers names and bytes, so a second run with
the same inputs finds `.complete` markers everywhere and sends nothing.
"""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import cpudist
from cpudist import state
from cpudist.errors import BadInput

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
    """The files to stage; a link to a file counts as that file (nodes get its bytes, never a link)."""
    if root.is_file():
        return [root]
    if only:
        found = [root / name for name in only if (root / name).is_file() or (root / name).is_symlink()]
    else:
        found = sorted(p for p in root.rglob("*") if "__pycache__" not in p.parts and (p.is_file() or p.is_symlink()))
    for f in found:
        if f.is_symlink():
            _check_link(f)
    return found


def _check_link(f: Path) -> None:
    """A link staging can send as the bytes it points to, else BadInput: a link that points nowhere would arrive
    dangling (and be reused as staged), and one to a folder would be left out."""
    copy = "Copy the folder with its links followed (`cp -rL SRC DEST`) and give the copy"
    if not f.exists():
        raise BadInput(f"{f} links to {os.readlink(f)}, which does not exist: it cannot be staged",
                       f"Fix or remove the link, or {copy[0].lower()}{copy[1:]}")
    if not f.is_file():
        raise BadInput(f"{f} links to the folder {f.resolve()}: staging does not follow links to folders", copy)


def digest_of(path: Path, only: tuple[str, ...] = ()) -> str:
    """sha256 over relative names and contents (a folder) or name and content (a file)."""
    h = hashlib.sha256()
    base = path if path.is_dir() else path.parent
    for f in _files(path, only):
        h.update(str(f.relative_to(base)).encode() + b"\0")
        if f.is_symlink():  # an item with links gets a folder of its own: older stagings kept links (dangling)
            h.update(b"followed link\0")
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
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1, dereference=True) as tar:  # links as their bytes
        base = it.local if it.is_dir else it.local.parent
        for f in _files(it.local, it.only):
            tar.add(str(f), arcname=str(f.relative_to(base)), recursive=False)
    return buf.getvalue()


def code_fingerprint(root: Path | None = None) -> str:
    """sha256 of the cpudist package's files: nodes whose fingerprint differs get this code."""
    return digest_of(root or Path(cpudist.__file__).resolve().parent)


def receive_script(remote_dir: str, gzip: bool = True) -> str:
    """Shell that unpacks a tar from stdin into `remote_dir` atomically: a temporary folder of its own, then one
    rename(2). Runs staging the same item at once each unpack their own copy; the first rename wins, the others
    find the folder complete (same digest, same bytes) and drop theirs; a complete folder is never removed."""
    d = shlex.quote(remote_dir)
    parent = shlex.quote(remote_dir.rsplit("/", 1)[0] or "/")
    template = shlex.quote(remote_dir + ".part.XXXXXX")
    return (f"set -e; mkdir -p {parent}; part=$(mktemp -d {template}); trap 'rm -rf \"$part\"' EXIT; "
            f"chmod 755 \"$part\"; tar -x{'z' if gzip else ''}f - -C \"$part\"; touch \"$part\"/{COMPLETE}; "
            f"mv -T \"$part\" {d} 2>/dev/null || [ -e {d}/{COMPLETE} ] || "
            # A folder without its marker is what an older cpudist left: renamed aside, then replaced.
            f"{{ mv -T {d} \"$part.old\"; rm -rf \"$part.old\"; mv -T \"$part\" {d}; }}")


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
