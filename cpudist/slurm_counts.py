"""Slurm's compressed per-node count lists (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE): read by
the launching side (cpudist/launch/slurm*.py) and by each rank (cpudist/train/dist.py), so a
leaf."""

from __future__ import annotations

import re


def expand_counts(text: str) -> list[int]:
    """Slurm's compressed per-node counts, e.g. SLURM_TASKS_PER_NODE `2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"not a Slurm count list: {text!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts
