from __future__ import annotations

import pytest

from cpudist.cpu import CpuInfo
from cpudist.flops import ModelShape, cpu_ghz, peak_flops, training_flops


def cpu(*flags: str) -> CpuInfo:
    return CpuInfo("x", frozenset(flags), 8, 8)


def test_training_flops_count_real_tokens_only() -> None:
    shape = ModelShape(non_embedding_params=1000, layers=2, hidden=4)
    # 3 x (2 N l + 4 L h l^2) for l = 10 and l = 5
    assert training_flops(shape, [10]) == 3 * (2 * 1000 * 10 + 4 * 2 * 4 * 100)
    assert (training_flops(shape, [10, 5])
            == training_flops(shape, [10]) + training_flops(shape, [5]))
    assert training_flops(shape, []) == 0


def test_peaks_by_vector_unit() -> None:
    avx2 = peak_flops(cpu("avx2"), cores=2, ghz=2.5)
    assert avx2.fp32 == pytest.approx(2 * 2.5e9 * 32) and avx2.bf16 == avx2.fp32
    assert "no native bf16" in avx2.how
    avx512 = peak_flops(cpu("avx2", "avx512f", "avx512_bf16"), cores=1, ghz=2.0)
    assert avx512.fp32 == pytest.approx(2e9 * 64) and avx512.bf16 == pytest.approx(2 * avx512.fp32)
    amx = peak_flops(cpu("avx512f", "amx_bf16", "avx512_bf16"), cores=1, ghz=2.0)
    assert amx.bf16 == pytest.approx(2e9 * 1024)


def test_clock_from_cpuinfo() -> None:
    assert cpu_ghz("processor: 0\ncpu MHz\t\t: 2445.432\n") == pytest.approx(2.445432)
    assert cpu_ghz("") == 0.0
