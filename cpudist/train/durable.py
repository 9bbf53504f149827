"""A durable copy of checkpoints in an object store: a reclaimed spot head node takes its disk, not
the run, with it.

    # the store: cpudist/cloud/aws/objects.py
    mirror = Mirror(S3Objects("s3://my-bucket/runs/sst2"))
    mirror.upload(Path("out/step-000040"))          # after the local COMPLETE marker is written
    latest = mirror.complete()[-1]                   # on resume, on a fresh node
    mirror.download(latest, Path("out"))

A checkpoint is a folder `step-NNNNNN/` of opaque files and a `COMPLETE` marker written last,
locally and in the store alike: only a checkpoint whose marker exists is ever listed, downloaded or
kept. The rank's entry point (cpudist/rank.py) builds the store for --checkpoint-s3; this module
knows only the few verbs of ObjectStore.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from cpudist.errors import BadInput, CpudistError
from cpudist.objects import ObjectStore, StoreError
from cpudist.train.checkpoint_meta import COMPLETE, PART, step_of


class MirrorError(CpudistError):
    """Copying checkpoints to or from the object store failed; `code` keeps the provider's error
    code."""

    def __init__(self, message: str, hint: str | None = None, code: str = "") -> None:
        super().__init__(message, hint)
        self.code = code


class MirrorBadSetup(MirrorError, BadInput):
    """The store refused the credentials: the user's setup, exit code 2."""


class Mirror:
    """Checkpoint folders under the store's location as <run id>/<name>/<path> (<name>/<path> for a
    run without an id), each with its COMPLETE marker put last: runs sharing a location never see
    each other's checkpoints."""

    def __init__(self, store: ObjectStore, run_id: str = "") -> None:
        self.store: ObjectStore = _Under(store, f"{run_id}/") if run_id else store
        self.url = self.store.url

    def upload(self, ckpt: Path) -> None:
        """Upload a finished checkpoint folder; its COMPLETE marker goes last, after every other
        file."""
        if step_of(ckpt.name) is None:
            raise BadInput(f"{ckpt} is not named like a checkpoint",
                           "Name checkpoint folders step-NNNNNN")
        if not (ckpt / COMPLETE).is_file():
            raise BadInput(f"{ckpt} has no {COMPLETE} marker",
                           "Upload a checkpoint only once it is fully written")
        files = {p.relative_to(ckpt).as_posix(): p for p in ckpt.rglob("*") if p.is_file()
                 and p.name != COMPLETE}
        with self._errors(f"upload {ckpt.name} to {self.url}"):
            # A re-upload of the same step must not look complete while its files are half replaced,
            # nor keep files of the earlier upload that this one lacks (a rank file of a larger
            # world).
            self.store.delete([f"{ckpt.name}/{COMPLETE}"])
            earlier = self._listing(ckpt.name).get(ckpt.name, {})
            for rel in sorted(files):
                self.store.put(files[rel], f"{ckpt.name}/{rel}")
            self.store.delete([key for rel, key in earlier.items() if rel not in files])
            self.store.put(ckpt / COMPLETE, f"{ckpt.name}/{COMPLETE}")

    def complete(self) -> list[str]:
        """Names of the checkpoints whose COMPLETE marker is in the store, oldest step first."""
        return _complete(self._listing())

    def download(self, name: str, dest_dir: Path) -> Path:
        """Download a complete checkpoint to dest_dir/<name> (via <name>.part and a rename); its
        path."""
        listing = self._listing()
        if COMPLETE not in listing.get(name, {}):
            raise MirrorError(f"no complete checkpoint '{name}' in {self.url}",
                              "Pick one of: "
                              f"{', '.join(self.complete()) or 'none (start from scratch)'}",
                              "NoSuchCheckpoint")
        final, part = dest_dir / name, dest_dir / f"{name}{PART}"
        # before any write
        targets = {rel: _inside(part, rel, key, self.url) for rel, key in listing[name].items()}
        shutil.rmtree(part, ignore_errors=True)  # what an interrupted download left
        with self._errors(f"download {name} from {self.url}"):
            for rel, key in sorted(listing[name].items(), key=lambda item: item[0] == COMPLETE):
                targets[rel].parent.mkdir(parents=True, exist_ok=True)
                self.store.get(key, targets[rel])
        if final.exists():
            # a stale or half-written local copy: the store's complete one wins
            shutil.rmtree(final)
        part.rename(final)
        return final

    def prune(self, keep: int, written: str | None = None) -> None:
        """Keep `written` (the checkpoint just uploaded; default: the newest) and the newest `keep -
        1` complete ones older than it; delete the other older ones, complete or not. Newer ones (a
        timeline a resume abandoned, see set_aside) are left alone."""
        if keep < 1:
            raise BadInput(f"keep={keep} would delete every checkpoint",
                           "Keep at least 1 to be able to resume")
        listing = self._listing()
        done = _complete(listing)
        if not done:
            return
        newest = step_of(written or done[-1]) or 0
        older = [n for n in done if (step_of(n) or 0) < newest]
        kept = set(older[max(0, len(older) - (keep - 1)):] if keep > 1 else [])
        stale = [n for n in listing if (step_of(n) or 0) < newest and n not in kept]
        # Markers first: a checkpoint interrupted mid-delete must not be listed as complete.
        markers = [listing[n][COMPLETE] for n in stale if COMPLETE in listing[n]]
        rest = [key for n in stale for rel, key in listing[n].items() if rel != COMPLETE]
        with self._errors(f"prune {self.url}"):
            self.store.delete(markers)
            self.store.delete(rest)

    def set_aside(self, step: int, stamp: str) -> list[str]:
        """Move the checkpoints newer than `step` (the timeline a resume from `step` abandons) to
        abandoned-<stamp>/<name>/ under the run's location, never deleting them; the names moved."""
        listing = self._listing()
        newer = [n for n in listing if (step_of(n) or 0) > step]
        with self._errors(
            f"set aside {', '.join(newer)} in {self.url}"), tempfile.TemporaryDirectory() as tmp:
            for name in newer:
                # the marker last
                keys = sorted(listing[name].items(), key=lambda item: item[0] == COMPLETE)
                for i, (rel, key) in enumerate(keys):
                    local = Path(tmp) / str(i)
                    self.store.get(key, local)
                    self.store.put(local, f"abandoned-{stamp}/{name}/{rel}")
                # unlisted first
                self.store.delete([k for rel, k in listing[name].items() if rel == COMPLETE])
                self.store.delete([k for rel, k in listing[name].items() if rel != COMPLETE])
        return newer

    def _listing(self, only: str = "") -> dict[str, dict[str, str]]:
        """Checkpoint folder name -> {path inside the folder: key}, for folders named step-N (or
        `only`)."""
        found: dict[str, dict[str, str]] = {}
        with self._errors(f"list {self.url}"):
            for key in self.store.keys(f"{only}/" if only else ""):
                name, _, rel = key.partition("/")
                # a hostile rel ('/abs', '../x') fails download
                if step_of(name) is not None and rel:
                    found.setdefault(name, {})[rel] = key
        return found

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """The store's errors, raised in the block, as MirrorErrors that say what the mirror was
        doing."""
        try:
            yield
        except StoreError as e:
            # bad credentials stay bad setup (2)
            cls = MirrorBadSetup if isinstance(e, BadInput) else MirrorError
            raise cls(f"cannot {doing}: {e.what}", e.hint, e.code) from e


