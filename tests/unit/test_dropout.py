"""The cheaper dropout keeps torch's contract: rate, unbiased scale, gradient, seeding, and
attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpudist.train import dropout as fd
from cpudist.train.models import build_model


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_rate_and_unbiased_scale(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(400_000)
    y = fd.dropout(x, p)
    kept = (y != 0).float().mean().item()
    assert abs(kept - (1 - p)) < 0.005
    assert abs(y.mean().item() - 1.0) < 0.01  # kept elements scaled by 1/keep: the expectation is x
    # each 16-bit lane of a 64-bit draw is uniform (random_() alone would bias one)
    for lane in range(4):
        assert abs((y.view(-1, 4)[:, lane] != 0).float().mean().item() - (1 - p)) < 0.01


def test_gradient_is_the_same_mask_and_scale() -> None:
    torch.manual_seed(1)
    x = torch.randn(1000, requires_grad=True)
    y = fd.dropout(x, 0.2)
    y.sum().backward()
    assert x.grad is not None
    assert torch.allclose(x.grad, torch.where(y != 0, 1 / 0.8, 0.0))


def test_seeded_like_torch_and_off_outside_training() -> None:
    x = torch.randn(5000)
    torch.manual_seed(7)
    a = fd.dropout(x, 0.1)
    torch.manual_seed(7)
    assert torch.equal(a, fd.dropout(x, 0.1))
    assert fd.dropout(x, 0.1, training=False) is x and fd.dropout(x, 0.0) is x


def test_attention_equals_sdpa_when_nothing_is_dropped() -> None:
    """The eager path of training steps computes SDPA's attention (keep-all mask: p below
    1/65536)."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    keep[0, :, :, 4:] = False  # padding of the first row
    module = torch.nn.Linear(1, 1)  # anything in training mode
    out, _ = fd.attention(module, q, k, v, keep, dropout=1e-9)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-5)
    additive = torch.zeros(2, 1, 6, 6).masked_fill(~keep, torch.finfo(torch.float32).min)
    out2, _ = fd.attention(module, q, k, v, additive, dropout=1e-9)
    assert torch.allclose(out2, ref, atol=1e-5)


def test_install_swaps_every_dropout_and_keeps_evaluation() -> None:
    torch.manual_seed(3)
    model = build_model("tiny", 2, False, None)
    reference = build_model("tiny", 2, False, None)
    reference.load_state_dict(model.state_dict())
    assert fd.install(model) == sum(isinstance(m, torch.nn.Dropout) for m in reference.modules())
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    ids = torch.randint(1000, 3000, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    model.eval()
    reference.eval()
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits,
                              reference(input_ids=ids, attention_mask=mask).logits, atol=1e-6)
    model.train()
    loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_keeps_a_bool_mask_and_the_numbers_of_a_float_one(dtype: torch.dtype) -> None:
    """What the forward holds for backward is the bool mask (1 byte an element, as torch's dropout),
    and output and gradient equal, bit for bit, the former x * (keep * scale) with the scale in x's
    dtype."""
    x = torch.randn(64, 300, dtype=dtype, requires_grad=True)
    saved: list[torch.Tensor] = []
    torch.manual_seed(3)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = fd.dropout(x, 0.1)
    # a bool per element, a scalar
    assert sum(t.numel() * t.element_size() for t in saved) <= x.numel() + 16
    grad = torch.randn_like(x)
    y.backward(grad)
    torch.manual_seed(3)
    keep, kept = fd.keep_mask(x.shape, 0.1)
    scaled = keep.to(dtype) * (1.0 / kept)
    assert torch.equal(y, x.detach() * scaled)
    assert x.grad is not None and torch.equal(x.grad, grad * scaled)


def test_words_follow_torchs_generator_state_and_fill_every_lane() -> None:
    """Long draws come from numpy's SFC64 seeded by torch's default generator, short ones from
    torch's: either way torch.manual_seed and a checkpoint's saved RNG state give the same words
    again, two draws in a row differ, and every 16-bit lane (the top one included) is uniform."""
    for n in (300_001, fd.SFC64_FROM - 1):
        torch.manual_seed(11)
        first, second = fd.random_words(n), fd.random_words(n)
        assert not torch.equal(first, second)
        torch.manual_seed(11)
        assert torch.equal(fd.random_words(n), first)
        state = torch.get_rng_state()
        after = fd.random_words(n)
        torch.set_rng_state(state)
        assert torch.equal(fd.random_words(n), after)
        words = first if n > fd.SFC64_FROM else torch.cat([fd.random_words(n) for _ in range(40)])
        lanes = words.view(torch.int16).view(-1, 4)
        # each signed 16-bit lane uniform: half of it negative, a quarter under -16384
        for lane in range(4):
            values = lanes[:, lane]
            assert abs((values < 0).float().mean().item() - 0.5) < 0.01, (n, lane)
            assert abs((values < -16384).float().mean().item() - 0.25) < 0.01, (n, lane)
