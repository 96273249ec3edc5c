"""Jobs run by ``ray job submit --working-dir``: the job runs in a copy of the working dir on the cluster.

A relative path given to such a job points into that temporary copy (not into the submitting directory, which
the cluster cannot see), and an output written there is deleted with it. Jobs therefore refuse relative local
data paths when they were submitted with a working dir, naming the field and saying why.
"""

from __future__ import annotations

import json
import os

from embedlib.config import ConfigError

# Set by Ray's job supervisor in the environment of a submitted job's driver (the job's runtime env inside).
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def submitted_working_dir() -> str | None:
    """The ``--working-dir`` this job was submitted with, or None when it was not submitted with one."""
    raw = os.environ.get(RAY_JOB_CONFIG_ENV)
    if not raw:
        return None
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return None
    return runtime_env.get("working_dir") or None


def is_relative_local_path(path: str) -> bool:
    return "://" not in path and not os.path.isabs(os.path.expanduser(path))


def check_submitted_paths(paths: dict[str, str | None]) -> None:
    """Refuse (``ConfigError`` naming the field) a relative local path in a job submitted with a working dir."""
    if submitted_working_dir() is None:
        return
    for field, path in paths.items():
        if path and is_relative_local_path(str(path)):
            raise ConfigError(
                f"{field}: {path!r} is a relative path, but this job was submitted with `ray job submit "
                f"--working-dir`, so it runs in a temporary copy of that folder on the cluster ({os.getcwd()}) "
                "and the path would point there, not to the folder you submitted from; give an absolute path "
                "that every node can read, or a URL (s3://...)"
            )
