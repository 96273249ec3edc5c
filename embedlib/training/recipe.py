"""A trained model carries its own recipe: the resolved config and the code's commit, in a file beside it.

``training_config.json`` sits in every folder a training or merge job saves a model to (as nanoGPT keeps the
config in its checkpoint), so a model found later says how it was made.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import UTC, datetime

from embedlib import storage
from embedlib.provenance import git_commit

RECIPE_FILE = "training_config.json"


def write_recipe(model_folder: str | os.PathLike, config) -> None:
    """Write ``config`` (a config dataclass, every default filled in) and the git commit beside a saved model."""
    document = {
        "config_type": type(config).__name__,
        "config": dataclasses.asdict(config),
        "git": git_commit(),
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    storage.write_bytes_atomic(
        storage.join(str(model_folder), RECIPE_FILE), json.dumps(document, indent=2, default=str).encode()
    )


def read_recipe(model_folder: str | os.PathLike) -> dict:
    """The recipe written beside a saved model."""
    return json.loads(storage.read_bytes(storage.join(str(model_folder), RECIPE_FILE)))
