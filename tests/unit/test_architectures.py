"""Every model family cpudist offers a preset for trains, saves and reloads; and --fast-dropout's
attention is SDPA's for every family it is installed for (tests/unit/test_dropout.py checks the mask
itself).

Models are the small presets (2 layers, hidden 32 or 64, random weights) on MRPC rows, in this
process, no DDP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cpudist.train import dropout as fd
from cpudist.train.models import PRESETS, build_model, load_tokenizer

FAMILIES = ("tiny", "tiny-roberta", "tiny-xlm-roberta", "tiny-electra", "tiny-albert",
            "tiny-distilbert", "tiny-deberta-v3", "tiny-modernbert", "tiny-llama")
# Qwen2 has no preset (presets.py says why): tiny-llama's shape as a Qwen2 model, with and without a
# sliding window.
FAST = (*(n for n in FAMILIES if PRESETS[n]["model_type"] in fd.FAST_ATTENTION), "qwen2",
        "qwen2-sliding")
DECODERS = ("tiny-llama",)
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


def _dropouts(model: torch.nn.Module) -> list[float]:
    return [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]


def test_every_family_with_fast_attention_is_tested_here() -> None:
    """A family added to FAST_ATTENTION without a preset in FAMILIES would skip the SDPA equality
    below."""
    assert {PRESETS[n]["model_type"] if n in PRESETS else "qwen2"
            for n in FAST} == set(fd.FAST_ATTENTION)
    # its disentangled attention never calls the interface
    assert "deberta-v2" not in fd.FAST_ATTENTION


@pytest.mark.parametrize("name", FAMILIES)
def test_family_trains_pools_padding_and_round_trips(name: str, batch: dict[str, torch.Tensor],
                                                     tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(name, 2, False, None, pad_token_id=0)
    fd.install(model)  # as a run does by default
    # the tokenizer's: decoders pool the last token that is not padding
    assert model.config.pad_token_id == 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(8):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses  # the same 8 rows: a model that learns fits them

    model.eval()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**inputs).logits
        # the most padded row, alone: no padding at all
        short = int(batch["attention_mask"].sum(1).argmin())
        n = int(batch["attention_mask"][short].sum())
        alone = model(**{k: v[short:short + 1, :n] for k, v in inputs.items()}).logits
    # padding changes nothing (masks, last-token pooling)
    assert torch.allclose(logits[short], alone[0], atol=1e-5)

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model.save_pretrained(tmp_path)
    load_tokenizer(name, None).save_pretrained(tmp_path)  # as a run saves its model folder
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and loaded.config.pad_token_id == 0
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, logits)
    # The folder tokenizes as training did (AutoTokenizer may pick a class by model_type: a Qwen2
    # folder got Qwen2's tokenizer around BERT's vocabulary, which split words into letters)
    text = ["The quick brown fox jumps over the lazy dog's unbelievably long tail."]
    assert (AutoTokenizer.from_pretrained(tmp_path)(text)["input_ids"]
            == load_tokenizer(name, None)(text)["input_ids"])


@pytest.mark.parametrize("name", FAMILIES)
def test_dropout_option_reaches_every_dropout_of_the_family(name: str) -> None:
    """--dropout sets every dropout layer (decoders have none: their attention takes
    config.attention_dropout)."""
    for p in (0.0, 0.25):
        model = build_model(name, 2, False, p)
        found = set(_dropouts(model)) | ({model.config.attention_dropout} if name in DECODERS
                                         else set())
        # ModernBERT drops its attention Dropout at 0
        assert found == {p} or (p == 0.0 and found <= {p})


def _model(name: str, dropout: float) -> Any:
    """A preset through build_model, or tiny-llama's shape as Qwen2 ('qwen2-sliding': its second
    layer on a 4-token sliding window, as Qwen2 models with use_sliding_window)."""
    if not name.startswith("qwen2"):
        return build_model(name, 2, False, dropout, 0)
    from transformers import AutoConfig, AutoModelForSequenceClassification

    preset = {**PRESETS["tiny-llama"], "model_type": "qwen2", "attention_dropout": dropout}
    if name == "qwen2-sliding":
        preset.update(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    config = AutoConfig.for_model(preset.pop("model_type"), **preset, num_labels=2)
    assert config.layer_types[1] == ("sliding_attention" if name == "qwen2-sliding"
                                     else "full_attention")
    return AutoModelForSequenceClassification.from_config(config)


def _pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the model with fast dropout installed and every dropout at 1e-9, the same weights on SDPA
    without dropout).

    p = 1e-9 keeps every element (under 1/65536) yet sends training steps through `fd.attention`'s
    own path.
    """
    torch.manual_seed(1)
    reference = _model(name, 0.0)
    # modules copy their attention dropout at init: build, don't edit the config
    fast = _model(name, 1e-9)
    fast.load_state_dict(reference.state_dict())
    fd.install(fast)
    assert fd.attention_used(fast) == "cpudist-fast-dropout" and fd.attention_used(
        reference) == "sdpa"
    return fast.train(), reference.train()


