"""A rank's output as whole tagged lines (cpudist/run/rank_lines.py), and the rank wrapper that
relays a script's stdout and stderr through it (tests/integration/test_launch_whole_lines.py runs it
on every launcher route)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from cpudist.run.rank_lines import PIPE_BUF, TAGGED, pieces, tag

# Pieces of a line on stdout and of another on stderr, in turn, each written on its own; the last
# line has no end.
PIECES = '''
import sys
for i in range(40):
    for word in ("out", str(i), "a", "b"):
        sys.stdout.write(word + " "); sys.stdout.flush()
        sys.stderr.write("err " if word == "out" else word + " "); sys.stderr.flush()
    sys.stdout.write("end\\n"); sys.stdout.flush()
    sys.stderr.write("end\\n"); sys.stderr.flush()
sys.stdout.write("no end")
'''


def test_a_line_is_one_tagged_write_and_a_long_one_several_cut_between_characters() -> None:
    assert tag("h", 3) == b"[h:3] " and TAGGED.findall("[h:3] x") == [("h", "3")]
    assert pieces(b"step 1\n", tag("h", 3)) == [b"[h:3] step 1\n"]
    assert pieces(b"no end", tag("h", 3)) == [b"[h:3] no end\n"]
    assert pieces(b"\n", b"") == [b"\n"]
    # two bytes a character: a cut at a byte would split one
    long = ("\u00e9" * 5000 + "x").encode()
    out = pieces(long + b"\n", tag("node-1", 12))
    assert len(out) == 3 and all(len(p) <= PIPE_BUF and p.startswith(b"[node-1:12] ") for p in out)
    assert b"".join(p.decode().removeprefix("[node-1:12] ").removesuffix("\n").encode()
                    for p in out) == long


def test_the_wrapper_hands_on_whole_lines_of_both_streams_each_tagged_with_the_workers_rank(
) -> None:
    p = subprocess.run([sys.executable, "-m", "cpudist.run.script_rank", "--relay", "--",
                        sys.executable, "-c",
                        PIECES], env={**os.environ, "RANK": "5", "PYTHONUNBUFFERED": "1"},
                       capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    at = f"[{socket.gethostname()}:5]"
    expected = [f"{at} {s} {i} a b end" for i in range(40)
                for s in ("out", "err")] + [f"{at} no end"]
    assert sorted(p.stdout.splitlines()) == sorted(expected), p.stdout
