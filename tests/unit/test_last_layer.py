"""The first-token last layer (cpudist/train/last_layer.py) gives the stock model's logits, loss and
gradients, computes the last layer's feed-forward for one token per row, and leaves the saved model
a plain one.

Small random presets of every family it is installed for, on MRPC pairs padded to the longest
(padding masked), with each attention it runs under (SDPA, eager, cpudist's fast-dropout attention),
in this process.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from cpudist.train import dropout as fd
from cpudist.train import last_layer
from cpudist.train.models import PRESETS, build_model

FIRST_TOKEN = ("tiny", "tiny-roberta", "tiny-xlm-roberta", "tiny-electra")
OTHERS = ("tiny-albert", "tiny-distilbert", "tiny-deberta-v3", "tiny-modernbert", "tiny-llama")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


def test_the_families_are_those_with_a_preset() -> None:
    assert {PRESETS[n]["model_type"] for n in FIRST_TOKEN} == set(last_layer.FIRST_TOKEN_HEADS)


def _twins(preset: str, attention: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    stock = build_model(preset, 2, False, 0.0)
    stock.config._attn_implementation = attention
    return stock, copy.deepcopy(stock)


def _step(model: torch.nn.Module,
          batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()  # dropout 0: training mode, with the training-mode attention path, and no noise
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                 if p.grad is not None}


@pytest.mark.parametrize("attention", ["sdpa", "eager", "fast-dropout"])
@pytest.mark.parametrize("preset", FIRST_TOKEN)
def test_logits_and_gradients_are_the_stock_layers(preset: str, attention: str,
                                                   batch: dict[str, torch.Tensor]) -> None:
    stock, first = _twins(preset, "sdpa" if attention == "fast-dropout" else attention)
    if attention == "fast-dropout":
        fd.install(stock)
        fd.install(first)
        assert fd.attention_used(first) == "cpudist-fast-dropout"
    assert last_layer.install(first) and last_layer.used(first) == "first-token"
    assert last_layer.used(stock) == "full"
    rows: list[int] = []
    feed_forward = first.base_model.encoder.layer[-1].intermediate.dense
    hook = feed_forward.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[1]))
    logits, grads = _step(first, batch)
    hook.remove()
    assert rows == [1]  # the last layer's feed-forward ran on the first token only
    want_logits, want_grads = _step(stock, batch)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    # every parameter still trains (DDP needs every gradient)
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    first.eval()
    stock.eval()
    # evaluation runs the stock layer: the same bits as the saved model anywhere
    with torch.no_grad():
        assert torch.equal(first(**batch).logits, stock(**batch).logits)


@pytest.mark.parametrize("preset", OTHERS)
def test_heads_that_read_more_than_the_first_token_keep_their_layer(preset: str) -> None:
    model = build_model(preset, 2, False, 0.0)
    assert not last_layer.install(model) and last_layer.used(model) == "full"


def test_the_saved_model_is_a_plain_one(batch: dict[str, torch.Tensor], tmp_path: Path) -> None:
    _, first = _twins("tiny", "sdpa")
    keys = list(first.state_dict())
    last_layer.install(first)
    assert list(first.state_dict()) == keys
    first.save_pretrained(tmp_path / "model")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model").eval()
    assert last_layer.used(loaded) == "full"
    first.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, first(**batch).logits, rtol=1e-5,
                                   atol=1e-5)


def test_the_flops_left_out_are_the_ones_torch_counts_as_skipped() -> None:
    """cpudist/flops.py's count of the skipped work equals what torch's FlopCounterMode sees vanish
    from a forward pass (rows of one length: no padding, which the count leaves out and torch
    counts). Eager attention: its matrix products are torch's to count (the CPU SDPA kernel is not
    among the operators it counts)."""
    from torch.utils.flop_counter import FlopCounterMode

    from cpudist.flops import shape_of, training_flops

    stock, first = _twins("tiny", "eager")
    last_layer.install(first)
    config = first.config
    hidden, inner = config.hidden_size, config.intermediate_size
    # query, out, FFN
    assert last_layer.first_token_only_params(first) == 2 * hidden * hidden + 2 * hidden * inner
    assert last_layer.first_token_only_params(stock) == 0
    batch, length = 4, 24
    ids = torch.randint(5, config.vocab_size, (batch, length))

    def forward_flops(model: torch.nn.Module) -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            # a training step's forward (dropout 0): where the layer computes less
            model.train()(input_ids=ids)
        return counter.get_total_flops()

    seen = forward_flops(stock) - forward_flops(first)
    full = shape_of(stock)
    skipping = type(full)(full.non_embedding_params, full.layers, full.hidden,
                          last_layer.first_token_only_params(first))
    counted = (training_flops(full, [length] * batch)
               - training_flops(skipping, [length] * batch)) / 3
    assert seen > 0 and counted == seen
