"""Content-addressed staging: what the ranks need, sent once to the head and fanned out from it.

Every item (a data folder, a data file, a local model folder, a wheel of cpudist) lands in
`~/.cpudist/stage/<digest>/` on every node. Its `.manifest` lists each file's sha256 (sha256sum's
format) and the digest is the manifest's own sha256, so the folder's name vouches for every byte in
it:

- on arrival (the head from the laptop, each node from the head) the receiving shell checks the
  manifest against the folder's name and every file against the manifest (`sha256sum -c`) before it
  marks the folder `.complete`;
- on reuse a `.complete` marker is trusted only when the files still have the sizes, modification
  and change times it recorded (one `find`, no reading), and items up to REHASH_MAX bytes are
  re-hashed as well. A truncated or edited staged file fails the check (its ctime moves, whatever is
  done to its mtime), and the item is sent again.

The laptop streams each item as a gzipped tar built file by file (tar_chunks): never the whole
archive in memory.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import cpudist
from cpudist import state
from cpudist.errors import BadInput, JobFailed
from cpudist.hostfile import Host
from cpudist.run.stage_scripts import (
    MANIFEST,
    fan_out_script,
    missing_script,
    receive_script,
)

CHUNK = 1 << 20
# What AutoTokenizer reads from a model folder: a tokenizer alone need not drag the weights along.
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
                   "added_tokens.json", "spiece.model", "sentencepiece.bpe.model")


@dataclass(kw_only=True, frozen=True)
class StageItem:
    """One local file or folder to put on every node."""

    what: str  # e.g. "data", "model", "cpudist"
    local: Path
    digest: str
    only: tuple[str, ...] = ()  # a folder's top-level files to take; empty: everything
    manifest: str = ""  # sha256sum lines of its files, relative to the item's remote folder
    size: int = 0  # bytes of its files

    @property
    def is_dir(self) -> bool:
        return self.local.is_dir()

    def remote_dir(self, home: str) -> str:
        """The folder that holds the item on a node."""
        return f"{home}/{state.STAGE_DIR}/{self.digest[:32]}"

    def remote_path(self, home: str) -> str:
        """The path that replaces `local` in the job: the folder itself, or the file inside the
        folder."""
        return self.remote_dir(
            home) if self.is_dir else f"{self.remote_dir(home)}/{self.local.name}"


def _files(root: Path, only: tuple[str, ...] = ()) -> list[Path]:
    """The files to stage; a link to a file counts as that file (nodes get its bytes, never a
    link)."""
    if root.is_file():
        return [root]
    if only:
        found = [root / name for name in only if (root / name).is_file()
                 or (root / name).is_symlink()]
    else:
        found = sorted(p for p in root.rglob("*") if "__pycache__" not in p.parts
                       and (p.is_file() or p.is_symlink()))
    for f in found:
        if f.is_symlink():
            _check_link(f)
    return found


def _check_link(f: Path) -> None:
    """A link staging can send as the bytes it points to, else BadInput: a link that points nowhere
    would arrive dangling (and be reused as staged), and one to a folder would be left out."""
    copy = "Copy the folder with its links followed (`cp -rL SRC DEST`) and give the copy"
    if not f.exists():
        raise BadInput(f"{f} links to {os.readlink(f)}, which does not exist: it cannot be staged",
                       f"Fix or remove the link, or {copy[0].lower()}{copy[1:]}")
    if not f.is_file():
        raise BadInput(f"{f} links to the folder {f.resolve()}: staging does not follow links to "
                       "folders", copy)


def _name(f: Path, base: Path) -> str:
    name = f.relative_to(base).as_posix()
    # sha256sum would escape it; no data or model folder needs such a name
    if "\n" in name or "\\" in name:
        raise BadInput(f"{f}: a file name with a newline or backslash cannot be staged",
                       "Rename the file")
    return name


def manifest_of(path: Path, only: tuple[str, ...] = ()) -> tuple[str, int]:
    """(sha256sum lines of the item's files, relative to its folder; their total size)."""
    base = path if path.is_dir() else path.parent
    lines, total = [], 0
    for f in _files(path, only):
        h = hashlib.sha256()
        with f.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
                total += len(chunk)
        lines.append(f"{h.hexdigest()}  {_name(f, base)}\n")
    return "".join(lines), total


def digest_of(path: Path, only: tuple[str, ...] = ()) -> str:
    """sha256 of the item's manifest: it changes exactly with the relative names and contents of its
    files."""
    return hashlib.sha256(manifest_of(path, only)[0].encode()).hexdigest()


def item(what: str, path: Path, only: tuple[str, ...] = ()) -> StageItem:
    text, size = manifest_of(path.resolve(), only)
    return StageItem(what=what, local=path.resolve(),
                     digest=hashlib.sha256(text.encode()).hexdigest(), only=only, manifest=text,
                     size=size)


def _member(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    return info.tobuf(tarfile.PAX_FORMAT)


def _tar_blocks(it: StageItem) -> Iterator[bytes]:
    """The item as tar blocks, one file at a time, read in CHUNKs; a file that changed since its
    digest was taken is refused here (the head would refuse it anyway, by its digest)."""
    manifest = (it.manifest or manifest_of(it.local, it.only)[0]).encode()
    yield _member(MANIFEST, len(manifest),
                  0) + manifest + tarfile.NUL * (-len(manifest) % tarfile.BLOCKSIZE)
    base = it.local if it.is_dir else it.local.parent
    for f in _files(it.local, it.only):
        st = f.stat()  # a link's target: its bytes go, never the link
        yield _member(_name(f, base), st.st_size, st.st_mtime)
        sent = 0
        with f.open("rb") as fh:
            while sent < st.st_size and (chunk := fh.read(min(CHUNK, st.st_size - sent))):
                sent += len(chunk)
                yield chunk
        if sent != st.st_size or f.stat().st_size != st.st_size:
            raise BadInput(f"{f} changed while it was being staged",
                           "Re-run once nothing writes to it")
        yield tarfile.NUL * (-sent % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)


def tar_chunks(it: StageItem) -> Iterator[bytes]:
    """The item as a gzipped tar, streamed: at most about a CHUNK of it in memory at a time."""
    z = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: a gzip stream (`tar -xz`)
    for block in _tar_blocks(it):
        if out := z.compress(block):
            yield out
    yield z.flush()


def tar_bytes(it: StageItem) -> bytes:
    """The item as a gzipped tar in memory (small items and tests; staging streams tar_chunks)."""
    return b"".join(tar_chunks(it))


def code_fingerprint(root: Path | None = None) -> str:
    """sha256 of the cpudist package's files: nodes whose fingerprint differs get this code."""
    return digest_of(root or Path(cpudist.__file__).resolve().parent)


class Counted:
    """Chunks passed through, their bytes counted (what staging sent)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks, self.bytes = chunks, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.bytes += len(chunk)
            yield chunk


def moved_fields(model_given: str, staged: Iterable[tuple[str, StageItem]],
                 home: str) -> dict[str, str]:
    """The config fields staging points at the nodes' copies (data_dir, model, ...); a moved model
    keeps in model_given the absolute path it was staged from, so that the run's model (an adapter
    names its base) finds it again where it comes home."""
    items = dict(staged)
    out = {name: it.remote_path(home) for name, it in items.items()}
    if "model" in items and not model_given:
        out["model_given"] = str(items["model"].local)
    return out


class Shell(Protocol):
    """Where staged items land first: the head over SSH (ssh/client.Remote), or this machine
    (run/stage_here.py)."""

    def check(self, command: str, stdin: Iterable[bytes] | None = None,
              timeout: float = 120) -> str: ...


class Stager:
    """Puts items on the head once, then on every other node from the head (over `ssh`: the
    cluster's wrapper)."""

    def __init__(self, head: Shell, home: str, others: tuple[Host, ...], say: Any,
                 ssh: str | None = None) -> None:
        self.head, self.home, self.others, self.say = head, home, others, say
        self.ssh = ssh or f"{home}/{state.CLUSTER_DIR}/ssh"
        self.sent_bytes = 0
        self.copies = 0

    def _missing_on_head(self, items: list[StageItem]) -> list[StageItem]:
        absent = set(self.head.check(missing_script(i.remote_dir(self.home)
                                                    for i in items)).splitlines())
        return [i for i in items if i.remote_dir(self.home) in absent]

    def put(self, items: list[StageItem]) -> None:
        for it in self._missing_on_head(items):
            self.say(f"staging {it.what} {it.local} ({it.size / 1e6:.1f} MB) on the head")
            sent = Counted(tar_chunks(it))  # streamed: never the whole archive in memory
            self.head.check(receive_script(it.remote_dir(self.home)), stdin=sent, timeout=3600)
            self.sent_bytes += sent.bytes

    def fan_out(self, items: list[StageItem]) -> None:
        if not self.others or not items:
            return
        script = fan_out_script([i.remote_dir(self.home) for i in items],
                                [h.name for h in self.others], self.ssh)
        out = self.head.check(script, timeout=3600)
        results = [line.split(" ", 2) for line in out.splitlines() if line.count(" ") >= 2]
        failed = sorted({host for kind, host, _ in results if kind == "fail"})
        if failed or len(results) != len(items) * len(self.others):
            raise JobFailed("copying the staged inputs from the head to "
                            f"{', '.join(failed) or 'the other nodes'} failed",
                            "Check that the nodes reach each other (`cpudist hosts doctor`) and "
                            "have free "
                            "disk, or pass --shared-fs when they all see the head's paths")
        self.copies += sum(kind == "sent" for kind, _, _ in results)
        if self.copies:
            self.say(f"copied {self.copies} staged item(s) from the head to the other nodes")
