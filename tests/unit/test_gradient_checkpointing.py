"""--gradient-checkpointing: every family's training step gives the same loss and gradients as
without it, dropout on (the recompute must replay the forward's masks, cpudist's fast dropout
included), and keeps far fewer bytes for backward. The bytes are counted with autograd's
saved-tensor hooks, not read from RSS: what the forward keeps for backward is what checkpointing
removes, and the count does not depend on the allocator or on what else runs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train import dropout as fd
from cpudist.train import last_layer, lora, speed
from cpudist.train.models import build_model
from tests.unit.test_architectures import FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py: tiny models


def _model(name: str, checkpointing: bool, peft: bool = False) -> torch.nn.Module:
    """The model as a run builds it (cpudist/train/setup.py's order), dropout 0.1 everywhere."""
    torch.manual_seed(0)
    model = build_model(name, 2, False, 0.1, pad_token_id=0)
    if checkpointing:
        speed.checkpoint_activations(model)
    if peft:
        # the adapters' dropout too (not the default): a recompute must replay its masks as well
        model = lora.apply(model,
                           TrainConfig(task="mrpc", output_dir="", model=name, peft="lora",
                                       lora_dropout=0.1))
    fd.install(model)
    last_layer.install(model)
    return model.train()


def _step(model: torch.nn.Module,
          batch: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor], int]:
    """(loss, gradients by name, bytes autograd kept for backward) of one training step from a fixed
    RNG state."""
    kept = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        # weights stay in memory anyway: activations are what is kept
        if not isinstance(t, torch.nn.Parameter):
            kept += t.numel() * t.element_size()
        return t

    torch.manual_seed(123)  # the dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, kept


def _layers(model: torch.nn.Module) -> int:
    config: Any = model.config
    return int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layers", 0))


# transformers has no activation checkpointing for ALBERT (its layers share weights in groups):
# refused in one line
UNSUPPORTED = ("tiny-albert",)


@pytest.mark.parametrize("name", [n for n in FAMILIES if n not in UNSUPPORTED])
def test_checkpointing_changes_no_gradient_and_keeps_fewer_bytes(
        name: str, batch: dict[str, torch.Tensor]) -> None:
    plain = _model(name, False)
    recomputed = _model(name, True)
    loss, grads, kept = _step(plain, batch)
    loss_c, grads_c, kept_c = _step(recomputed, batch)
    assert speed.checkpointed_layers(plain) == 0
    # Every layer, but the first-token last layer where it is installed (its own forward keeps its
    # activations)
    first_token = last_layer.used(recomputed) == "first-token"
    assert speed.checkpointed_layers(recomputed) == _layers(recomputed) - first_token > 0
    assert loss_c == loss
    assert grads_c.keys() == grads.keys() and len(grads) > 10
    for n, g in grads.items():  # the same ops on the same inputs and masks: equal, not merely close
        torch.testing.assert_close(grads_c[n], g, rtol=0, atol=0, msg=lambda m, n=n: f"{n}: {m}")
    # Two layers of hidden 32-64 on 8 short rows: the checkpointed layers keep only their inputs
    assert kept_c < 0.6 * kept, (kept_c, kept)


def test_dropout_is_on_so_a_mask_replayed_wrong_would_show(batch: dict[str, torch.Tensor]) -> None:
    """The equality above means something: a different mask (another RNG state) changes the loss."""
    model = _model("tiny", False)
    loss, _, _ = _step(model, batch)
    torch.manual_seed(7)
    assert model(**batch).loss.item() != loss


def test_lora_adapters_get_the_same_gradients_under_checkpointing(
        batch: dict[str, torch.Tensor]) -> None:
    """LoRA freezes the layers' inputs' producers: non-reentrant checkpointing must still carry
    their gradients."""
    loss, grads, kept = _step(_model("tiny", False, peft=True), batch)
    loss_c, grads_c, kept_c = _step(_model("tiny", True, peft=True), batch)
    assert loss_c == loss and grads_c.keys() == grads.keys()
    assert any("lora_A" in n for n in grads) and any("classifier" in n for n in grads)
    for n, g in grads.items():
        torch.testing.assert_close(grads_c[n], g, rtol=0, atol=0, msg=lambda m, n=n: f"{n}: {m}")
    assert kept_c < kept


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_a_family_without_checkpointing_is_refused_in_one_line(name: str) -> None:
    model = build_model(name, 2, False, 0.1, pad_token_id=0)
    # transformers' own flag: when it gains one, this test says so
    assert not model.supports_gradient_checkpointing
    with pytest.raises(BadInput,
                       match=r"--gradient-checkpointing: AlbertForSequenceClassification .*Drop"):
        speed.checkpoint_activations(model)
