"""Data bundled with the package: the Cranfield collection (1,400 abstracts, 225 judged queries, BEIR layout).

It is the embedded default corpus of the jobs and the text the tiny test tokenizers are trained on.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

SAMPLE_DATASET = Path(__file__).parent / "cranfield"


@cache
def sample_corpus_texts() -> list[str]:
    """The bundled corpus' document texts."""
    with open(SAMPLE_DATASET / "corpus.jsonl") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]
