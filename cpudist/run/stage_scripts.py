"""The shell side of staging (run/stage.py's module doc says what is checked and why): the scripts
that check a staged folder, receive one from stdin atomically, and fan items out from the head.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

COMPLETE = ".complete"
MANIFEST = ".manifest"
# bytes: an item this small is re-hashed on every reuse (a GLUE task: well under a second)
REHASH_MAX = 64 << 20

# Shell functions of every staging script. `listing`: size, mtime, ctime and type of each file the
# manifest names (in the current folder), as `.complete` records them. `staged DIR`: DIR holds a
# complete, unaltered staging.
CHECKS = (
    f"listing() {{ cut -c67- {MANIFEST} | sed 's|^|./|' | xargs -r -d '\\n' "
    f"sh -c 'find \"$@\" -maxdepth 0 -printf \"%s %T@ %C@ %y %p\\n\"' find 2>/dev/null; }}; "
    f"verify() {{ [ \"$(sha256sum < {MANIFEST} | cut -c1-32)\" = \"$1\" ] && "
    f"sha256sum -c --quiet --strict {MANIFEST} >/dev/null 2>&1; }}; "
    f"staged() {{ [ -f \"$1/{COMPLETE}\" ] && [ -f \"$1/{MANIFEST}\" ] && ( cd \"$1\" && "
    f"[ \"$(sha256sum < {MANIFEST} | cut -c1-32)\" = \"${{1##*/}}\" ] && listing | cmp -s - "
    f"{COMPLETE} && "
    f"{{ [ \"$(awk '{{s+=$1}} END {{print s+0}}' {COMPLETE})\" "
    f"-gt {REHASH_MAX} ] || verify \"${{1##*/}}\"; }} ); }}")


def check_script(remote_dir: str) -> str:
    """Shell whose exit status is 0 when `remote_dir` holds its item, complete and unaltered (see
    the module doc)."""
    return f"{CHECKS}; staged {shlex.quote(remote_dir)}"


def missing_script(remote_dirs: Iterable[str]) -> str:
    """Shell that prints each of `remote_dirs` that does not hold its item complete and
    unaltered."""
    dirs = " ".join(shlex.quote(d) for d in remote_dirs)
    return f"{CHECKS}; for d in {dirs}; do staged \"$d\" || echo \"$d\"; done"


def receive_script(remote_dir: str, gzip: bool = True) -> str:
    """Shell that unpacks a tar from stdin into `remote_dir` atomically: a temporary folder of its
    own, checked against the folder's name (its digest, see the module doc), then one rename(2).
    Runs staging the same item at once each unpack their own copy; the first rename wins, the others
    find the folder staged and drop theirs. A folder that fails the check (an older cpudist's, a
    truncated or edited file) is replaced."""
    d = shlex.quote(remote_dir)
    name = shlex.quote(remote_dir.rsplit("/", 1)[-1])
    parent = shlex.quote(remote_dir.rsplit("/", 1)[0] or "/")
    template = shlex.quote(remote_dir + ".part.XXXXXX")
    bad = shlex.quote(f"cpudist: what arrived for {remote_dir} does not match its digest (damaged "
                      "on the way, or changed while it was sent)")
    return (f"set -e; {CHECKS}; mkdir -p {parent}; part=$(mktemp -d {template}); trap 'rm -rf "
            "\"$part\"' EXIT; "
            f"chmod 755 \"$part\"; tar -x{'z' if gzip else ''}f - -C \"$part\"; "
            f"( cd \"$part\" && verify {name} ) || {{ echo {bad} >&2; exit 3; }}; "
            f"( cd \"$part\" && listing > {COMPLETE} ); "
            f"mv -T \"$part\" {d} 2>/dev/null || staged {d} || "
            f"{{ mv -T {d} \"$part.old\" 2>/dev/null || true; rm -rf \"$part.old\"; "
            f"mv -T \"$part\" {d} 2>/dev/null "
            f"|| staged {d}; }}")


def fan_out_script(remote_dirs: Iterable[str], hosts: Iterable[str], ssh: str) -> str:
    """Shell, run on the head, that copies each folder to every host lacking it (or holding it
    altered), hosts in parallel.

    Prints `sent HOST DIR` or `have HOST DIR` per pair, and `fail HOST DIR` when a copy failed.
    """
    lines = ["cd /"]
    for host in hosts:
        h = shlex.quote(host)
        steps = []
        for remote_dir in remote_dirs:
            d = shlex.quote(remote_dir)
            check = shlex.quote(check_script(remote_dir))
            receive = shlex.quote(receive_script(remote_dir, gzip=False))
            copy = f"tar -C {d} -cf - --exclude={COMPLETE} . | {ssh} {h} {receive}"
            steps.append(f"if {ssh} {h} {check} </dev/null; then echo have {h} {d}; "
                         f"elif {copy}; then echo sent {h} {d}; else echo fail {h} {d}; fi")
        lines.append("( " + "; ".join(steps) + " ) &")
    lines.append("wait")
    return "\n".join(lines)
