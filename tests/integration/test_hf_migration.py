"""What a Hugging Face user brings: the blog's run_glue.py command line, run as written (plus the
offline data folder and a few steps), and a LoRA adapter reloaded with peft in a fresh
interpreter without the Hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import cpudist
from tests.integration.test_lora import tiny_base

pytestmark = pytest.mark.slow


def test_the_blogs_run_glue_command_line_runs(shared_data: Path, tmp_path: Path) -> None:
    base, out = tiny_base(tmp_path / "tiny"), tmp_path / "mrpc"
    r = cpudist("run", "--model_name_or_path", base, "--task_name", "mrpc", "--do_train", "--do_eval",
                "--max_seq_length", "128", "--per_device_train_batch_size", "32", "--learning_rate",
                "2e-5", "--num_train_epochs", "3", "--output_dir", out,
                "--data-dir", shared_data / "glue" / "MRPC", "--max_steps", "2",
                "--max_eval_samples", "32", env={"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads((out / "result.json").read_text())
    assert (result["task"], result["model"], result["max_seq_len"]) == ("mrpc", str(base), 128)
    assert (result["per_rank_batch_size"], result["lr"], result["steps"]) == (32, 2e-5, 2)
    assert set(result["metrics"]) == {"accuracy", "f1"} and (out / "model" / "config.json").is_file()


RELOAD = """
import json, sys
from peft import AutoPeftModelForSequenceClassification, PeftConfig, PeftModel
from transformers import AutoConfig, AutoModelForSequenceClassification
folder = sys.argv[1]
model = AutoPeftModelForSequenceClassification.from_pretrained(folder)
base = PeftConfig.from_pretrained(folder).base_model_name_or_path
labelled = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(
    base, config=AutoConfig.from_pretrained(folder)), folder)
print(json.dumps({"loaded": type(model).__name__, "labels": labelled.config.id2label,
                  "pad": labelled.config.pad_token_id}))
"""


def test_a_lora_adapter_reloads_offline_from_where_the_run_found_its_base(shared_data: Path,
                                                                          tmp_path: Path) -> None:
    base, out = tiny_base(tmp_path / "tiny"), tmp_path / "lora"
    r = cpudist("run", "mrpc", "--data-dir", shared_data / "glue" / "MRPC", "--model", base,
                "--peft", "lora", "--max-steps", "2", "--max-train-samples", "64",
                "--max-eval-samples", "32", "--batch-size", "8", "--output-dir", out,
                env={"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads((out / "result.json").read_text())
    trained, total = result["peft"]["trainable_params"], result["peft"]["total_params"]
    ready = f"({trained / 1e6:.2f}M trainable, {trained / total:.2%})"
    assert ready in r.stderr + r.stdout  # the ready line says the trainable share
    adapter = json.loads((out / "model" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(base.resolve())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-hf")}
    loaded = subprocess.run([sys.executable, "-c", RELOAD, str(out / "model")], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    said = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert said["loaded"] == "PeftModelForSequenceClassification"
    assert said["labels"] == {"0": "not_equivalent", "1": "equivalent"} and said["pad"] == 0
