"""Where one fp32 training step of cpudist's bert-base goes on this CPU: torch.profiler's operators,
self time.

    python benchmarks/fp32_step_profile.py \
        > benchmarks/results/fp32-step-profile-bert-base-<cpu kind>.txt

The model as `cpudist run` trains it (random-init bert-base preset, cpudist's dropout and
first-token last layer, fused AdamW, 2 threads), one batch of 32 rows x 56 tokens (MRPC's rows are
~50 tokens). The question it answers: how much of a step lies outside the matrix products, i.e. how
far any non-GEMM lever could take it.
"""

from __future__ import annotations

import time

import torch

from cpudist.cpu import read_cpu
from cpudist.train import dropout, last_layer
from cpudist.train.models import build_model


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cpu = read_cpu()
    print(f"# CPU {cpu.model} ({cpu.kind}), torch {torch.__version__}, 2 threads, fp32")
    model = build_model("bert-base", 2, False, 0.1)
    dropout.install(model)
    last_layer.install(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(1000, 20000, (32, 56))
    mask, labels = torch.ones_like(ids), torch.randint(0, 2, (32,))

    def step() -> None:
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    started = time.perf_counter()
    step()
    print("step s", time.perf_counter() - started)
    with torch.profiler.profile() as prof:
        step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
