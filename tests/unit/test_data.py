from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpudist.errors import BadInput
from cpudist.train.data import glue_dir, load_custom, load_glue_tsv

# One train row per task, in the layout GLUE's download script writes.
GLUE_FILES = {
    "cola": ("gj04\t1\t\tOur friends won't buy this analysis.\n", None),
    "sst2": ("sentence\tlabel\nit 's a charming journey . \t1\n", None),
    "mrpc": ("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
             "1\t1\t2\tHe said \"yes .\tHe agreed .\n", None),
    "stsb": (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain\tf\t2012\t1\tnone\tnone\tA plane is taking off.\tAn air plane is taking "
        "off.\t5.000\n", None),
    "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n1\t1\t2\tHow?\tWhy?\t0\n", None),
    "mnli": ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t1\t1\tgov\tb\tb\tp\tp\tA man sleeps.\tA person rests.\tentailment\tentailment\n",
        "dev_matched.tsv"),
    "qnli": ("index\tquestion\tsentence\tlabel\n0\tWhat?\tThis.\tnot_entailment\n", None),
    "rte": ("index\tsentence1\tsentence2\tlabel\n0\tNo weapons found.\tWeapons "
            "found.\tnot_entailment\n", None),
    "wnli": ("index\tsentence1\tsentence2\tlabel\n0\tI stuck a pin.\tThe pin stuck.\t1\n", None),
}


def write_glue(tmp: Path, task: str, text: str, dev_name: str | None) -> Path:
    folder = tmp / task
    folder.mkdir()
    (folder / "train.tsv").write_text(text, encoding="utf-8")
    (folder / (dev_name or "dev.tsv")).write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize("task", sorted(GLUE_FILES))
def test_every_glue_layout(tmp_path: Path, task: str) -> None:
    text, dev = GLUE_FILES[task]
    data = load_glue_tsv(task, write_glue(tmp_path, task, text, dev))
    assert len(data.train) == len(data.validation) == 1
    assert all(col[0].strip() for col in data.train.texts)
    if task == "stsb":
        assert data.train.labels == (5.0,)
    elif task in ("rte", "qnli"):
        assert data.train.labels == (1.0,)  # not_entailment is id 1, as on the Hub


def test_mrpc_quotes_are_text(tmp_path: Path) -> None:
    text, _ = GLUE_FILES["mrpc"]
    data = load_glue_tsv("mrpc", write_glue(tmp_path, "mrpc", text, None))
    assert data.train.texts[0] == ('He said "yes .',)


def test_real_mrpc(shared_data: Path) -> None:
    data = load_glue_tsv("mrpc", shared_data / "glue" / "MRPC")
    assert (len(data.train), len(data.validation)) == (3668, 408)
    assert data.metrics == ("accuracy", "f1")


def test_glue_root_folder(shared_data: Path) -> None:
    assert glue_dir("rte", shared_data / "glue").name == "RTE"
    data = load_glue_tsv("sst2", shared_data / "glue")
    assert (len(data.train), len(data.validation)) == (67349, 872)


def test_missing_data_dir(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="data directory not found"):
        load_glue_tsv("mrpc", tmp_path / "nope")


def test_data_dir_without_train(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"no train\.tsv"):
        load_glue_tsv("mrpc", tmp_path)


def test_malformed_row_names_the_line(tmp_path: Path) -> None:
    folder = write_glue(tmp_path, "rte", "index\tsentence1\tsentence2\tlabel\n0\tonly two\n", None)
    with pytest.raises(BadInput, match=r"malformed row at .*train.tsv:2") as e:
        load_glue_tsv("rte", folder)
    assert e.value.exit_code == 2


def test_unknown_label(tmp_path: Path) -> None:
    folder = write_glue(tmp_path, "rte", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n",
                        None)
    with pytest.raises(BadInput, match="unknown label 'maybe'"):
        load_glue_tsv("rte", folder)


def test_empty_file(tmp_path: Path) -> None:
    folder = write_glue(tmp_path, "rte", "", None)
    with pytest.raises(BadInput, match="is empty"):
        load_glue_tsv("rte", folder)


