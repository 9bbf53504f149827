"""Where a rank's time goes before its first step: result.json's `startup` (seconds per phase, in
order).

    before_rank       the `cpudist` command's start to this rank's process start: connecting,
                      staging, the launcher starting its ranks (absent when the rank was started
                      by hand)
    python_and_imports  the rank's interpreter start to its entry point
                      (torch and transformers imported)
    process_group     the rendezvous of every rank
    data              reading the task's rows
    tokenizer         loading the tokenizer
    tokenize          tokenizing the rows (`tokens_cached`: whether they came from the node's cache)
    model             building or loading the model
    first_step        the first optimizer step (warm-up included)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cpudist.state import STARTED_AT_ENV

# /proc's process start and uptime count in clock ticks (10 ms each at the usual USER_HZ 100): the
# age is known to about two of them
TICKS_S = 0.05


def process_age_s() -> float | None:
    """Seconds since this process started, by the kernel's clock; None where /proc does not say."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        # field 22, counted after "pid (comm) "
        started_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


@dataclass
class Startup:
    """The phases measured so far, in the order they ran (one per rank; rank 0's go into
    result.json)."""

    phases: dict[str, float] = field(default_factory=dict)
    tokens_cached: bool | None = None

    @classmethod
    def at_entry(cls, env: Mapping[str, str]) -> Startup:
        """The phases up to the rank's entry point: before it (from the command's start) and its
        imports."""
        s = cls()
        age = process_age_s()
        if age is None:
            return s
        started = env.get(STARTED_AT_ENV)
        try:
            before = time.time() - age - float(started) if started else None
        except ValueError:
            before = None
        # Clocks of other nodes may disagree: never a negative phase. Within TICKS_S of zero it is
        # the kernel's clock ticks (a local mpiexec can start a rank 30 ms after the command stamped
        # its start): zero.
        if before is not None and before >= -TICKS_S:
            s.phases["before_rank"] = round(max(before, 0.0), 3)
        s.phases["python_and_imports"] = round(age, 3)
        return s

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - began, 3)

    def as_dict(self, first_step_s: float | None) -> dict[str, object]:
        """result.json's `startup`: every phase, the first step, their total, and whether tokens
        were cached."""
        phases = dict(self.phases)
        if first_step_s is not None:
            phases["first_step"] = round(first_step_s, 3)
        out: dict[str, object] = {**phases, "total_to_first_step": round(sum(phases.values()), 3)}
        if self.tokens_cached is not None:
            out["tokens_cached"] = self.tokens_cached
        return out
