"""The one-node speed levers: which layout, runtime and shapes they pick, and what they leave
alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cpudist.cpu import parse_cpuinfo
from cpudist.errors import BadInput
from cpudist.launch import tools as job
from cpudist.launch.env import auto_ppn, threads_per_rank
from cpudist.train.features import Encoded, collate
from cpudist.train.loop import TrainStats
from cpudist.train.models import build_model
from cpudist.train.optim import optimizer
from cpudist.train.speed import freeze_embeddings


@pytest.mark.parametrize(("flags", "kind"), [
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "amx-bf16"),
    ("avx2 avx512f avx512_bf16", "avx512-bf16"),
    ("avx2 avx512f avx512_vnni", "avx512"),  # Ice Lake (the blog's c6i): AVX-512 without bf16
    ("avx2 fma", "avx2"),
    ("sse4_2", "other"),
])
def test_cpu_kind_names_the_fast_path(flags: str, kind: str) -> None:
    cpu = parse_cpuinfo("processor\t: 0\nmodel name\t: X\nphysical id\t: 0\ncore id\t\t: 0\n"
                        f"flags\t\t: {flags}\n")
    assert cpu.kind == kind and cpu.summary()["kind"] == kind


@given(st.integers(1, 512))
def test_auto_ppn_uses_every_core_once(cores: int) -> None:
    ppn = auto_ppn(cores)
    assert ppn >= 1 and ppn * threads_per_rank(cores, ppn) <= cores
    assert threads_per_rank(cores, ppn) >= min(cores, 8)  # never thinner ranks than measured to pay


def test_auto_ppn_keeps_one_rank_on_small_nodes() -> None:
    # Measured on 2 cores: 1 rank x 2 threads beat 2 x 1 (benchmarks/README.md, "Levers").
    assert [auto_ppn(c) for c in (1, 2, 4, 8, 16, 64)] == [1, 1, 1, 1, 2, 8]


@given(st.lists(st.integers(1, 130), min_size=1, max_size=6), st.sampled_from([1, 8, 32]))
def test_collate_pads_to_a_multiple_and_keeps_the_rows(lengths: list[int], multiple: int) -> None:
    data = Encoded([[101] + [7] * (n - 1) for n in lengths], None, [0.0] * len(lengths), 0)
    batch = collate(data, list(range(len(lengths))), False, multiple)
    width = batch["input_ids"].shape[1]
    assert width % multiple == 0 and max(lengths) <= width < max(lengths) + multiple
    assert batch["attention_mask"].sum(1).tolist() == lengths  # padding is masked, rows intact


def test_openmp_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert job.pick_openmp("gnu") is None
    monkeypatch.setattr(job, "find_library", lambda names: None)
    with pytest.raises(BadInput, match="pip install intel-openmp"):
        job.pick_openmp("intel")
    monkeypatch.setattr(job, "find_library", lambda names: "/x/libiomp5.so")
    assert job.pick_openmp("intel") == "/x/libiomp5.so"
    assert job.pick_openmp("auto") == (None if job.OPENMP_AUTO == "gnu" else "/x/libiomp5.so")


def test_allocator_auto_takes_tcmalloc_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """jemalloc lost 12-16% here (benchmarks/README.md), so auto must not fall back to it."""
    only_jemalloc = {"libjemalloc.so.2": "/x/libjemalloc.so.2"}
    monkeypatch.setattr(job, "find_library",
                        lambda names: next((only_jemalloc[n] for n in names if n in only_jemalloc),
                                            None))
    assert job.pick_allocator("auto") is None
    assert job.pick_allocator("jemalloc") == "/x/libjemalloc.so.2"
    with pytest.raises(BadInput, match="tcmalloc is not installed"):
        job.pick_allocator("tcmalloc")
    monkeypatch.setattr(job, "find_library", lambda names: "/x/" + names[0])
    assert job.pick_allocator("auto") == "/x/libtcmalloc.so.4"
    assert job.pick_allocator("none") is None


def test_frozen_embeddings_get_no_gradient_and_no_optimizer_state() -> None:
    from cpudist.config import TrainConfig

    model = build_model("tiny", 2, False, 0.0)
    table = model.get_input_embeddings().weight
    frozen = freeze_embeddings(model)
    assert frozen == table.numel() and not table.requires_grad
    opt = optimizer(TrainConfig(task="mrpc", output_dir="x"), model, 2e-5)
    optimized = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(table) not in optimized
    assert optimized == {id(p) for p in model.parameters() if p.requires_grad}
    ids = torch.randint(1000, 2000, (2, 8))
    model(input_ids=ids, labels=torch.tensor([0, 1])).loss.backward()
    assert table.grad is None and model.classifier.weight.grad is not None


def test_steady_throughput_leaves_out_compiling_steps() -> None:
    stats = TrainStats(step_times=[9.0, 1.0, 1.0, 1.0, 1.0, 30.0, 1.0, 1.0], step_samples=[32] * 8)
    assert stats.steady_samples_per_s() == pytest.approx(32 * 5 / 34)
    stats.compiling = {0, 5}  # step 5 met a new padded length and compiled it
    assert stats.steady_samples_per_s() == pytest.approx(32.0)
