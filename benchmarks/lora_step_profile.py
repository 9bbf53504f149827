"""Where a LoRA step's time goes beside full fine-tuning's: one BERT step (32 rows x 56 tokens,
transformers + peft, fused AdamW), median of 7 alternated steps, then torch.profiler's top operators
of each arm.

    python benchmarks/lora_step_profile.py > benchmarks/results/lora-step-profile-<cpu kind>.txt
    python benchmarks/lora_step_profile.py --preset bert-base --precision bf16 --threads 4 \
        --fast-dropout

Defaults: the MiniLM-sized preset in fp32 on 2 threads with torch's own dropout. `--precision bf16`
trains under bf16 autocast as cpudist's loop does; `--fast-dropout` swaps every dropout (the
adapters' included) for cpudist's (`cpudist.train.dropout.install`, `cpudist run`'s default).

Arms: full fine-tuning; LoRA r 8 on every Linear (cpudist's default targets) with adapter dropout
0.1 (torch's own dropout here, not cpudist's --fast-dropout) and with dropout 0.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertForSequenceClassification

from cpudist.cpu import read_cpu

PRESETS = {"minilm": BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                intermediate_size=1536),
           "bert-base": BertConfig()}
# the adapters' dropout, None: no adapters
ARMS = {"full": None, "lora": 0.1, "lora-dropout-0": 0.0}


def make(config: BertConfig, dropout: float | None,
         fast: bool) -> tuple[Any, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model: Any = BertForSequenceClassification(config)
    if dropout is not None:
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout,
                                                 target_modules=["query", "key", "value", "dense"],
                                                 modules_to_save=["classifier"]))
    if fast:
        from cpudist.train import dropout as fast_dropout
        fast_dropout.install(model)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    return model, opt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="minilm")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fast-dropout", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = read_cpu()
    print(f"CPU: {cpu.model} ({cpu.kind}); torch {torch.__version__}; {args.threads} threads; "
          f"{args.preset}, {args.precision}, {'cpudist' if args.fast_dropout else 'torch'} dropout")
    x, y = torch.randint(1000, 20000, (32, 56)), torch.randint(0, 2, (32,))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step(model: Any, opt: torch.optim.Optimizer) -> None:
        with autocast:
            loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    models = {arm: make(PRESETS[args.preset], dropout, args.fast_dropout) for arm,
              dropout in ARMS.items()}
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
        print(f"{arm}: {statistics.median(ts) * 1000:.0f} ms a step (median of 7; "
              f"{min(ts) * 1000:.0f}-{max(ts) * 1000:.0f})")
    for arm in models:
        with torch.profiler.profile() as prof:
            step(*models[arm])
        print(f"\n{arm}\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
