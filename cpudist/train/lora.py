"""`--peft lora`: low-rank adapters through Hugging Face's peft; the classifier head trains in full.

    cpudist run mrpc --np 4 --ppn 1 --hostfile hosts \\
        --model sentence-transformers/all-MiniLM-L6-v2 --peft lora

Only the adapters and the head require gradients, so every --sync strategy exchanges only them (DDP
all-reduces the parameters that require a gradient; the others average `Strategy.trained`), and
cpudist/traffic.py, which counts the shapes of the trained parameters, expects only their bytes. The
saved model is the adapter (`PeftModel.save_pretrained`: adapter_config.json and
adapter_model.safetensors, beside the run's config.json with its labels and the tokenizer), or with
--merge-lora the adapters merged into a plain model that `pipeline()` loads. A preset's base weights
are random and saved nowhere else, so its model is always saved merged.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpudist.config import TrainConfig
from cpudist.errors import BadInput

if TYPE_CHECKING:
    import torch

METHODS = ("none", "lora")
# what peft's save_pretrained writes: its presence marks an adapter folder
ADAPTER_CONFIG = "adapter_config.json"
# LoRA's default targets: every Linear of the encoder (the attention's query, key, value and output
# projections, both feed-forward layers), by the names each family gives them: every Linear matched
# full fine-tuning where query and value alone, as the LoRA paper adapts them, lost accuracy
# (benchmarks/accuracy_scaling.py); QLoRA found the same for every Linear. The head's Linears are
# not among them: peft never puts an adapter inside a module it trains in full (the classifier,
# HEADS below), so `dense` adapts the layers' dense projections and not BERT's pooler or RoBERTa's
# classifier.dense. A family not named here takes peft's own table
# (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: query and value projections).
ENCODER = ("query", "key", "value", "dense")
DECODER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OWN_TARGETS: dict[str, tuple[str, ...]] = {
    "bert": ENCODER, "roberta": ENCODER, "xlm-roberta": ENCODER, "electra": ENCODER,
    "albert": (*ENCODER, "ffn", "ffn_output"),
    "distilbert": ("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"),
    "modernbert": ("Wqkv", "Wo", "Wi"),
    "deberta-v2": ("query_proj", "key_proj", "value_proj", "dense"),
    "qwen2": DECODER, "llama": DECODER, "mistral": DECODER,
}
# The head beyond peft's SEQ_CLS defaults (`classifier`, `score`), as full fine-tuning trains it:
# DistilBERT's pre_classifier, DeBERTa's pooler (not in its checkpoints: new weights), ModernBERT's
# prediction head, and BERT's and ALBERT's pooler (the dense + tanh their classifier reads;
# RoBERTa's and ELECTRA's equivalent dense lies inside their `classifier` already, so it always
# trained).
HEADS: dict[str, tuple[str, ...]] = {"distilbert": ("pre_classifier",), "deberta-v2": ("pooler",),
                                     "modernbert": ("head",), "bert": ("pooler",),
                                     "albert": ("pooler",)}
# the LoRA knobs and their defaults, TrainConfig's (the CLI's options show these)
DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                            if f.name.startswith("lora_") or f.name == "merge_lora"}
# a checkpoint's model holds these adapters and fully trained modules
SAME_RUN = ("peft", "lora_r", "lora_alpha", "lora_targets", "lora_modules_to_save")


def check(cfg: Any) -> None:
    """--peft and its knobs: refused before any rank starts where they cannot mean what they say."""
    if cfg.peft not in METHODS:
        raise BadInput(f"--peft {cfg.peft}: unknown", f"Use one of: {', '.join(METHODS)}")
    if cfg.peft == "none":
        given = [k for k, v in DEFAULTS.items() if getattr(cfg, k) != v]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise BadInput(f"{flag} applies to --peft lora only",
                           f"Add --peft lora, or drop {flag}")
        return
    if cfg.lora_r < 1 or cfg.lora_alpha <= 0 or not 0 <= cfg.lora_dropout < 1:
        raise BadInput(f"--lora-r {cfg.lora_r} --lora-alpha {cfg.lora_alpha} --lora-dropout "
                       f"{cfg.lora_dropout}: out of range",
                       "Give --lora-r >= 1, --lora-alpha > 0 and 0 <= --lora-dropout < 1")
    if cfg.freeze_embeddings:  # LoRA freezes every base weight already
        raise BadInput("--freeze-embeddings with --peft lora: LoRA trains no embedding anyway",
                       "Drop --freeze-embeddings")
    if cfg.merge_lora and cfg.save_model == "none":
        raise BadInput("--merge-lora with --save-model none: no model is saved to merge",
                       "Drop --merge-lora, or save a model (--save-model last|best)")


def check_resume(saved: Mapping[str, Any], cfg: Any, path: Path) -> None:
    """Refuse a checkpoint whose model holds other adapters (or none) than this run asks for."""
    mine = {k: getattr(cfg, k) for k in SAME_RUN}
    # older checkpoints: no LoRA
    theirs = {k: saved.get(k, "none" if k == "peft" else mine[k]) for k in SAME_RUN}
    # JSON's lists: the config's tuples
    theirs = {k: tuple(v) if isinstance(v, list) else v for k, v in theirs.items()}
    # the default of the version that wrote it: the weights' names decide (saver.py)
    if theirs["lora_targets"] == ():
        theirs["lora_targets"] = mine["lora_targets"]
    if theirs["peft"] == mine["peft"] == "none":
        return
    differ = [f"{k}: {theirs[k]!r} there, {mine[k]!r} here" for k in SAME_RUN
              if theirs[k] != mine[k]]
    if differ:
        raise BadInput(f"checkpoint {path} holds another model ({'; '.join(differ)})",
                       "Resume with the --peft and --lora-* options of the run that wrote it")


def targets_for(model_type: str, given: tuple[str, ...]) -> tuple[str, ...]:
    """The modules LoRA adapts: --lora-targets, else every Linear of the family's layers
    (OWN_TARGETS)."""
    if given:
        return given
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    found = OWN_TARGETS.get(model_type) or tuple(PEFT_TARGETS.get(model_type, ()))
    if not found:
        raise BadInput(f"--peft lora: no default LoRA target modules for model type '{model_type}'",
                       "Name the attention's projection modules with --lora-targets, e.g. "
                       "--lora-targets q_proj,v_proj")
    return found


def modules_to_save(model_type: str, given: tuple[str, ...]) -> tuple[str, ...]:
    """The modules trained in full beside the adapters and the classifier (which peft's SEQ_CLS task
    always trains): --lora-modules-to-save, else the rest of the family's head."""
    return given or HEADS.get(model_type, ())


