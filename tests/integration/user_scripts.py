"""The users' scripts of issue 26's launch tests, one text each, shared by the tests that run them
on this machine (test_launch_trainer.py, test_launch_accelerate.py) and from the laptop namespace
(test_launch_script_remote.py), how every launch test's script leaves (LEAVE), and the patterns that
read their losses. Both need `accelerate` (the test extra): the tests that run them skip without it;
this module imports nothing of it."""

from __future__ import annotations

import re

# How every script of the launch tests leaves, appended after whatever a test adds to it: together,
# then without the interpreter's finalization, where torch's gloo threads abort a rank now and then
# even after destroy_process_group ("terminate called without an active exception", SIGABRT, exit
# 134: CI, stop 39, the DDP script's by-hand torchrun arm; the next try, the Accelerate loop from
# the laptop). The same happens to these scripts under torchrun or `accelerate launch` by hand;
# cpudist's trainer leaves by train.dist.exit_rank for the same reason, and a failed launch whose
# output shows the abort says this way out. What the tests compare is printed before it.
LEAVE = '''
import os as _os, sys as _sys
import torch.distributed as _dist
if _dist.is_initialized():
    _dist.barrier()
    _dist.destroy_process_group()
_sys.stdout.flush()
_sys.stderr.flush()
_os._exit(0)
'''
TRAINER_SCRIPT = '''"""An HF Trainer fine-tuning script as users write it: nothing in it knows
cpudist or torchrun."""
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
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long),
                "labels": self.labels[i]}


config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
torch.manual_seed(0)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=4, max_steps=4,
                         logging_steps=1, learning_rate=1e-3, report_to=[], use_cpu=True, seed=0,
                         save_strategy="no", disable_tqdm=True, ddp_backend="gloo")
trainer = Trainer(model=model, args=args, train_dataset=Rows())
result = trainer.train()
trainer.save_metrics("all", result.metrics)
# one write: see the loop's below
print(f"world {args.world_size} process {args.process_index}", flush=True)
'''
LOGGED = re.compile(r"\{'loss': '([0-9.]+)', 'grad_norm': '([0-9.]+)'")

ACCELERATE_SCRIPT = '''"""An Accelerate loop as its docs write it: nothing in it knows cpudist or
torchrun."""
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
# one write: under `accelerate launch` the workers share stdout, and with PYTHONUNBUFFERED (every
# cpudist rank's) print() writes each of its pieces on its own, so two workers' pieces interleaved
# (a failed check, once)
print(f"state {accelerator.distributed_type} {accelerator.num_processes} "
      f"{accelerator.process_index}", flush=True)
if accelerator.is_main_process:
    json.dump({"train_samples": 64, "final_loss": mean}, open("metrics.json", "w"))
'''
STEP = re.compile(r"step (\d+) loss ([0-9.]+)")


def accelerate_losses() -> list[float]:
    """ACCELERATE_SCRIPT's printed mean loss per step on 2 processes, worked out in one: Accelerate
    gives process i of 2 the batch 2k+i at step k (8 rows each, rows 16k to 16k+16 together), and
    DDP's mean gradient of two equal batches is the gradient of their mean loss, the loss of the 16
    rows."""
    import torch

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(4):
        loss = torch.nn.functional.mse_loss(model(x[16 * step:16 * step + 16]),
                                            y[16 * step:16 * step + 16])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out
