"""Model presets: architectures with random weights, for speed runs and tests (no Hub needed).

    cpudist run mrpc --np 2 --data-dir ../shared/data/glue/MRPC --model tiny-modernbert \\
        --max-steps 5

Every preset borrows BERT's uncased tokenizer (the offline MiniLM's), so the small ones keep its
vocabulary size and all of them its special token ids (pad 0, [CLS] 101, [SEP] 102). The real-size
ones keep their checkpoint's shapes (parameter counts, vocabulary) for speed and memory runs;
`PRETRAINED` names the checkpoint whose pretrained weights `--model <hub id>` loads.
"""

from __future__ import annotations

from typing import Any

_BERT_IDS = {"pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102}
_SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 64, "vocab_size": 30522, **_BERT_IDS}
# Decoders: 4 query heads sharing 2 key/value heads, so grouped-query attention is exercised.
_SMALL_DECODER = {**_SMALL, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "intermediate_size": 128, "max_position_embeddings": 512}
# DeBERTa-v3's disentangled attention (microsoft/deberta-v3-base's config.json).
_DEBERTA_V3 = {"model_type": "deberta-v2", "relative_attention": True, "position_buckets": 256,
               "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
               "position_biased_input": False, "max_relative_positions": -1, "type_vocab_size": 0,
               "layer_norm_eps": 1e-7}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 64},
    "minilm-l6": {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6,
                  "num_attention_heads": 12, "intermediate_size": 1536},
    "bert-base": {"model_type": "bert"},
    "bert-large": {"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
                   "num_attention_heads": 16, "intermediate_size": 4096},
    "distilbert-base": {"model_type": "distilbert"},
    "modernbert-base": {"model_type": "modernbert", **_BERT_IDS, "cls_token_id": 101,
                        "sep_token_id": 102},
    "modernbert-large": {"model_type": "modernbert", "hidden_size": 1024, "num_hidden_layers": 28,
                         "num_attention_heads": 16, "intermediate_size": 2624, **_BERT_IDS,
                         "cls_token_id": 101, "sep_token_id": 102},
    "deberta-v3-base": {**_DEBERTA_V3, "hidden_size": 768, "num_hidden_layers": 12,
                        "num_attention_heads": 12,
                        "intermediate_size": 3072, "vocab_size": 128100, **_BERT_IDS},
    # One small random model per family (2 layers, hidden 32 or 64), for tests and quick runs.
    "tiny-roberta": {"model_type": "roberta", **_SMALL},
    "tiny-xlm-roberta": {"model_type": "xlm-roberta", **_SMALL},
    "tiny-electra": {"model_type": "electra", **_SMALL, "embedding_size": 32},
    "tiny-albert": {"model_type": "albert", **_SMALL, "embedding_size": 16},
    "tiny-distilbert": {"model_type": "distilbert", "dim": 32, "n_layers": 2, "n_heads": 2,
                        "hidden_dim": 64, "vocab_size": 30522, "pad_token_id": 0},
    "tiny-deberta-v3": {**_DEBERTA_V3, **_SMALL},
    # local_attention 16: rows longer than 8 tokens meet the sliding window of ModernBERT's local
    # layers.
    "tiny-modernbert": {"model_type": "modernbert", **_SMALL, "local_attention": 16,
                        "global_attn_every_n_layers": 2, "cls_token_id": 101, "sep_token_id": 102},
    # No Qwen2 preset: transformers' AutoTokenizer loads every folder of model_type qwen2 with
    # Qwen2's own tokenizer class, so a saved Qwen2 preset would not tokenize as BERT's tokenizer
    # did in training. Qwen2 checkpoints from the Hub (Qwen/Qwen2.5-0.5B) carry their own tokenizer
    # and train as a Llama does.
    "tiny-llama": {"model_type": "llama", **_SMALL_DECODER},
}

# The Hub checkpoints whose architecture a preset copies: give the id to --model for their
# pretrained weights.
PRETRAINED: dict[str, str] = {
    "minilm-l6": "sentence-transformers/all-MiniLM-L6-v2",
    "bert-base": "google-bert/bert-base-uncased",
    "bert-large": "google-bert/bert-large-uncased",
    "distilbert-base": "distilbert/distilbert-base-uncased",
    "modernbert-base": "answerdotai/ModernBERT-base",
    "modernbert-large": "answerdotai/ModernBERT-large",
    "deberta-v3-base": "microsoft/deberta-v3-base",
}
