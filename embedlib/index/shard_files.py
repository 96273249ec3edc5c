"""Reading a published shard's files: every byte checked against the manifest's checksum."""

from __future__ import annotations

import hashlib

from embedlib import storage
from embedlib.index.manifest import ManifestError


def read_checked(url: str, sha256: str) -> bytes:
    """A shard file's bytes, refused (``ManifestError``) when missing or not matching the manifest's checksum."""
    try:
        data = storage.read_bytes(url)
    except FileNotFoundError:
        raise ManifestError(f"{storage.redact_url(url)}: shard file missing (the manifest names it)") from None
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise ManifestError(f"{storage.redact_url(url)}: checksum mismatch, the manifest says sha256 {sha256}, the "
                            f"file ({len(data)} bytes) has {found}: a truncated, corrupt or replaced shard file; "
                            "nothing of it was read")
    return data
