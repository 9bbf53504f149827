"""PowerSGD's memory kept per parameter, so that a checkpoint and DDP's bucket rebuild keep it
exact.

torch's PowerSGD hook keeps, per gradient bucket, each rank's error feedback (what compression has
not sent yet: it differs from rank to rank) and the warm-started Q factors (the same on every rank
after their all-reduce). Buckets are not stable: DDP starts with one bucket of every parameter and
rebuilds them in the order gradients became ready after the first step, so a resumed process meets a
layout the checkpointed one never had. Here that memory is read out per parameter (for a checkpoint,
and when a bucket's layout changes) and written back in the layout of the bucket that comes next.
Every parameter's compression is its own (one P and Q per matrix, the rest all-reduced), so the
layout changes no number. A Q that never existed starts from a draw seeded by the parameter's index
(torch draws one seed per bucket, which a resumed run's other layout could not repeat), then is
orthogonalized by the hook as a warm start is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# + the parameter's index: the first projection of each matrix, alike on every rank
Q_SEED = 20_000_003


class Memory:
    """Error feedback and Q factors of a PowerSGDState, per trained parameter (indexes into
    `params`)."""

    def __init__(self, state: Any, params: list[torch.nn.Parameter]) -> None:
        self.state = state
        self.params = params
        self.index = {id(p): i for i, p in enumerate(params)}
        # bucket index -> the parameters its entries in `state` hold
        self.layout: dict[int, tuple[int, ...]] = {}
        # this rank's, flat: those not held by a bucket entry are current
        self.errors: dict[int, torch.Tensor] = {}
        self.qs: dict[int, torch.Tensor] = {}  # m x r per compressed matrix, likewise

    def wrap(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """The hook, with each compressed bucket's memory put in its layout first."""

        def remembered(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            if state.iter >= state.start_powerSGD_iter:  # this call compresses
                self._place(bucket.index(), tuple(self.index[id(p)] for p in bucket.parameters()))
            return hook(state, bucket)

        remembered.__annotations__ = {}  # DDP checks a hook's annotations against the real classes
        return remembered

    def shared(self) -> dict[str, Any]:
        """What every rank holds alike: the iteration count and the Q factors (None: not drawn
        yet)."""
        self._collect()
        return {"iter": self.state.iter, "q": [self.qs.get(i) for i in range(len(self.params))]}

    def mine(self) -> dict[str, Any]:
        """This rank's error feedback, per parameter (None: none yet)."""
        self._collect()
        return {"error": [self.errors.get(i) for i in range(len(self.params))]}

    def load(self, shared: dict[str, Any], mine: dict[str, Any] | None) -> None:
        """Take back what `shared()` and this rank's `mine()` gave."""
        self._drop()
        self.state.iter = int(shared["iter"])
        self.qs = {i: q.clone() for i, q in enumerate(shared["q"]) if q is not None}
        errors = (mine or {}).get("error", [])
        self.errors = {i: e.clone() for i, e in enumerate(errors) if e is not None}

    def _matrix(self, i: int) -> tuple[int, int, int] | None:
        """(n, m, r) of parameter i's gradient as PowerSGD compresses it, or None when it is sent
        whole."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

        p = self.params[i]
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, self.state.matrix_approximation_rank)
        return (n, m, r) if _should_compress(n, m, r, self.state.min_compression_rate)[0] else None

    def _order(self, ids: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
        """(i, n, m, r) of a bucket's compressed matrices in the hook's order of P and Q: grouped by
        shape."""
        groups: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
        for i in ids:
            nmr = self._matrix(i)
            if nmr is not None:
                groups.setdefault(nmr[:2], []).append((i, *nmr))
        return [entry for group in groups.values() for entry in group]

    def _collect(self) -> None:
        """Read every bucket entry of the state out into the per-parameter memory."""
        st = self.state
        for b, ids in self.layout.items():
            if b in st.error_dict:
                at = 0
                for i in ids:
                    n = self.params[i].numel()
                    self.errors[i] = st.error_dict[b][at:at + n].clone()
                    at += n
            if b in st.q_memory_dict:
                at = 0
                for i, _, m, r in self._order(ids):
                    self.qs[i] = st.q_memory_dict[b][at:at + m * r].view(m, r).clone()
                    at += m * r

    def _drop(self) -> None:
        self.state.error_dict.clear()
        self.state.p_memory_dict.clear()
        self.state.q_memory_dict.clear()
        self.layout.clear()

    def _place(self, b: int, ids: tuple[int, ...]) -> None:
        """Make bucket b's entries hold parameters `ids` (a layout change first reads every entry
        out)."""
        if self.layout.get(b) == ids:
            return
        held = {i for held_ids in self.layout.values() for i in held_ids}
        if b in self.layout or held.intersection(ids):  # DDP rebuilt its buckets
            self._collect()
            self._drop()
        st, like = self.state, self.params[ids[0]]
        if any(i in self.errors for i in ids):  # else the hook starts the error at zero itself
            zero = [self.params[i].new_zeros(self.params[i].numel()) for i in ids]
            st.error_dict[b] = torch.cat([self.errors.get(i, z) for i,
                                          z in zip(ids, zero, strict=True)])
        order = self._order(ids)
        qs = [self.qs[i] if i in self.qs else _seeded(i, m, r, like.dtype) for i, _, m, r in order]
        st.q_memory_dict[b] = torch.cat([q.reshape(-1) for q in qs]) if qs else like.new_empty(0)
        # written before it is read
        st.p_memory_dict[b] = like.new_zeros(sum(n * r for _, n, _, r in order))
        self.layout[b] = ids


def _seeded(i: int, m: int, r: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(m, r, generator=torch.Generator().manual_seed(Q_SEED + i), dtype=dtype)
