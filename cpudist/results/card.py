"""The model card (README.md of a saved model) in the Hub's format, from the run's result.

Rank 0 writes it once, beside the weights, with what the launching side knew before the launch (the
command as typed, the launcher, the price of the nodes: results/launched.py), so --model-s3's copy
is the run folder's. huggingface_hub's ModelCard and ModelCardData write the YAML front matter (and
its model-index of evaluation results), so the Hub and `huggingface_hub.ModelCard.load` read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cpudist.results.schema import RunResult

CARD = "README.md"
GLUE_DATASET = "nyu-mll/glue"

TEMPLATE = """---
{{ card_data }}
---

# {{ name }}

{{ origin }}, fine-tuned with cpudist {{ r.versions.get("cpudist", "") }}
on {{ task_text }} by data-parallel training on CPUs.

```python
from transformers import pipeline
classify = pipeline("text-classification", model="path/to/this/folder")
```

## Task and data

- Task: `{{ r.task }}` ({{ kind }}){% if labels %}; labels (id: name): {{ labels }}{% endif %}
- Data: {{ data_text }}
- Rows: {{ r.train_samples }} trained on ({{ r.data.get("train_rows", "?") }} per epoch), \
{{ r.data.get("eval_rows", "?") }} evaluated

## Evaluation (validation rows)

{{ saved_text }}

| metric | value |
|---|---|{% for k, v in r.metrics.items() %}
| {{ k }} | {{ "%.4f" % v }} |{% endfor %}

{% if r.evaluations | length > 1 %}
Every evaluation of the run:

| step | {{ metric_names | join(" | ") }} |
|---|{% for _ in metric_names %}---|{% endfor %}{% for e in r.evaluations %}
| {{ e.step }} |{% for k in metric_names %} {{ "%.4f" % e.metrics[k] }} |{% endfor %}{% endfor %}

{% endif %}
## Training hyperparameters

- learning rate: {{ r.lr }} (--lr-scaling {{ r.lr_scaling }}), optimizer {{ r.optimizer }}, \
{{ schedule }}
- {{ length }}: {{ r.steps }} optimizer steps{% if r.early_stopping %}; stopped early at step \
{{ r.early_stopping.step }}: {{ r.early_stopping.reason }}{% endif %}
- batch: {{ r.per_rank_batch_size }} per rank x {{ r.grad_accum }} accumulation x \
{{ r.world_size }} ranks = \
{{ r.global_batch_size }} rows per step; at most {{ r.max_seq_len }} tokens per row
{% if r.peft %}- LoRA (peft): r {{ r.peft.r }}, alpha {{ r.peft.alpha }}, \
dropout {{ r.peft.dropout }} on \
{{ r.peft.targets | join(", ") }}; trained in full: {{ r.peft.modules_to_save | join(", ") }}; \
{{ r.peft.trainable_params }} of {{ r.peft.total_params }} parameters trained; saved \
{{ "merged into the base model" if r.peft.merged else "as the adapter" }}
{% endif %}\
- seed {{ r.seed }}, precision {{ r.precision }}, sync {{ r.sync }}\
{% if r.freeze_embeddings %}, word embeddings frozen{% endif %}\
{% if r.checkpointed_layers %}, activations of {{ r.checkpointed_layers }} layer(s) \
recomputed in backward{% endif %}

## The run

- ranks x nodes: {{ r.world_size }} x {{ r.nodes | length }} \
({{ r.ppn }} per node{% if r.launcher %}, \
launched with {{ r.launcher }}{% endif %})
- CPU: {{ r.cpu.get("model", "unknown") }} ({{ r.cpu.get("kind", "?") }})
- time: training {{ "%.1f" % r.train_time_s }} s, wall {{ "%.1f" % r.wall_time_s }} s, \
started {{ r.started_at }}
- cost: {{ cost }}
- versions: {{ versions }}
- run: `{{ r.run_id }}` (result.json beside this folder)
- command:

