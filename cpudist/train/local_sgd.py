"""Local SGD and DiLoCo (`--sync local-sgd`): each rank steps alone, parameters are averaged every K
steps.

    cpudist run mrpc --np 4 --ppn 1 --hostfile hosts --sync local-sgd --sync-every 8 \\
        --outer-optimizer nesterov
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from cpudist.strategies import SyncSpec
from cpudist.train.exchange import Strategy, mean_, wire_dtype


class LocalSGD(Strategy):
    """Local steps; parameters averaged every K steps after `warmup_steps` synchronous ones (DiLoCo:
    via an outer Nesterov SGD on the averaged change). With --average-moments, AdamW's moments are
    averaged too; with --grad-compression bf16, what crosses the wire is bf16: each rank's change
    since the last average (small numbers, kept to bf16's 3 digits, added to the fp32 model) and the
    moments (fp16 would flush the second moment's 1e-10s to zero; bf16 has fp32's range)."""

    name = "local-sgd"

    def __init__(self, model: torch.nn.Module, spec: SyncSpec, world: int) -> None:
        super().__init__(model, spec, world)
        self.cap = spec.bucket_cap_mb * 1024 * 1024
        self.wire = wire_dtype(spec.grad_compression)  # bf16 or none: _local_check refuses the rest
        self.anchor: list[torch.Tensor] = []
        self.outer: torch.optim.Optimizer | None = None
        self.synced_at = 0
        # made so far (alike on every rank): every --second-moment-every J-th takes the second
        # moment
        self.averages = 0
        if spec.outer_optimizer == "nesterov" or self.wire is not None:
            self.anchor = [p.detach().clone() for p in self.trained]  # the model at the last sync
        if spec.outer_optimizer == "nesterov":
            self.outer = torch.optim.SGD(self.anchor, lr=spec.outer_lr,
                                         momentum=spec.outer_momentum,
                                         # torch's Nesterov needs a momentum
                                         nesterov=spec.outer_momentum > 0)

    def local_step(self, step: int) -> bool:
        return step > self.spec.local_sgd_warmup

    def gradients(self, step: int) -> None:
        if not self.local_step(step):  # warm-up: synchronous SGD
            mean_([p.grad for p in self.trained if p.grad is not None], self.world, self.clock,
                  self.cap)
        self.clock.end_step(overlapped=False)

    def parameters(self, step: int, final: bool = False) -> None:
        local = step - self.spec.local_sgd_warmup
        due = local % self.spec.sync_every == 0 or final  # final: the steps since the last average
        if local <= 0 or not due or step == self.synced_at:
            return
        self.synced_at = step
        self.averages += 1
        with torch.no_grad():
            mean = self._averaged()
            if self.outer is not None:
                for a, m in zip(self.anchor, mean, strict=True):
                    # the outer gradient: minus the averaged change since the last sync
                    a.grad = a - m
                self.outer.step()
                mean = self.anchor
            for p, m in zip(self.trained, mean, strict=True):
                if m.data_ptr() != p.data_ptr():  # averaged elsewhere than in place
                    p.data.copy_(m)
            if self.outer is None and self.anchor:  # the 16-bit wire's next changes start here
                for a, p in zip(self.anchor, self.trained, strict=True):
                    a.copy_(p)
        self.clock.end_step(overlapped=False)

    def _averaged(self) -> list[torch.Tensor]:
        """The ranks' mean model (their moments averaged in place on the way): in the parameters
        themselves, or, with a 16-bit wire, the last average plus the mean of the ranks' changes
        since."""
        if self.wire is None:
            params = [p.data for p in self.trained]
            mean_(params + self._moments(), self.world, self.clock, self.cap)
            return params
        changes = [p.data - a for p, a in zip(self.trained, self.anchor, strict=True)]
        mean_(changes + self._moments(), self.world, self.clock, self.cap, self.wire)
        return [c.add_(a) for c, a in zip(changes, self.anchor, strict=True)]

    def _moments(self) -> list[torch.Tensor]:
        """AdamW's moments to average with the parameters (--average-moments), in the parameters'
        order; the second one (an average of squared gradients over ~1000 steps, which K steps
        barely move) only at every --second-moment-every J-th average (J > 1 costs accuracy,
        benchmarks/README.md: an averaged first moment over a rank's own second moment steps
        badly)."""
        keys = {"none": (), "first": ("exp_avg",), "second": ("exp_avg_sq",),
                "both": ("exp_avg", "exp_avg_sq")}[self.spec.average_moments]
        if self.averages % self.spec.second_moment_every:
            keys = tuple(k for k in keys if k != "exp_avg_sq")
        if not keys or self.optimizer is None:
            return []
        state = self.optimizer.state
        return [state[p][k] for k in keys for p in self.trained if k in state.get(p, {})]

    def state(self) -> dict[str, Any]:
        """The last average (alike on every rank), DiLoCo's momentum, and which average comes
        next."""
        return {"anchor": [a.clone() for a in self.anchor], "averages": self.averages,
                "synced_at": self.synced_at,
                **({"outer": self.outer.state_dict()} if self.outer is not None else {})}

    def rank_state(self) -> dict[str, Any]:
        """Every rank's model and AdamW moments differ between averages (rank 0's are the
        checkpoint's own)."""
        if dist.get_rank() == 0 or self.optimizer is None:
            return {}
        return {"params": [p.detach().clone() for p in self.trained],
                "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict[str, Any], mine: dict[str, Any] | None) -> None:
        if mine:
            with torch.no_grad():
                for p, saved in zip(self.trained, mine["params"], strict=True):
                    p.copy_(saved)
            if self.optimizer is not None:
                self.optimizer.load_state_dict(mine["optimizer"])
        self.averages, self.synced_at = (int(state.get("averages", 0)),
                                         int(state.get("synced_at", 0)))
        if state.get("anchor"):
            for a, saved in zip(self.anchor, state["anchor"], strict=True):
                a.copy_(saved)
        # a checkpoint of format 1 holds the ranks' average: the model just restored is the last one
        elif self.anchor:
            for a, p in zip(self.anchor, self.trained, strict=True):
                a.copy_(p.data)
        if self.outer is not None and "outer" in state:
            self.outer.load_state_dict(state["outer"])