def head_pattern(model_type: str) -> str:
    """The Linears of the family's head, as peft's exclude_modules (a full match on a module's
    name): the default targets adapt the layers only, also where --lora-modules-to-save leaves a
    head module frozen (BERT's pooler.dense is a `dense` too)."""
    names = "|".join(sorted({"classifier", "score", *HEADS.get(model_type, ())}))
    return rf"(.*\.)?({names})(\..*)?"


def apply(model: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """The model with LoRA adapters on its targets and a fully trained head; everything else
    frozen."""
    try:
        from peft import LoraConfig, TaskType, get_peft_model
    except ImportError as e:
        raise BadInput(f"--peft lora: peft does not import here ({e})",
                       "pip install -c constraints.txt 'cpudist[lora]' where the ranks run") from e
    model_type = str(getattr(model.config, "model_type", ""))
    targets = targets_for(model_type, tuple(cfg.lora_targets))
    to_save = list(modules_to_save(model_type, tuple(cfg.lora_modules_to_save)))
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                        lora_dropout=cfg.lora_dropout, target_modules=list(targets),
                        modules_to_save=to_save or None,
                        exclude_modules=None if cfg.lora_targets else head_pattern(model_type))
    try:
        # peft 0.21 asks transformers 5 the deprecated name on every rank
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                    category=FutureWarning)
            peft_model = get_peft_model(model, config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise BadInput(f"--peft lora: {e}",
                       "Give --lora-targets names of Linear modules of this model") from e
    return peft_model


def settings(model: torch.nn.Module, cfg: Any) -> dict[str, Any]:
    """What result.json records of the adapters: the options, the modules and the parameter
    counts."""
    if cfg.peft == "none":
        return {}
    peft_config: Any = model.peft_config["default"]  # type: ignore[index]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"method": "lora", "r": cfg.lora_r, "alpha": cfg.lora_alpha, "dropout": cfg.lora_dropout,
            "targets": sorted(peft_config.target_modules),
            "modules_to_save": sorted(peft_config.modules_to_save or ()),
            "trainable_params": trainable, "total_params": total, "merged": merged(cfg)}


def merged(cfg: Any) -> bool:
    """Whether the saved model is the merged plain model (--merge-lora, or a preset's random base)
    or the adapter."""
    from cpudist.train.models import PRESETS

    return bool(cfg.merge_lora or cfg.model in PRESETS)


def save(model: torch.nn.Module, folder: Path, state: dict[str, Any] | None, cfg: Any) -> None:
    """Write the adapter (with the base's config.json: labels, problem type), or the merged plain
    model."""
    if state is not None:  # --save-model best: that evaluation's weights, adapters and head
        model.load_state_dict(state)
    if not merged(cfg):
        from cpudist.train.models import resolve_model

        peft_config: Any = model.peft_config["default"]  # type: ignore[index]
        here = Path(resolve_model(cfg.model)).expanduser()
        # staged to the nodes: where the launching side found it, not this node's stage copy
        if cfg.model_given:
            peft_config.base_model_name_or_path = cfg.model_given
        elif here.is_dir():
            # where the run found it (a folder, the installed offline MiniLM): loads offline
            peft_config.base_model_name_or_path = str(here.resolve())
        else:
            peft_config.base_model_name_or_path = cfg.model  # a Hub id: the Hub, or its cache
        model.save_pretrained(folder)  # type: ignore[operator]
        model.config.save_pretrained(folder)  # type: ignore[union-attr, operator]
        return
    # Training is over: merging in place costs no copy of the model.
    plain = model.merge_and_unload()  # type: ignore[operator]
    plain.save_pretrained(folder)


def is_adapter(folder: Path) -> bool:
    """True for a folder `save` wrote as an adapter."""
    return (folder / ADAPTER_CONFIG).is_file()


def load_adapter(folder: Path, **kwargs: Any) -> torch.nn.Module:
    """A saved adapter on its base model, with the labels of the folder's config.json (for
    predict)."""
    import json

    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from cpudist.train.models import resolve_model

    adapter = json.loads((folder / ADAPTER_CONFIG).read_text())
    base_name = resolve_model(adapter["base_model_name_or_path"])
    config = AutoConfig.from_pretrained(folder, **kwargs)
    base = AutoModelForSequenceClassification.from_pretrained(base_name, config=config, **kwargs)
    return PeftModel.from_pretrained(base, folder, **kwargs)
