"""Watching the store of the checkpoint copies (--checkpoint-s3) while the ranks train: an endpoint
that stops answering is said in one line within DETECTION_BOUND_S, not at the next checkpoint (which
may be an hour away).

    with StoreWatch(mirror.store, say):   # on rank 0, the rank that copies
        train(...)

The rank that copies probes the store every PROBE_EVERY_S with one cheap call (S3: a listing of at
most one key under the run's prefix, one attempt, PROBE_TIMEOUT_S timeouts: about 17,000 requests a
day, cents). After MISSES failed probes in a row it says once that the store stopped answering, and
once that it answers again.

The run goes on, as after a failed copy (durable.copy_or_warn): the store is not needed to train,
every checkpoint stays whole on the head, and the first one written after the store answers again is
copied. Stopping the run would lose more (the work since the last checkpoint; a spot stop that no
longer ends as a resumable stop). The user who wants it stopped stops it (Ctrl-C, `cpudist stop`)
and resumes with --resume auto.

Bound: a store that stops answering is said within MISSES * (PROBE_EVERY_S + PROBE_TIMEOUT_S) = 20
s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from cpudist.objects import ObjectStore, StoreError

PROBE_EVERY_S = 5.0
PROBE_TIMEOUT_S = 5.0  # per connect and per read of one probe
MISSES = 2  # failed probes in a row before the store counts as lost (one slow answer is not a loss)
DETECTION_BOUND_S = MISSES * (PROBE_EVERY_S + PROBE_TIMEOUT_S)


class StoreWatch:
    """Probes `store` in a daemon thread; `say` gets one line when it stops answering and one when
    it answers again."""

    def __init__(self, store: ObjectStore, say: Callable[[str], None],
                 every_s: float = PROBE_EVERY_S, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.store, self.say = store, say
        self.every_s, self.timeout_s = every_s, timeout_s
        self.probes = 0  # probes done, answered or not
        self.lost: str | None = None  # why the store counts as lost now, or None
        self._failing = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-watch", daemon=True)

    def __enter__(self) -> StoreWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stopping.set()
        # a probe under way gives up within its timeouts
        self._thread.join(timeout=2 * self.timeout_s + 1)

    def _run(self) -> None:
        while not self._stopping.wait(self.every_s):
            try:
                self.store.probe(self.timeout_s)
            except StoreError as e:
                self._failed(e.what)
            # a watch that dies silently is worse than one that counts a miss and goes on
            except Exception as e:
                self._failed(f"{type(e).__name__}: {e}")
            else:
                self._answered()
            finally:
                self.probes += 1

    def _failed(self, why: str) -> None:
        self._failing += 1
        if self._failing == MISSES and not self._stopping.is_set():
            self.lost = why
            self.say(f"warning: the store of the checkpoint copies {self.store.url} stopped "
                     f"answering ({why}); training goes on and each checkpoint stays on the head, "
                     "the first one written after the store answers again is copied. To stop "
                     "instead: Ctrl-C (or `cpudist stop`), then the same command with --resume "
                     "auto")

    def _answered(self) -> None:
        if self.lost is not None and not self._stopping.is_set():
            self.say(f"the store of the checkpoint copies {self.store.url} answers again; the next "
                     "checkpoint is copied there")
        self._failing, self.lost = 0, None
