"""Object-storage helpers: every path in embedlib may be a local path or any fsspec URL (s3://, file://, ...).

S3 endpoints and credentials come from the environment / standard AWS config (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``~/.aws``); they are never passed through embedlib's own configs or written out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

import fsspec
from fsspec.core import url_to_fs

# Query parameters that carry credentials: presigned S3 (SigV4 and V2), GCS, Azure SAS, generic tokens.
SECRET_QUERY_KEYS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "signature", "awsaccesskeyid",
    "x-goog-signature", "x-goog-credential", "sig", "se", "sp", "sv", "token", "access_token", "key", "password",
})


def redact_url(url: str | os.PathLike) -> str:
    """``url`` with no credentials: no ``user:password@`` part and no signature or token query parameters.

    Never raises, and keeps everything else as written (a bucket's case included): it is what goes into every
    message, log line and manifest that names a location.
    """
    url = str(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        authority = authority.rsplit("@", 1)[1]
    path, question, query = tail.partition("?")
    if question:
        kept = [item for item in query.split("&") if item.split("=", 1)[0].lower() not in SECRET_QUERY_KEYS]
        query = "&".join(kept)
        question = "?" if kept else ""
    return f"{scheme}{sep}{authority}{slash}{path}{question}{query}"


def redact_text(text: str, url: str | os.PathLike) -> str:
    """``text`` (an error message from a storage library, say) with ``url`` in it replaced by its redacted
    form, and the URL's user and password removed wherever else they appear."""
    url = str(url)
    text = text.replace(url, redact_url(url))
    authority = url.partition("://")[2].partition("/")[0]
    if "@" in authority:
        for secret in authority.rsplit("@", 1)[0].split(":"):
            if secret:
                text = text.replace(secret, "***")
    return text


def is_local(url: str | os.PathLike) -> bool:
    """True for plain paths and file:// URLs."""
    url = str(url)
    return "://" not in url or url.startswith("file://")


def strip_file_scheme(url: str | os.PathLike) -> str:
    url = str(url)
    return url[len("file://") :] if url.startswith("file://") else url


def filesystem(url: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem for ``url`` and the path inside it.

    Object-store listings are never cached: Ray workers and the driver are long-lived, and a cached listing
    of a folder other processes write to (staging parts, versions) would hide their files.
    """
    if is_local(url):
        return url_to_fs(str(url))
    return url_to_fs(str(url), use_listings_cache=False)


def join(url: str | os.PathLike, *parts: str) -> str:
    return "/".join([str(url).rstrip("/"), *(p.strip("/") for p in parts)])


def exists(url: str | os.PathLike) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def read_bytes(url: str | os.PathLike) -> bytes:
    fs, path = filesystem(url)
    return fs.cat_file(path)


def write_bytes_atomic(url: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` so that readers see either the old object or the complete new one, never a part.

    Local files: write a temporary sibling, then ``os.replace``. Object stores: a single PUT is atomic
    per key; a temporary key is written first and copied so large writes are never half-visible.
    """
    fs, path = filesystem(url)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(tmp, "wb") as f:
        f.write(data)
    if is_local(url):
        os.replace(tmp, path)
    else:
        fs.copy(tmp, path)
        fs.rm(tmp)


def cache_root() -> Path:
    """Where remote folders are cached: ``$EMBEDLIB_CACHE`` or ``~/.cache/embedlib``."""
    return Path(os.environ.get("EMBEDLIB_CACHE", Path.home() / ".cache" / "embedlib"))


def remote_fingerprint(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A digest of a remote folder's listing (names, sizes, ETags/mtimes): changes when any file does."""
    listing = fs.find(path, detail=True)
    digest = hashlib.sha256()
    for name in sorted(listing):
        info = listing[name]
        version = info.get("ETag") or info.get("LastModified") or info.get("mtime") or ""
        digest.update(f"{name}|{info.get('size')}|{version}\n".encode())
    return digest.hexdigest()[:16]


def local_dir(url: str | os.PathLike) -> Path:
    """A local folder holding the contents of ``url``: the folder itself when local, else a cached download.

    The cache is keyed by the URL and the remote listing, so a changed remote folder is downloaded anew;
    a download is complete when its ``.complete`` marker exists, and an interrupted one is redone.
    """
    if is_local(url):
        return Path(strip_file_scheme(url))
    url = str(url)
    fs, path = filesystem(url)
    if not fs.exists(path):
        raise FileNotFoundError(f"{url}: no such object or prefix")
    name = url.rstrip("/").rsplit("/", 1)[-1] or "root"
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    target = cache_root() / "downloads" / f"{name}-{key}-{remote_fingerprint(fs, path)}"
    if (target / ".complete").exists():
        return target
    partial = target.with_name(target.name + f".partial-{uuid.uuid4().hex[:8]}")
    fs.get(path.rstrip("/") + "/", str(partial), recursive=True)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    (target / ".complete").touch()
    return target


def upload_dir(local: str | os.PathLike, url: str | os.PathLike) -> None:
    """Copy a local folder's files to ``url`` (a no-op when ``url`` is that same local folder)."""
    local = Path(local)
    if is_local(url):
        dest = Path(strip_file_scheme(url))
        if dest.resolve() == local.resolve():
            return
        shutil.copytree(local, dest, dirs_exist_ok=True)
        return
    fs, path = filesystem(url)
    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(file), f"{path.rstrip('/')}/{file.relative_to(local).as_posix()}")
