"""The users' scripts of issue 26's launch tests, one text each, shared by the tests that run them on this
machine (test_launch_trainer.py, test_launch_accelerate.py) and from the laptop namespace
(test_launch_script_remote.py), and the patterns that read their losses. Both need `accelerate` (the test
extra): the tests that run them skip without it; this module imports nothing of it."""

from __future__ import annotations

import re

TRAINER_SCRIPT = '''"""An HF Trainer fine-tuning script as users write it: nothing in it knows cpudist or torchrun."""
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Rows(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (32, 16), generator=g)
        self.labels = (self.ids[:, 0] > 50).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long), "labels": self.labels[i]}


config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=32, num_labels=2)
torch.manual_seed(0)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=4, max_steps=4, logging_steps=1,
                         learning_rate=1e-3, report_to=[], use_cpu=True, seed=0, save_strategy="no",
                         disable_tqdm=True, ddp_backend="gloo")
trainer = Trainer(model=model, args=args, train_dataset=Rows())
result = trainer.train()
trainer.save_metrics("all", result.metrics)
print("world", args.world_size, "process", args.process_index, flush=True)
'''
LOGGED = re.compile(r"\{'loss': '([0-9.]+)', 'grad_norm': '([0-9.]+)'")

ACCELERATE_SCRIPT = '''"""An Accelerate loop as its docs write it: nothing in it knows cpudist or torchrun."""
import json
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, loader = accelerator.prepare(model, opt, loader)
for step, (xb, yb) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    mean = accelerator.gather(loss.detach()[None]).mean().item()
    accelerator.print(f"step {step} loss {mean:.8f}")
print("state", accelerator.distributed_type, accelerator.num_processes, accelerator.process_index, flush=True)
if accelerator.is_main_process:
    json.dump({"train_samples": 64, "final_loss": mean}, open("metrics.json", "w"))
'''
STEP = re.compile(r"step (\d+) loss ([0-9.]+)")


def accelerate_losses() -> list[float]:
    """ACCELERATE_SCRIPT's printed mean loss per step on 2 processes, worked out in one: Accelerate gives process
    i of 2 the batch 2k+i at step k (8 rows each, rows 16k to 16k+16 together), and DDP's mean gradient of two equal
    batches is the gradient of their mean loss, the loss of the 16 rows."""
    import torch

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(4):
        loss = torch.nn.functional.mse_loss(model(x[16 * step:16 * step + 16]), y[16 * step:16 * step + 16])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out