```bash
{{ command }}
```
"""


def _labels(r: RunResult) -> list[str]:
    return [str(x) for x in r.data.get("labels", [])]


def _glue(r: RunResult) -> str:
    """The GLUE task as GLUE spells it (STS-B, CoLA), which the ranks record; an older record's in
    capitals."""
    return f"GLUE {r.data.get('name') or r.task.upper()}"


def _data_text(r: RunResult) -> str:
    d = r.data
    source = d.get("source")
    if source == "glue-tsv":
        return (f"{_glue(r)} in GLUE's TSV layout from `{d.get('dir')}` "
                "(train.tsv; dev rows evaluated)")
    if source == "hub":
        return f"the Hub's `{GLUE_DATASET}` dataset, config `{d.get('config')}`"
    if source == "files":
        return f"train `{d.get('train')}`, validation `{d.get('validation')}`"
    return str(source or "unknown")


def _schedule(r: RunResult) -> str:
    """The learning-rate schedule in words (an older run's was linear, its warm-up unrecorded)."""
    if not r.lr_scheduler:
        return "linear warm-up and decay"
    warmup = r.warmup_steps or 0
    return f"{r.lr_scheduler} schedule (transformers' get_scheduler), {warmup} warm-up steps"


def card_data(r: RunResult) -> Any:
    """The front matter: what the Hub indexes (library, pipeline, datasets, metrics, base model,
    results)."""
    from huggingface_hub import EvalResult, ModelCardData

    glue = r.data.get("source") in ("glue-tsv", "hub")
    dataset = GLUE_DATASET if glue else None
    results = [EvalResult(task_type="text-classification", dataset_type=dataset or "custom",
                          dataset_name=_glue(r) if glue else "custom data", metric_type=k,
                          metric_value=round(v, 4), dataset_config=r.task if glue else None,
                          dataset_split="validation") for k, v in r.metrics.items()]
    return ModelCardData(library_name="transformers", pipeline_tag="text-classification",
                         tags=["text-classification", "cpudist",
                               *(["glue", r.task] if glue else [])],
                         datasets=[dataset] if dataset else None, metrics=list(r.metrics) or None,
                         base_model=r.base_model, model_name=model_name(r), eval_results=results
                         or None)


def model_name(r: RunResult) -> str:
    return f"{Path(r.model).name or r.model}-{r.task}"


def render_card(r: RunResult) -> str:
    """The card's text: front matter, then task, data, metrics, hyperparameters and the run."""
    from huggingface_hub import ModelCard

    labels = _labels(r)
    base = r.base_model
    saved = f"The saved weights are those of step {r.model_step} of {r.steps}"
    if r.save_model == "best" and r.evaluations:
        metric = r.metric_for_best_model or next(iter(r.metrics), "?")
        way = "" if r.greater_is_better is None else " (higher is better)" if r.greater_is_better \
            else " (lower is better)"
        saved += f", the best of {len(r.evaluations)} evaluations by {metric}{way}"
    elif r.evaluations:
        saved += ", the last evaluation's"
    cost = (f"${r.cost_usd:.4f} (${r.usd_per_hour:.3f}/h for the nodes)" if r.cost_usd is not None
            else "not known")
    card = ModelCard.from_template(
        card_data(r), template_str=TEMPLATE, r=r, name=model_name(r),
        origin=f"`{base}`" if base
        else f"`{r.model}` (random initial weights of a preset, or a local folder)",
        task_text=_glue(r) if r.data.get("source") in ("glue-tsv", "hub") else f"{r.task} data",
        kind="regression, one score" if not labels else f"{len(labels)}-class classification",
        labels=", ".join(f"{i}: {n}" for i, n in enumerate(labels)), data_text=_data_text(r),
        saved_text=saved + ".", metric_names=list(r.metrics), cost=cost, schedule=_schedule(r),
        length=f"{r.epochs:g} epochs" if r.epochs is not None else f"--max-steps {r.max_steps}",
        versions=", ".join(f"{k} {v}" for k, v in r.versions.items()),
        command=r.command
        or "(not known where the card was written: see command.txt for the ranks' command)")
    return str(card)


def write_card(model_dir: Path, r: RunResult) -> None:
    """model_dir/README.md from the result (atomically: a reader never sees half a card)."""
    tmp = model_dir / (CARD + ".tmp")
    tmp.write_text(render_card(r))
    tmp.replace(model_dir / CARD)


def folder_bytes(folder: Path) -> int:
    """Every file under a folder, together (a saved model's size)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
