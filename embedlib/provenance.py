"""Where a result came from: the git commit of the code that made it (and whether that tree had changes)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import embedlib

CHECKOUT = Path(embedlib.__file__).resolve().parents[1]


def git_commit(checkout: Path = CHECKOUT) -> dict:
    """``{"commit": sha or None, "dirty": bool or None}`` of ``checkout`` (by default the one embedlib is imported
    from); None where it is not a git checkout (an installed wheel, a ``ray job submit`` copy of the working dir)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=checkout, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--", "embedlib"))}
