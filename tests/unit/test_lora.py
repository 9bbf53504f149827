"""--peft lora at the front door, on the model (what trains) and in the traffic model (what crosses
the wire)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.config import TrainConfig, from_argv, to_argv
from cpudist.errors import BadInput
from cpudist.strategies import SyncSpec
from cpudist.traffic import expected_traffic, payload_bytes
from cpudist.train import lora, sync
from cpudist.train.models import build_model
from tests.conftest import SHARED_DATA

BASE = ["run", "mrpc", "--model", "tiny", "--dry-run", "--data-dir",
        str(SHARED_DATA / "glue" / "MRPC")]
LORA = TrainConfig(task="mrpc", output_dir="o", model="tiny", peft="lora")


def test_options_reach_the_ranks_and_round_trip() -> None:
    out = CliRunner().invoke(cli, [*BASE, "--peft", "lora", "--lora-r", "4", "--lora-alpha", "8",
                                   "--lora-dropout", "0.05", "--lora-targets", "query, key,value",
                                   "--merge-lora", "--lora-modules-to-save", "classifier"])
    assert out.exit_code == 0, out.output
    words = " ".join(out.output.split())
    for flag in ("--peft=lora", "--lora-r=4", "--lora-alpha=8.0", "--lora-dropout=0.05",
                 "--lora-targets=query,key,value", "--merge-lora=1",
                 "--lora-modules-to-save=classifier"):
        assert flag in words, flag
    cfg = dataclasses.replace(LORA, lora_r=4, lora_alpha=8.0, lora_dropout=0.05,
                              lora_targets=("query", "key"),
                              lora_modules_to_save=("classifier",), merge_lora=True)
    assert from_argv(to_argv(cfg)) == cfg
    assert not any("lora" in w or "peft" in w
                   for w in to_argv(dataclasses.replace(LORA, peft="none")))


@pytest.mark.parametrize(("args", "said"), [
    (["--lora-r", "4"], "--lora-r applies to --peft lora only"),
    (["--merge-lora"], "--merge-lora applies to --peft lora only"),
    (["--lora-targets", "query"], "--lora-targets applies to --peft lora only"),
    (["--lora-modules-to-save", "pooler"], "--lora-modules-to-save applies to --peft lora only"),
    (["--peft", "lora", "--freeze-embeddings"], "LoRA trains no embedding anyway"),
    (["--peft", "lora", "--merge-lora", "--save-model", "none"], "no model is saved to merge"),
    (["--peft", "lora", "--lora-r", "0"], "--lora-r"),
    (["--peft", "qlora"], "--peft"),
])
def test_refusals_name_the_fix(args: list[str], said: str) -> None:
    out = CliRunner().invoke(cli, [*BASE, *args])
    assert out.exit_code == 2 and said in out.output, out.output


def test_default_targets_per_family() -> None:
    assert lora.targets_for("bert", ()) == ("query", "key", "value", "dense")
    assert lora.targets_for("distilbert", ()) == ("q_lin", "k_lin", "v_lin", "out_lin", "lin1",
                                                  "lin2")
    assert lora.targets_for("modernbert", ()) == ("Wqkv", "Wo", "Wi")
    # a family not named: peft's own table
    assert lora.targets_for("gpt_neox", ()) == ("query_key_value",)
    assert lora.targets_for("bert", ("query", "value")) == ("query", "value")  # --lora-targets wins
    with pytest.raises(BadInput, match="--lora-targets"):
        lora.targets_for("no-such-family", ())


# ALBERT's projection of its 128-wide embeddings up to the hidden size is an embedding's part, left
# frozen as the embeddings are
NOT_A_LAYER = {"embedding_hidden_mapping_in"}


@pytest.mark.parametrize("preset",
                         ["tiny", "tiny-roberta", "tiny-xlm-roberta", "tiny-electra", "tiny-albert",
                          "tiny-distilbert", "tiny-deberta-v3", "tiny-modernbert", "tiny-llama"])
def test_the_default_adapts_every_linear_of_the_layers_and_none_of_the_head(preset: str) -> None:
    import torch

    model = build_model(preset, 2, False, None)
    head = {"classifier", "score", *lora.HEADS.get(model.config.model_type, ())}
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    in_head = {n for n in linears if head & set(n.split("."))}
    expected = {n for n in linears - in_head if n.rsplit(".", 1)[-1] not in NOT_A_LAYER}
    wrapped = lora.apply(model, LORA)
    adapted = {n.split(".lora_A.")[0].removeprefix("base_model.model.") for n,
               _ in wrapped.named_parameters()
               if ".lora_A." in n}
    assert in_head and adapted == expected, (sorted(expected - adapted), sorted(adapted - expected))


def _trained(model: object) -> dict[str, int]:
    return {n: p.numel() for n, p in model.named_parameters()
            if p.requires_grad}  # type: ignore[attr-defined]


def test_only_adapters_and_head_train_and_traffic_counts_only_them() -> None:
    full = build_model("tiny", 2, False, None)  # hidden 32, 2 layers
    full_bytes = payload_bytes(list(sync.named_shapes(full)))
    model = lora.apply(full, LORA)
    trained = _trained(model)
    assert trained and all(".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n
                           for n in trained), trained
    # r 8 on every Linear of 2 layers: query, key, value and the attention's output (32 -> 32: A is
    # 8 x 32, B 32 x 8), the feed-forward's two (32 -> 64 -> 32); the head: BERT's pooler (32 x 32 +
    # 32) and the classifier (2 x 32 + 2), as full fine-tuning trains them
    layer = 4 * (8 * 32 + 32 * 8) + 2 * (8 * 32 + 64 * 8)
    assert sum(trained.values()) == 2 * layer + 32 * 32 + 32 + 2 * 32 + 2
    assert sum("classifier.modules_to_save" in n for n in trained) == 2
    assert sum("pooler.modules_to_save" in n for n in trained) == 2
    shapes = list(sync.named_shapes(model))
    grads = payload_bytes(shapes)
    # 122x for this 1M-parameter BERT
    assert grads == 4 * sum(trained.values()) and full_bytes > 100 * grads
    ring = expected_traffic(SyncSpec(), shapes, world=4, ppn=1, steps=10)
    # what DDP's ring sends per node and step: only the adapters
    assert ring.node_tx == (2 * 3 / 4 * grads,) * 4
    info = lora.settings(model, LORA)
    assert info["trainable_params"] == sum(trained.values())
    assert info["targets"] == ["dense", "key", "query", "value"]
    assert info["merged"] is True  # a preset's random base is saved nowhere else


def test_modules_to_save_replace_the_family_head_but_never_the_classifier() -> None:
    frozen_pooler = dataclasses.replace(LORA, lora_modules_to_save=("classifier",))
    trained = _trained(lora.apply(build_model("tiny", 2, False, None), frozen_pooler))
    assert not any("pooler" in n for n in trained)
    assert sum(trained.values()) == 2 * (4 * (8 * 32 + 32 * 8) + 2 * (8 * 32 + 64 * 8)) + 2 * 32 + 2
    # a list without the classifier still trains it: peft's sequence-classification task always adds
    # it
    trained = _trained(lora.apply(build_model("tiny", 2, False, None),
                                  dataclasses.replace(LORA, lora_modules_to_save=("pooler",))))
    assert {n.split(".modules_to_save")[0].rsplit(".", 1)[-1] for n in trained
            if ".modules_to_save." in n} == \
        {"pooler", "classifier"}


def test_distilbert_head_trains_in_full() -> None:
    model = lora.apply(build_model("distilbert-base", 3, False, None), LORA)
    heads = {n.split(".modules_to_save")[0].rsplit(".", 1)[-1] for n in _trained(model)
             if "modules_to_save" in n}
    assert heads == {"pre_classifier", "classifier"}
    assert any("q_lin.lora_A" in n for n in _trained(model))


def test_bad_targets_are_one_line() -> None:
    with pytest.raises(BadInput, match="--lora-targets"):
        lora.apply(build_model("tiny", 2, False, None),
                   dataclasses.replace(LORA, lora_targets=("nothing_here",)))


def test_resume_needs_the_same_adapters() -> None:
    plain = dataclasses.replace(LORA, peft="none")
    # a checkpoint from before LoRA: no keys, full fine-tuning
    lora.check_resume({}, plain, Path("old"))
    lora.check_resume({"peft": "lora", "lora_r": 8, "lora_alpha": 16.0, "lora_targets": []}, LORA,
                      Path("c"))
    with pytest.raises(BadInput, match="peft: 'lora' there, 'none' here"):
        lora.check_resume(dataclasses.asdict(LORA), plain, Path("c"))
    with pytest.raises(BadInput, match="peft: 'none' there, 'lora' here"):
        lora.check_resume({}, LORA, Path("c"))
    with pytest.raises(BadInput, match="lora_r: 8 there, 16 here"):
        lora.check_resume(dataclasses.asdict(LORA), dataclasses.replace(LORA, lora_r=16), Path("c"))
    with pytest.raises(BadInput, match=r"lora_modules_to_save: \(\) there, \('classifier',\) here"):
        lora.check_resume(dataclasses.asdict(LORA),
                          dataclasses.replace(LORA, lora_modules_to_save=("classifier",)),
                          Path("c"))


def test_a_checkpoint_of_other_adapters_is_refused_by_its_weights() -> None:
    from cpudist.train.saver import check_same_weights

    qv = dataclasses.replace(LORA, lora_targets=("query", "value"))
    # the default before 2026-11-27
    saved = lora.apply(build_model("tiny", 2, False, None), qv).state_dict()
    # its config said lora_targets () (the default then): the config check lets it through to the
    # weights' check
    lora.check_resume({**dataclasses.asdict(LORA), "lora_targets": []}, qv, Path("c"))
    check_same_weights(saved, lora.apply(build_model("tiny", 2, False, None), qv).state_dict(), "c")
    # the default's adapters wrap key and the dense layers too (their weight and bias move under
    # base_layer)
    with pytest.raises(BadInput,
                       match=r"checkpoint c holds another model: 32 weights of this model are not "
                             r"in it "
                             r"\(e.g. .*\); 16 of its weights are not in this model .*"
                             r"add --lora-targets query,value\)"):
        check_same_weights(saved,
                           lora.apply(build_model("tiny", 2, False, None), LORA).state_dict(), "c")
    wider = dataclasses.replace(qv, lora_r=4)
    with pytest.raises(BadInput, match="8 of its weights have other shapes"):
        check_same_weights(saved,
                           lora.apply(build_model("tiny", 2, False, None), wider).state_dict(), "c")
    # named targets are compared as given
    with pytest.raises(BadInput, match=r"lora_targets: \('query',\) there"):
        lora.check_resume({**dataclasses.asdict(LORA), "lora_targets": ["query"]}, qv, Path("c"))


def test_card_and_old_results() -> None:
    from cpudist.results.card import render_card
    from cpudist.results.schema import RunResult
    from tests.unit.test_results import result

    settings = {"method": "lora", "r": 8, "alpha": 16.0, "dropout": 0.1,
                "targets": ["query", "value"], "modules_to_save": ["classifier"],
                "trainable_params": 2114, "total_params": 1013540, "merged": False}
    r = result(1, 10.0).with_updates(peft=settings, trainable_params=2114)
    assert ("- LoRA (peft): r 8, alpha 16.0, dropout 0.1 on query, value; trained in full: "
            "classifier; 2114 of 1013540 parameters trained; saved as the adapter\n"
            "- seed") in render_card(r)
    assert "LoRA" not in render_card(result(1, 10.0))
    old = result(1, 10.0).to_dict()
    del old["peft"], old["trainable_params"]
    assert RunResult.from_dict(old).peft == {} and RunResult.from_dict(r.to_dict()) == r


def test_plan_prices_a_lora_run_by_its_adapters_and_keeps_full_runs_apart(tmp_path: Path) -> None:
    import json

    from cpudist.results.validation import comparable
    from tests.unit.test_planner import run

    settings = {"method": "lora", "r": 8, "targets": ["query", "value"], "total_params": 22_788_484}
    adapters = ((8, 384),) * 12 + ((384, 8),) * 12 + ((2, 384), (2,))  # MiniLM's: 74,498 parameters
    lora_one = run(1, run_id="lora1", peft=settings, trainable_params=74_498, param_shapes=adapters,
                   grad_bytes=297_992, started_at="2026-01-05T00:00:00")
    full_two = run(2, step_s=2.9, comm_time_s=80.0, exposed_comm_s=60.0)  # 100 MB of gradients
    assert not comparable(lora_one, full_two) and comparable(lora_one, lora_one)
    folder = tmp_path / "runs"
    for r in (lora_one, full_two, run(1)):
        (folder / r.run_id).mkdir(parents=True)
        (folder / r.run_id / "result.json").write_text(json.dumps(r.to_dict()))
    out = CliRunner().invoke(cli,
                             ["plan", str(folder), "--baseline", "lora1", "--nodes", "4",
                              "--link-gbps", "1"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert ("trained: LoRA r 8 on query, value and the head: 74,498 of 22,788,484 parameters, "
            "298 kB per exchange") in text, text
    data = json.loads(CliRunner().invoke(cli,
                                         ["plan", str(folder), "--baseline", "lora1", "--nodes",
                                          "4", "--link-gbps", "1", "--latency-ms", "0", "--overlap",
                                          "0", "--sync-cpu-s-per-gb", "0", "--json"]).output)
    ddp4 = next(p for p in data["predictions"] if p["nodes"] == 4 and p["sync"] == "ddp")
    # ring over 4 nodes: 1.5 x 298 kB at 1 Gbit/s = 3.6 ms on top of t_c = 2 s; the full model's 100
    # MB: 1.2 s
    assert ddp4["step_s"] == pytest.approx(2.0 + 1.5 * 297_992 * 8 / 1e9, rel=1e-6)
    assert data["baseline"]["trainable_params"] == 74_498
    # checked against its own (full) 1-node run
    assert [v["run_id"] for v in data["validation"]] == ["r2x1"]
    assert [v["baseline_id"] for v in data["validation"]] == ["r1x1"]


# Each family's tiny preset: its default targets exist, and what trains is the adapters and the
# whole head.
ENCODER = {"query", "key", "value", "dense"}
FAMILIES = {"tiny-roberta": (ENCODER, {"classifier"}),
            "tiny-xlm-roberta": (ENCODER, {"classifier"}),
            "tiny-electra": (ENCODER, {"classifier"}),
            "tiny-albert": (ENCODER | {"ffn", "ffn_output"}, {"pooler", "classifier"}),
            "tiny-distilbert": ({"q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"},
                                {"pre_classifier", "classifier"}),
            "tiny-deberta-v3": ({"query_proj", "key_proj", "value_proj", "dense"},
                                {"pooler", "classifier"}),
            "tiny-modernbert": ({"Wqkv", "Wo", "Wi"}, {"head", "classifier"}),
            "tiny-llama": ({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"}, {"score"})}


@pytest.mark.parametrize("preset", list(FAMILIES))
def test_every_family_trains_its_adapters_and_head_and_merges_alike(preset: str) -> None:
    import torch

    targets, heads = FAMILIES[preset]
    torch.manual_seed(0)
    model = lora.apply(build_model(preset, 3, False, None, pad_token_id=0), LORA)
    trained = _trained(model)
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trained if ".lora_" in n}
    saved = {n.split(".modules_to_save")[0].rsplit(".", 1)[-1] for n in trained
             if ".modules_to_save." in n}
    assert (adapted, saved) == (targets, heads)
    assert all(".lora_" in n or ".modules_to_save." in n for n in trained)
    batch = {"input_ids": torch.randint(1, 100, (2, 12)),
             "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    model.train()
    model(**batch, labels=torch.tensor([0, 2])).loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == set(trained)  # nothing frozen gets a gradient, so nothing frozen is exchanged
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_()  # B starts at zero: make the adapters matter before merging
        before = model.eval()(**batch).logits
        after = model.merge_and_unload()(**batch).logits
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