def copy_or_warn(mirror: Mirror, ckpt: Path, keep: int) -> str | None:
    """Upload a written checkpoint and prune the older copies; None, or the warning when the store
    failed (after its own retries): the local checkpoint is whole and the run goes on, the next
    checkpoint tries again. Failing the run instead would lose more: the other ranks would wait out
    --dist-timeout, and a spot stop would not end as a stop (exit 75) that --on-preemption resume
    acts on."""
    try:
        mirror.upload(ckpt)
        mirror.prune(keep, ckpt.name)
    except MirrorError as e:
        return (f"warning: {ckpt.name} is not copied to {mirror.url} ({e.message}); it is kept at "
                f"{ckpt} and the next checkpoint tries the copy again. If the head's disk is lost "
                "before a copy succeeds, a resume starts from the newest copy in S3")
    return None


def _inside(folder: Path, rel: str, key: str, url: str) -> Path:
    """Where the file of `key` (`rel` inside its checkpoint) goes: a path strictly inside `folder`,
    else MirrorError (an empty or '..' segment in a key would write to an absolute path or outside
    the checkpoint)."""
    target = (folder / rel).resolve()
    if not target.is_relative_to(folder.resolve()) or target == folder.resolve():
        raise MirrorError(f"the key '{key}' in {url} would be written outside its checkpoint "
                          f"folder {folder}",
                          "Someone put it there by hand or the store is tampered with: remove it "
                          "from the store, or resume from another checkpoint", "UnsafeKey")
    return target


def runs_in(store: ObjectStore) -> dict[str, list[str]]:
    """Run id -> its complete checkpoints (oldest first), for every run keeping copies at the
    store's location."""
    found: dict[str, list[str]] = {}
    for key in store.keys(""):
        parts = key.split("/")
        if len(parts) == 3 and parts[2] == COMPLETE and step_of(parts[1]) is not None and step_of(
            parts[0]) is None:
            found.setdefault(parts[0], []).append(parts[1])
    return {run: sorted(names, key=lambda n: step_of(n) or 0) for run, names in found.items()}


class _Under:
    """A store seen from one of its folders: keys relative to `base` (a run's own part of a
    location)."""

    def __init__(self, store: ObjectStore, base: str) -> None:
        self.inner, self.base = store, base
        self.url = f"{store.url.rstrip('/')}/{base.rstrip('/')}"

    def keys(self, under: str = "") -> list[str]:
        return [k[len(self.base):] for k in self.inner.keys(self.base + under)]

    def put(self, path: Path, key: str) -> None:
        self.inner.put(path, self.base + key)

    def get(self, key: str, path: Path) -> None:
        self.inner.get(self.base + key, path)

    def delete(self, keys: Sequence[str]) -> None:
        self.inner.delete([self.base + k for k in keys])

    def probe(self, timeout_s: float) -> None:
        self.inner.probe(timeout_s)


def _complete(listing: dict[str, dict[str, str]]) -> list[str]:
    """The names in a listing whose marker is there, oldest step first."""
    return sorted((n for n, keys in listing.items() if COMPLETE in keys), key=lambda n: step_of(n)
                  or 0)
