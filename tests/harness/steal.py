"""What the machine gave a test over an interval, per core, from /proc/stat: steal and idle time.

    with CpuWindow() as cpu:
        measure_something()
    assert rate >= floor * cpu.left(), str(cpu)

A virtual machine's core is not always its own: on a busy host the hypervisor runs other tenants on
the guest's vCPUs (steal time), which nothing inside the guest can give back. A test that reads a
core share or a link rate holds it to what the machine left (1 - steal over the same interval) and
prints the steal, and the idle time beside it, so a failure says whether the machine was starved or
the product was slow.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

# columns of /proc/stat's cpuN lines: user nice system idle iowait irq softirq steal ...
IDLE, STEAL = 3, 7
BUSY = (0, 1, 2, 5, 6)  # the columns of time the guest ran something: user nice system irq softirq


def core_ticks() -> dict[int, list[int]]:
    """Per core, /proc/stat's counters: user nice system idle iowait irq softirq steal ..."""
    rows = (line.split() for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("cpu"))
    return {int(name[3:]): [int(v) for v in values] for name, *values in rows if name[3:].isdigit()}


def stolen(before: dict[int, list[int]], after: dict[int, list[int]],
           columns: int | tuple[int, ...] = STEAL) -> dict[int, float]:
    """Per core, the fraction of the interval in some columns: steal by default (IDLE: idle; BUSY:
    busy)."""
    picked = (columns,) if isinstance(columns, int) else columns
    shares = {}
    for core, now in after.items():
        # guest time is counted in user
        delta = [b - a for a, b in zip(before[core], now, strict=True)][:8]
        shares[core] = round(sum(delta[c] for c in picked) / max(sum(delta), 1), 3)
    return shares


class CpuWindow:
    """Steal, idle and busy time per core over a `with` block (each empty until the block ends)."""

    def __init__(self) -> None:
        self.steal: dict[int, float] = {}
        self.idle: dict[int, float] = {}
        # anything this machine ran: the test's processes and everyone else's
        self.busy: dict[int, float] = {}
        self._before: dict[int, list[int]] = {}

    def __enter__(self) -> CpuWindow:
        self._before = core_ticks()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        after = core_ticks()
        self.steal, self.idle = stolen(self._before, after), stolen(self._before, after, IDLE)
        self.busy = stolen(self._before, after, BUSY)

    def left(self, cores: list[int] | None = None) -> float:
        """The share of `cores` (all by default) the hypervisor left this machine over the block."""
        taken = [self.steal[c] for c in (self.steal if cores is None else cores)]
        return 1 - sum(taken) / max(len(taken), 1)

    def __str__(self) -> str:
        return f"steal per core {self.steal}, idle per core {self.idle}, busy per core {self.busy}"