def _eager_calls(model: Any, rows: dict[str, torch.Tensor]) -> tuple[Any, int]:
    """The model's output on `rows`, and how many attention calls took fd.attention's own path
    (dropout > 0)."""
    from transformers import AttentionInterface

    calls = []

    def counted(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls.append(module.training and float(kwargs.get("dropout", 0.0)) > 0)
        return fd.attention(module, *args, **kwargs)

    AttentionInterface.register(fd.ATTENTION, counted)
    try:
        return model(**rows), sum(calls)
    finally:
        AttentionInterface.register(fd.ATTENTION, fd.attention)


@pytest.mark.parametrize("name", FAST)
def test_fast_attention_trains_as_sdpa_does(name: str, batch: dict[str, torch.Tensor]) -> None:
    """Training forward and gradients equal SDPA's to 1e-5: padding, causal masks (also the one SDPA
    leaves to is_causal when nothing is padded), grouped-query heads, ModernBERT's and Qwen2's
    sliding windows."""
    lengths = batch["attention_mask"].sum(1)
    longest, n = int(lengths.argmax()), int(lengths.max())
    padded = batch
    # One row, no padding: models that need no mask beyond causality get none (SDPA's is_causal)
    unpadded = {k: v[longest:longest + 1, :n] if v.dim() == 2 else v[longest:longest + 1] for k,
                v in batch.items()}
    assert int(lengths.min()) < n and n > 20  # padding, and rows longer than every window above
    fast, reference = _pair(name)
    for rows in (padded, unpadded):
        outs = []
        for model in (fast, reference):
            model.zero_grad()
            out, eager = _eager_calls(model, rows)
            # the path under test ran
            assert eager == (model.config.num_hidden_layers if model is fast else 0)
            out.loss.backward()
            outs.append((out.logits,
                         {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        (fast_logits, fast_grads), (ref_logits, ref_grads) = outs
        assert torch.allclose(fast_logits, ref_logits, atol=1e-5)
        assert fast_grads.keys() == ref_grads.keys()
        for n, g in ref_grads.items():
            assert torch.allclose(fast_grads[n], g, atol=1e-5), n


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "is_causal") and hasattr(m, "config")]


@pytest.mark.parametrize("name", FAST)
def test_fast_attention_drops_at_its_rate_with_the_right_gradient(name: str) -> None:
    """On the family's own attention module (its heads, key/value groups, causality): the output and
    gradients are softmax, then the mask keep_mask draws (kept at 1 - p, scaled by 1/keep), then
    times the values."""
    model = _model(name, 0.0).train()
    module = _attention_modules(model)[0]
    cfg: Any = model.config
    heads = cfg.num_attention_heads if hasattr(cfg, "num_attention_heads") else cfg.n_heads
    groups = int(getattr(module, "num_key_value_groups", 1))
    dim = (cfg.hidden_size if hasattr(cfg, "hidden_size") else cfg.dim) // heads
    torch.manual_seed(3)
    q = torch.randn(2, heads, 40, dim, requires_grad=True)
    k, v = (torch.randn(2, heads // groups, 40, dim, requires_grad=True) for _ in range(2))
    keep = torch.ones(2, 1, 40, 40, dtype=torch.bool)
    keep[1, :, :, 30:] = False  # padding of the second row
    if module.is_causal:
        keep = keep & torch.ones(40, 40, dtype=torch.bool).tril()
    p, scaling = 0.3, dim**-0.5
    torch.manual_seed(11)
    out, _ = fd.attention(module, q, k, v, keep, scaling=scaling, dropout=p)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))

    torch.manual_seed(11)  # the same draw: attention's only use of the generator is this mask
    mask, kept = fd.keep_mask(torch.Size((2, heads, 40, 40)), p)
    assert abs(mask.float().mean().item() - (1 - p)) < 0.02 and abs(kept - (1 - p)) < 1e-4
    k2, v2 = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    scores = (q @ k2.transpose(2, 3) * scaling).masked_fill(~keep, float("-inf"))
    expected = ((F.softmax(scores, -1) * mask / kept) @ v2).transpose(1, 2)
    assert torch.allclose(out, expected, atol=1e-5)
    for got, want in zip(grads, torch.autograd.grad(expected.square().sum(), (q, k, v)),
                         strict=True):
        assert torch.allclose(got, want, atol=1e-4)


def test_deberta_keeps_its_own_attention_with_the_cheaper_dropout() -> None:
    model = build_model("tiny-deberta-v3", 2, False, 0.1)
    swapped = fd.install(model)
    # not routed: its disentangled attention is its own code
    assert fd.attention_used(model) == "eager"
    assert swapped > 0 and not any(type(m) is torch.nn.Dropout for m in model.modules())


def test_hub_decoder_without_pad_gets_the_tokenizers(tmp_path: Path) -> None:
    """A decoder checkpoint (and its tokenizer) without a pad token: the tokenizer pads with EOS and
    the model is told the pad id, so batches of more than one row can be pooled (transformers
    refuses them otherwise)."""
    model = build_model("tiny-llama", 2, False, None)
    model.config.pad_token_id = None
    model.save_pretrained(tmp_path)
    tok = load_tokenizer("tiny", None)
    tok.pad_token, tok.eos_token = None, "[SEP]"
    tok.save_pretrained(tmp_path)
    assert load_tokenizer(str(tmp_path), None).pad_token == "[SEP]"
    assert build_model(str(tmp_path), 2, False, None, pad_token_id=102).config.pad_token_id == 102


# Parameters of the encoder (no head), in millions, as the checkpoints' model cards give them.
REAL_SIZES = {"minilm-l6": 22.7, "bert-base": 110, "bert-large": 335, "distilbert-base": 66,
              "modernbert-base": 149, "modernbert-large": 395, "deberta-v3-base": 184}


@pytest.mark.parametrize(("name", "millions"), REAL_SIZES.items())
def test_real_size_presets_have_their_checkpoints_shape(name: str, millions: float) -> None:
    """Built on the meta device (no memory, no init): a wrong width, depth or vocabulary changes the
    count."""
    from transformers import AutoConfig, AutoModel

    from cpudist.train.presets import PRETRAINED

    assert name in PRETRAINED  # the Hub id whose pretrained weights this shape is
    preset = dict(PRESETS[name])
    with torch.device("meta"):
        model = AutoModel.from_config(AutoConfig.for_model(preset.pop("model_type"), **preset))
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, rel=0.01)
