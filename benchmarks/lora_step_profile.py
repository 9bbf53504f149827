"""Where a LoRA step's time goes beside full fine-tuning's: one MiniLM-sized BERT step (32 rows x 56 tokens, fp32,
plain transformers + peft, fused AdamW), median of 7 alternated steps, then torch.profiler's top operators.

    python benchmarks/lora_step_profile.py > benchmarks/results/lora-step-profile-<cpu kind>.txt

Arms: full fine-tuning; LoRA r 8 on every Linear (cpudist's default targets) with adapter dropout 0.1 (torch's own
dropout here, not cpudist's --fast-dropout) and with dropout 0.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertForSequenceClassification

from cpudist.cpu import read_cpu

CFG = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
ARMS = {"full": None, "lora": 0.1, "lora-dropout-0": 0.0}  # the adapters' dropout, None: no adapters


def make(dropout: float | None) -> tuple[Any, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model: Any = BertForSequenceClassification(CFG)
    if dropout is not None:
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout,
                                                 target_modules=["query", "key", "value", "dense"],
                                                 modules_to_save=["classifier"]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    return model, opt


def main() -> None:
    torch.set_num_threads(2)
    cpu = read_cpu()
    print(f"CPU: {cpu.model} ({cpu.kind}); torch {torch.__version__}; 2 threads")
    x, y = torch.randint(1000, 20000, (32, 56)), torch.randint(0, 2, (32,))

    def step(model: Any, opt: torch.optim.Optimizer) -> None:
        model(input_ids=x, labels=y).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    models = {arm: make(dropout) for arm, dropout in ARMS.items()}
    for model, opt in models.values():
        for _ in range(3):
            step(model, opt)
    times: dict[str, list[float]] = {arm: [] for arm in models}
    for _ in range(7):  # alternated, so drifts of the machine hit every arm alike
        for arm, (model, opt) in models.items():
            t = time.perf_counter()
            step(model, opt)
            times[arm].append(time.perf_counter() - t)
    for arm, ts in times.items():
        print(f"{arm}: {statistics.median(ts) * 1000:.0f} ms a step (median of 7; {min(ts) * 1000:.0f}-"
              f"{max(ts) * 1000:.0f})")
    for arm in ("full", "lora-dropout-0"):
        with torch.profiler.profile() as prof:
            step(*models[arm])
        print(f"\n{arm}\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
