"""The sync strategies' table: one row per Strategy class, labels that parse back, the option
checks, and result.json's sync_options read under the names of any cpudist version (report and plan
on old ledgers)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpudist.cli.main import cli
from cpudist.config import TrainConfig, spec_of
from cpudist.errors import BadInput
from cpudist.results.ledger import read_ledger
from cpudist.results.planner import sync_of
from cpudist.strategies import OLD_NAMES, SHARED, TABLE, SyncSpec, from_record, parse_label
from cpudist.sync_flags import ASKED, asked, check_sync, flag

OLD_LEDGER = (Path(__file__).parents[2] / "benchmarks" / "results"
              / "scaling-halfcore-amx-bf16-ledger.jsonl")


def test_every_row_has_its_strategy_class_and_every_class_its_row() -> None:
    from cpudist.train.sync import Strategy

    assert set(TABLE) == set(Strategy.registry)


def test_trainconfig_holds_the_sync_as_asked_and_spec_of_resolves_it() -> None:
    knobs = {flag(f) for f in dataclasses.fields(SyncSpec)}
    # run's flags name every knob a strategy takes
    assert all(set(row.knobs) <= knobs for row in TABLE.values()) and set(SHARED) <= knobs
    assert TrainConfig(task="mrpc", output_dir="o").sync == ASKED
    assert ASKED.grad_compression == "auto" and ASKED.sync_every == 8
    flags = {"sync": "local-sgd", "grad_compression": "bf16", "sync_every": 4,
             "local_sgd_warmup": 3, "outer_optimizer": "nesterov", "outer_lr": 0.5,
             "outer_momentum": 0.8, "average_moments": "both", "second_moment_every": 2,
             "bucket_cap_mb": 5.0, "dist_timeout": 300}  # run's other options are not its
    cfg = TrainConfig(task="mrpc", output_dir="o", sync=asked(flags))
    assert cfg.sync == SyncSpec(strategy="local-sgd", grad_compression="bf16", sync_every=4,
                                local_sgd_warmup=3,
                                outer_optimizer="nesterov", outer_lr=0.5, outer_momentum=0.8,
                                average_moments="both", second_moment_every=2, bucket_cap_mb=5.0)
    spec = spec_of(cfg, 100)
    assert spec == dataclasses.replace(cfg.sync, powersgd_start=10)
    # --grad-compression powersgd:3 is its two fields; the warm-up is local SGD's alone
    ddp = dataclasses.replace(cfg, sync=asked({**flags, "sync": "ddp",
                                               "grad_compression": "powersgd:3"}))
    assert spec_of(ddp, 100) == dataclasses.replace(
        spec, strategy="ddp", grad_compression="powersgd", powersgd_rank=3, local_sgd_warmup=0)
    # auto resolved as on one node where the rank has not resolved it (train/main.py)
    assert spec_of(TrainConfig(task="mrpc", output_dir="o"), 100).grad_compression == "none"


SPECS = [SyncSpec(), SyncSpec(grad_compression="bf16"), SyncSpec(grad_compression="fp16"),
         SyncSpec(embedding_sync="dense"),
         SyncSpec(grad_compression="bf16", embedding_sync="dense"),
         SyncSpec(grad_compression="powersgd", powersgd_rank=4), SyncSpec(strategy="allreduce"),
         SyncSpec(strategy="gather-scatter"),
         *(SyncSpec(strategy="local-sgd", grad_compression=wire, sync_every=k,
                    outer_optimizer=outer, average_moments=moments,
                     second_moment_every=j)
           for wire in ("none", "bf16") for k in (1, 8) for outer in ("none", "nesterov")
           for moments in ("none", "first", "second", "both") for j in (1, 3))]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label)
def test_every_label_parses_back_to_its_strategy(spec: SyncSpec) -> None:
    back = parse_label(spec.label)
    assert back.label == spec.label and back.strategy == spec.strategy


def test_unknown_labels_are_ddp() -> None:
    assert parse_label("") == parse_label("no-such-sync:3") == SyncSpec()


def cfg(**knobs: object) -> SyncSpec:
    """The sync `cpudist run` asks for with these flags."""
    return asked(knobs)


@pytest.mark.parametrize(("knobs", "message"), [
    ({"sync_every": 4},
     "--sync-every applies to --sync local-sgd, not ddp. Add --sync local-sgd, or drop "
     "--sync-every"),
    ({"sync": "allreduce", "grad_compression": "bf16"},
     "--grad-compression applies to --sync ddp and local-sgd, not "
     "allreduce. Use --sync ddp (or local-sgd) with it, or drop --grad-compression"),
    # the knob only one strategy takes is named first: it says best which --sync was meant
    ({"sync": "gather-scatter", "grad_compression": "bf16", "outer_lr": 1.0},
     "--outer-lr applies to --sync local-sgd"),
    ({"sync": "local-sgd", "grad_compression": "powersgd"},
     "local SGD averages in fp32 (none) or bf16"),
    ({"sync": "local-sgd", "second_moment_every": 2},
     "--second-moment-every 2: the second moment is not averaged"),
    ({"sync": "nccl"},
     "--sync nccl: unknown. Use one of: ddp, allreduce, gather-scatter, local-sgd"),
    ({"sync": "local-sgd", "embedding_sync": "dense"},
     "--embedding-sync applies to --sync ddp, not local-sgd"),
])
def test_knobs_of_another_strategy_are_refused_in_one_line(knobs: dict[str, object],
                                                           message: str) -> None:
    with pytest.raises(BadInput) as e:
        check_sync(cfg(**knobs))
    assert message in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("knobs", [{}, {"grad_compression": "powersgd:2", "bucket_cap_mb": 5.0},
                                   {"sync": "allreduce", "bucket_cap_mb": 5.0},
                                   {"sync": "local-sgd", "grad_compression": "bf16",
                                    "average_moments": "both", "second_moment_every": 2,
                                    "outer_optimizer": "nesterov", "local_sgd_warmup": 4}])
def test_each_strategys_own_knobs_pass(knobs: dict[str, object]) -> None:
    check_sync(cfg(**knobs))


def renamed(record: dict[str, object]) -> dict[str, object]:
    """A result.json as this cpudist writes it: sync_options under SyncSpec's names."""
    options = record.get("sync_options") or {}
    assert isinstance(options, dict)
    return {**record, "sync_options": {OLD_NAMES.get(k, k): v for k, v in options.items()}}


