"""A rank's error line on stderr, written by the rank programs and read by the launcher to say
where a failure began.

    [host:rank] error: MESSAGE                 the rank's own failure
    [host:rank] error: lost a peer rank: WHY   a collective broken by a peer: a consequence
"""

from __future__ import annotations

import re

ERROR = re.compile(r"\[([^\]:\s]+)(?::\d+)?\] error: ")
LOST_PEER = "error: lost a peer rank: "


def error_line(host: str, rank: str | int | None, message: str) -> str:
    """The line a rank writes when it fails (`rank` None: before it knows its rank)."""
    where = host if rank is None else f"{host}:{rank}"
    return f"[{where}] error: {message}\n"


def lost_peer_line(host: str, rank: str | int, why: str) -> str:
    """The line a rank writes when a peer broke its collective."""
    return f"[{host}:{rank}] {LOST_PEER}{why}\n"


def host_of(line: str) -> str | None:
    """The host of a rank error line, or None for any other line."""
    m = ERROR.search(line)
    return m.group(1) if m else None


def is_lost_peer(line: str) -> bool:
    return LOST_PEER in line
