"""A rank's output as whole lines, each tagged with its rank: what `cpudist launch` hands the user
on every route.

    [node1:1] step 3 loss 0.75494266

A script's line may reach its pipe in pieces (under PYTHONUNBUFFERED, `print(a, b)` writes each
piece on its own), and workers that share one stdout (a node's torchrun or `accelerate launch`)
interleave their pieces. The rank wrapper (run/script_rank.py) reads its script's stdout and stderr
on pipes of their own, keeps a line until its end, and writes it with the tag in one write(2) of at
most PIPE_BUF bytes, which a pipe shared by several writers never splits or interleaves; a longer
line goes out as several tagged pieces. torchrun's own `--tee` prints a partial line as soon as its
tailer reads one, so the wrapper tags rather than torchrun.
"""

from __future__ import annotations

import os
import re
import select
import threading
from collections.abc import Iterable
from typing import IO

TAG = "[{host}:{rank}] "  # as MPICH's and Intel MPI's Hydra tag a rank's lines (-prepend-pattern)
# TAG as the reader of the lines finds it: host, rank
TAGGED = re.compile(r"\[([^\]:\s]+):(\d+)\] ")
PIPE_BUF = select.PIPE_BUF  # the most bytes one write(2) to a pipe puts there in one piece


def tag(host: str, rank: int) -> bytes:
    """The prefix of every line of this rank."""
    return TAG.format(host=host, rank=rank).encode()


def pieces(line: bytes, prefix: bytes) -> list[bytes]:
    """A line (its newline added if it had none) as writes of at most PIPE_BUF bytes, each tagged
    with `prefix` and ending in a newline; a long line is cut between UTF-8 characters."""
    body = line[:-1] if line.endswith(b"\n") else line
    room = PIPE_BUF - len(prefix) - 1
    out = []
    while True:
        cut = min(len(body), room)
        while 0 < cut < len(body) and body[cut] & 0xC0 == 0x80:  # not inside a multi-byte character
            cut -= 1
        cut = cut or room
        out.append(prefix + body[:cut] + b"\n")
        body = body[cut:]
        if not body:
            return out


class LineRelay:
    """Copies the lines of several streams to one file descriptor, each line whole and in one
    write."""

    def __init__(self, fd: int, prefix: bytes) -> None:
        self.fd, self.prefix, self.lock = fd, prefix, threading.Lock()

    def write(self, line: bytes) -> None:
        for piece in pieces(line, self.prefix):
            with self.lock:
                view = memoryview(piece)
                # a blocking pipe takes <= PIPE_BUF bytes at once; a file may take fewer
                while view:
                    view = view[os.write(self.fd, view):]

    def copy(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            self.write(line)

    def copy_all(self, streams: Iterable[IO[bytes]]) -> None:
        """Copy every stream to its end, each on a thread of its own."""
        threads = [threading.Thread(target=self.copy, args=(s,), daemon=True) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
