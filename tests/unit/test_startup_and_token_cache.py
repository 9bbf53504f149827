"""The time before the first step, phase by phase (cpudist/train/startup.py), and the node's
tokenization cache (cpudist/train/token_cache.py): a re-run with the same rows, tokenizer and length
tokenizes nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from cpudist.state import STARTED_AT_ENV
from cpudist.train.data import Split
from cpudist.train.features import encode
from cpudist.train.models import tokenizer_source
from cpudist.train.startup import Startup, process_age_s
from cpudist.train.token_cache import cached_encode, key

PAIRS = Split((("The cat sat.", "A dog ran far away from home.", "Stocks fell 3%."),
               ("A cat sat.", "The dog ran.", "Shares dropped three percent.")), (1.0, 0.0, 1.0))


@pytest.fixture(scope="module")
def tokenizer() -> object:
    source = tokenizer_source("sentence-transformers/all-MiniLM-L6-v2", None)
    return AutoTokenizer.from_pretrained(source, use_fast=True)


def test_a_second_encode_of_the_same_rows_comes_from_the_cache_and_equals_the_tokenizers(
    tokenizer: object,
     tmp_path: Path) -> None:
    first, hit = cached_encode(PAIRS, tokenizer, 12, tmp_path)
    assert not hit and len(list(tmp_path.glob("*.safetensors"))) == 1
    again, hit = cached_encode(PAIRS, tokenizer, 12, tmp_path)
    assert hit
    fresh = encode(PAIRS, tokenizer, 12)
    for got in (first, again):
        assert got.input_ids == fresh.input_ids and got.token_type_ids == fresh.token_type_ids
        assert got.pad_id == fresh.pad_id and got.labels == fresh.labels
    # truncated as asked (the longest pair has 15)
    assert max(len(r) for r in again.input_ids) == 12


def test_what_decides_the_tokens_changes_the_key_and_labels_do_not(tokenizer: object) -> None:
    base = key(PAIRS, tokenizer, 16)
    # a call leaves the tokenizer's truncation set: not part of what it is
    encode(PAIRS, tokenizer, 32)
    other_text = Split(((*PAIRS.texts[0][:2], "Stocks fell 4%."), PAIRS.texts[1]), PAIRS.labels)
    one_column = Split((PAIRS.texts[0],), PAIRS.labels)
    shifted = Split((PAIRS.texts[0][:2], (*PAIRS.texts[1][:1], "The dog ran.")), PAIRS.labels[:2])
    relabelled = Split(PAIRS.texts, (0.0, 1.0, 0.0))
    assert base is not None and key(relabelled, tokenizer, 16) == base
    keys = {base, key(other_text, tokenizer, 16), key(one_column, tokenizer, 16),
            key(PAIRS, tokenizer, 32), key(shifted, tokenizer, 16)}
    assert len(keys) == 5
    lower = AutoTokenizer.from_pretrained(tokenizer_source("sentence-transformers/all-MiniLM-L6-v2",
                                                           None),
                                          use_fast=True, do_lower_case=False)
    assert key(PAIRS, lower, 16) != base  # same vocabulary, another normalizer: other ids


def test_a_damaged_entry_is_tokenized_again_and_replaced(tokenizer: object, tmp_path: Path) -> None:
    cached_encode(PAIRS, tokenizer, 16, tmp_path)
    (entry,) = tmp_path.glob("*.safetensors")
    whole = entry.read_bytes()
    for damaged in (whole[: len(whole) // 2], b"", whole[:8] + b"\xff" * (len(whole) - 8)):
        entry.write_bytes(damaged)
        data, hit = cached_encode(PAIRS, tokenizer, 16, tmp_path)
        assert not hit and data.input_ids == encode(PAIRS, tokenizer, 16).input_ids
        assert cached_encode(PAIRS, tokenizer, 16, tmp_path)[1]  # rewritten whole
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # no temporary file left behind


def test_offsets_that_do_not_cut_whole_rows_are_a_miss(tokenizer: object, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    cached_encode(PAIRS, tokenizer, 16, tmp_path)
    (entry,) = tmp_path.glob("*.safetensors")
    t = load_file(str(entry))
    t["ids_offsets"] = t["ids_offsets"].flip(0)  # rows of negative length
    save_file(t, str(entry), metadata={"pad_id": "0"})
    assert not cached_encode(PAIRS, tokenizer, 16, tmp_path)[1]


def test_without_a_writable_cache_or_a_fast_tokenizer_rows_are_still_tokenized(
        tokenizer: object, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    data, hit = cached_encode(PAIRS, tokenizer, 16, blocker / "tokens")
    assert not hit and data.input_ids == encode(PAIRS, tokenizer, 16).input_ids

    class Slow:  # a tokenizer with no serialized state to key on
        pad_token_id = 0

        def __call__(self, *texts: tuple[str, ...], truncation: bool,
                     max_length: int) -> dict[str, object]:
            return {"input_ids": [[1, 2]] * len(texts[0])}

    assert key(PAIRS, Slow(), 16) is None
    assert cached_encode(PAIRS, Slow(), 16, tmp_path / "c") == (encode(PAIRS, Slow(), 16), False)
    assert not (tmp_path / "c").exists()


def test_process_age_counts_from_the_processs_start() -> None:
    code = ("import time; time.sleep(1.0); from cpudist.train.startup import process_age_s; "
            "print(process_age_s())")
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True)
    lived = time.monotonic() - began
    age = float(out.stdout)
    assert 1.0 <= age <= lived + 0.05, (age, lived)  # the kernel's clock ticks in 10 ms


def test_phases_before_the_rank_come_from_the_commands_start_and_add_up() -> None:
    age = process_age_s()
    assert age is not None
    # the command started 5 s before us
    s = Startup.at_entry({STARTED_AT_ENV: f"{time.time() - age - 5.0:.3f}"})
    assert s.phases["before_rank"] == pytest.approx(5.0, abs=0.1)
    assert s.phases["python_and_imports"] >= age - 0.01  # rounded to ms
    assert "before_rank" not in Startup.at_entry({}).phases  # started by hand
    # a local mpiexec starts a rank within a tick or two of the command's stamp: zero, not dropped
    # (it failed the suite's first local 2-rank run once, the phase missing)
    stamp = f"{time.time() - age + 0.02:.3f}"
    ticks = Startup.at_entry({STARTED_AT_ENV: stamp}).phases["before_rank"]
    assert 0.0 <= ticks < 0.05
    # a skewed clock
    assert "before_rank" not in Startup.at_entry({STARTED_AT_ENV: f"{time.time() + 60:.3f}"}).phases
    assert "before_rank" not in Startup.at_entry({STARTED_AT_ENV: "soon"}).phases
    with s.phase("tokenize"):
        time.sleep(0.05)
    with s.phase("tokenize"):  # a phase met twice adds up
        time.sleep(0.05)
    s.tokens_cached = True
    out = s.as_dict(first_step_s=0.25)
    assert out["tokenize"] >= 0.1 and out["first_step"] == 0.25 and out["tokens_cached"] is True
    assert list(out)[:2] == ["before_rank", "python_and_imports"]
    assert list(out)[-3:] == ["first_step", "total_to_first_step", "tokens_cached"]
    assert out["total_to_first_step"] == pytest.approx(sum(v for k, v in out.items()
                                                           if isinstance(v, float)
                                                           and k != "total_to_first_step"),
                                                       abs=0.01)
