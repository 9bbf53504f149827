"""The last encoder layer computes the first token only: the classifier reads nothing else.

BERT's pooler and the classification heads of RoBERTa, XLM-R and ELECTRA read the last layer's first
token ([CLS], <s>) and drop the rest. In that layer the other tokens still serve as keys and values
of the first token's attention, but their queries, attention outputs and feed-forward are computed
for nothing: 10 of the layer's 12 d^2-sized matrix products per token. Computing the first token
only removes 10/12 of one layer's work, forward and backward (a larger share the fewer layers a
model has), with the same numbers out up to float rounding (tests/unit/test_last_layer.py compares
logits and gradients with the stock layer). MosaicBERT does the same for its classification
fine-tuning (`subset_idx` in its last layer). Training steps only: evaluation runs the stock layer,
so a run's metrics are exactly what its saved model scores.

`install(model)` replaces the last layer's forward on that one instance: the parameters, their names
and the saved model are the stock ones, so `save_pretrained` and `pipeline()` see a plain model. A
family whose head reads more than the first token (ModernBERT's mean pooling, a decoder's last
token, DeBERTa's pooler over its own attention) keeps its layer, and `result.json`'s `last_layer`
says which ran.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from cpudist.train import dropout

# model_type of the families whose sequence classifier reads only the last layer's first token and
# whose layer has BERT's parts (attention.self.query/key/value, attention.output,
# feed_forward_chunk). Each is checked against the stock layer in tests/unit/test_last_layer.py; a
# family joins only with that test.
FIRST_TOKEN_HEADS = frozenset({"bert", "roberta", "xlm-roberta", "electra"})
# Attention implementations whose masks are tensors [batch, 1, queries, keys] (or None) that this
# layer can cut to the first query's row; dropout.ATTENTION (cpudist/train/dropout.py's) takes
# SDPA's masks.
MASKS_AS_TENSORS = frozenset({"sdpa", "eager", dropout.ATTENTION})


def _last_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The encoder's last layer when it has BERT's parts and no cross-attention; else None."""
    layers = [m for name, m in model.named_modules()
              if name.endswith("encoder.layer") and isinstance(m, torch.nn.ModuleList) and len(m)]
    if len(layers) != 1:
        return None
    layer = layers[0][-1]
    attention = getattr(layer, "attention", None)
    attn, output = getattr(attention, "self", None), getattr(attention, "output", None)
    if (attn is None or output is None or not hasattr(layer, "feed_forward_chunk")
            or getattr(layer, "add_cross_attention", False)):
        return None
    if not all(hasattr(attn, a)
               for a in ("query", "key", "value", "attention_head_size", "scaling")):
        return None
    return layer


def install(model: torch.nn.Module) -> bool:
    """Make the last layer compute the first token only, where the family's head reads nothing else;
    whether it did. Call after anything that swaps the model's attention implementation
    (cpudist/train/dropout.py)."""
    config = getattr(model, "config", None)
    if (getattr(config, "model_type", None) not in FIRST_TOKEN_HEADS
            or getattr(config, "_attn_implementation", None) not in MASKS_AS_TENSORS):
        return False
    layer = _last_layer(model)
    if layer is None:
        return False
    # this instance only: state_dict unchanged
    layer.forward = types.MethodType(_first_token_forward, layer)
    return True


def used(model: torch.nn.Module) -> str:
    """What the last layer computed: 'first-token' or 'full' (for result.json)."""
    layer = _last_layer(model)
    # set on the instance by install, not the class's
    bound = getattr(layer, "__dict__", {}).get("forward")
    return "first-token" if getattr(bound, "__func__", None) is _first_token_forward else "full"


def first_token_only_params(model: torch.nn.Module) -> int:
    """Parameters of the last layer that meet only the first token once installed (all but keys and
    values); 0 when the layer is the stock one. What cpudist/flops.py leaves out of the FLOPs a step
    does."""
    layer = _last_layer(model)
    if layer is None or used(model) != "first-token":
        return 0
    attn = layer.attention.self  # type: ignore[union-attr]
    keys_values: Any = (attn.key, attn.value)  # type: ignore[union-attr]
    every_token = {id(p) for m in keys_values for p in m.parameters()}
    return sum(p.numel() for p in layer.parameters() if id(p) not in every_token and p.dim() > 1)


def _first_token_forward(self: Any, hidden_states: torch.Tensor,
                         attention_mask: torch.Tensor | None = None,
                         *args: Any, **kwargs: Any) -> torch.Tensor:
    """The stock layer's forward for the first token alone: queries of token 0, keys and values of
    every token. In evaluation the stock forward runs: the metrics a run records are the saved
    model's, to the last bit, in anyone's transformers (rounding of the shorter matrix products
    differs, and a near-constant regression's Pearson amplifies that)."""
    if not self.training:
        return type(self).forward(self, hidden_states, attention_mask, *args, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.bert.modeling_bert import eager_attention_forward

    attn = self.attention.self
    batch, tokens = hidden_states.shape[:2]
    first = hidden_states[:, :1]
    query = attn.query(first).view(batch, 1, -1, attn.attention_head_size).transpose(1, 2)
    key = attn.key(hidden_states).view(batch, tokens, -1, attn.attention_head_size).transpose(1, 2)
    value = (attn.value(hidden_states).view(batch, tokens, -1, attn.attention_head_size)
             .transpose(1, 2))
    if attention_mask is not None and attention_mask.dim() == 4:
        # the first query's row (a [b, 1, 1, keys] mask is already)
        attention_mask = attention_mask[:, :, :1, :]
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                   eager_attention_forward)
    out, _ = attend(attn, query, key, value, attention_mask, dropout=attn.dropout.p
                    if attn.training else 0.0,
                    scaling=attn.scaling)
    out = self.attention.output(out.reshape(batch, 1, -1), first)
    return self.feed_forward_chunk(out)