def test_emotion_txt(shared_data: Path) -> None:
    data = load_custom(shared_data / "emotion" / "train.txt", shared_data / "emotion" / "val.txt",
                       ("text",), "label_name")
    assert len(data.label_names) == 6 and len(data.train) == 16000 and len(data.validation) == 2000
    assert data.metrics == ("accuracy", "f1_macro")


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl", ".txt"])
def test_custom_formats(tmp_path: Path, suffix: str) -> None:
    rows = [{"text": "good; fine", "label": "pos"}, {"text": "bad, awful", "label": "neg"},
            {"text": "meh", "label": "mid"}]
    path = tmp_path / f"train{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    elif suffix == ".csv":
        path.write_text("text,label\n" + "".join(f'"{r["text"]}",{r["label"]}\n' for r in rows))
    else:
        sep = "\t" if suffix == ".tsv" else ";"
        path.write_text(f"text{sep}label\n"
                        + "".join(f"{r['text']}{sep}{r['label']}\n" for r in rows))
    data = load_custom(path, path, ("text",), "label")
    assert data.label_names == ("mid", "neg", "pos")
    assert data.train.texts[0] == ("good; fine", "bad, awful", "meh")
    assert data.train.labels == (2.0, 1.0, 0.0)


def test_custom_label_column_absent(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,label_name\na,x\nb,y\n")
    with pytest.raises(BadInput, match=r"label column 'label' not found .*label_name"):
        load_custom(path, path, ("text",), "label")


def test_custom_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="data file not found"):
        load_custom(tmp_path / "none.csv", None, ("text",), "label")


def test_custom_needs_validation(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,label\na,x\nb,y\n")
    with pytest.raises(BadInput, match="no validation file"):
        load_custom(path, None, ("text",), "label")


def test_custom_unsupported_suffix(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_text("x")
    with pytest.raises(BadInput, match="unsupported data file type"):
        load_custom(path, path, ("text",), "label")


def test_validation_label_unseen_in_train(tmp_path: Path) -> None:
    train, dev = tmp_path / "t.csv", tmp_path / "d.csv"
    train.write_text("text,label\na,x\nb,y\n")
    dev.write_text("text,label\nc,z\n")
    with pytest.raises(BadInput, match="unknown label 'z'"):
        load_custom(train, dev, ("text",), "label")


def test_header_only_file(tmp_path: Path) -> None:
    folder = write_glue(tmp_path, "rte", "index\tsentence1\tsentence2\tlabel\n", None)
    with pytest.raises(BadInput, match="has no data rows"):
        load_glue_tsv("rte", folder)


def test_at_most_two_text_columns(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b,c,label\nx,y,z,p\nx,y,z,q\n")
    with pytest.raises(BadInput, match="3 text columns"):
        load_custom(path, path, ("a", "b", "c"), "label")


def test_custom_fractional_scores_are_regression(tmp_path: Path) -> None:
    # STS-B-like scores: before, every distinct score became a class of a 4-way classifier.
    train, dev = tmp_path / "t.csv", tmp_path / "d.csv"
    train.write_text("a,b,score\nx,y,3.8\nx,z,0.5\ny,z,5\nz,z,0.5\n")
    dev.write_text("a,b,score\nx,x,4.25\n")
    data = load_custom(train, dev, ("a", "b"), "score")
    assert data.is_regression and data.num_labels == 1 and data.label_names == ()
    assert data.metrics == ("pearson", "spearmanr")
    assert data.train.labels == (3.8, 0.5, 5.0, 0.5) and data.validation.labels == (4.25,)


def test_custom_integer_labels_stay_classes(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,label\na,0\nb,2\nc,10\n")
    data = load_custom(path, path, ("text",), "label")
    assert data.label_names == ("0", "2", "10") and not data.is_regression


def test_custom_scores_need_numbers_in_validation(tmp_path: Path) -> None:
    train, dev = tmp_path / "t.csv", tmp_path / "d.csv"
    train.write_text("text,score\na,0.5\nb,1.5\n")
    dev.write_text("text,score\nc,high\n")
    with pytest.raises(BadInput, match="non-numeric score"):
        load_custom(train, dev, ("text",), "score")