def test_sync_options_of_older_results_read_as_todays() -> None:
    old = {"sync": "local-sgd", "compression": "bf16", "warmup_steps": 3, "outer": "nesterov",
           "moments": "both", "sync_every": 8, "powersgd_start": 34, "extra": 1}
    spec = from_record(old, "ignored")
    assert spec == SyncSpec(strategy="local-sgd", grad_compression="bf16", powersgd_start=34,
                            sync_every=8,
                            local_sgd_warmup=3, outer_optimizer="nesterov", average_moments="both")
    assert from_record(renamed({"sync_options": old})["sync_options"],
                       "ignored") == spec  # type: ignore[arg-type]
    # the first versions' name of the strategy is today's again; today's record reads back whole
    assert from_record({**old, "strategy": old.pop("sync")}, "ignored") == spec
    assert from_record(dataclasses.asdict(spec), "ignored") == spec
    assert from_record({}, "diloco:8+mv+bf16") == SyncSpec(strategy="local-sgd",
                                                           grad_compression="bf16", sync_every=8,
                                                           outer_optimizer="nesterov",
                                                           average_moments="both")


def test_ddp_labels_say_a_dense_embedding_and_old_ddp_records_sent_one() -> None:
    assert [parse_label(s.label).embedding_sync for s in SPECS[:5]] == ["rows"] * 3 + ["dense"] * 2
    assert SyncSpec(embedding_sync="dense").label == "ddp+dense-emb" and SyncSpec().label == "ddp"
    # PowerSGD keeps the embedding in DDP (its factors are smaller than the rows): no tag, the same
    # bytes
    assert SyncSpec(grad_compression="powersgd", embedding_sync="dense").label == "ddp+powersgd:1"
    # a ddp result.json from before rows existed sent all of it; one from after says which it sent
    assert from_record({"sync": "ddp", "grad_compression": "bf16"},
                       "ddp+bf16").embedding_sync == "dense"
    assert from_record({"sync": "ddp", "embedding_sync": "rows"}, "ddp").embedding_sync == "rows"
    # not a knob of its
    assert from_record({"sync": "local-sgd"}, "local-sgd:8").embedding_sync == "rows"


def test_report_and_plan_read_an_old_ledger_as_its_renamed_copy(tmp_path: Path) -> None:
    """benchmarks/ holds a ledger written before the knobs were renamed: plan, validate and report
    give the same answers on it as on the same records under today's names (powersgd_start, warm-ups
    and DiLoCo count)."""
    lines = [json.loads(line) for line in OLD_LEDGER.read_text().splitlines() if line.strip()]
    # still the old names
    assert any("compression" in (r.get("sync_options") or {}) for r in lines)
    new = tmp_path / "renamed.jsonl"
    new.write_text("".join(json.dumps(renamed(r)) + "\n" for r in lines))
    assert [sync_of(r) for r in read_ledger(OLD_LEDGER)] == [sync_of(r) for r in read_ledger(new)]
    assert {sync_of(r).powersgd_start
            for r in read_ledger(OLD_LEDGER)} != {SyncSpec().powersgd_start}
    for args in (["plan", "--link-gbps", "10", "--json"],
                 ["plan", "--link-gbps", "10", "--validate", "--json"], ["report", "--json"]):
        old_out, new_out = (CliRunner().invoke(cli, [*args, str(path)])
                            for path in (OLD_LEDGER, new))
        assert old_out.exit_code == 0, old_out.output
        assert old_out.output == new_out.output
    rows = json.loads(CliRunner().invoke(cli, ["plan", "--link-gbps", "10", "--validate", "--json",
                                              str(OLD_LEDGER)]).output)
    assert ({"diloco:8", "local-sgd:8", "ddp+powersgd:2", "gather-scatter"}
            <= {r["sync"] for r in rows})
