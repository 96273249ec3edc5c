"""Object-storage helpers: every path in embedlib may be a local path or any fsspec URL (s3://, file://, ...).

S3 endpoints and credentials come from the environment / standard AWS config (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``~/.aws``); they are never passed through embedlib's own configs or written out.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import uuid
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import fsspec
from fsspec.core import url_to_fs

# A URL's user-info: ``user:password@`` (the password may hold '/', as AWS secret keys often do; one that starts
# with digits and a '/' is read as a port and a path instead) or ``user@``.
USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@:]*:(?!\d+/)[^@]*|[^/?#@:]*)@")
# Query parameters that carry credentials (compared lowercased): presigned S3 (SigV4: X-Amz-Signature,
# X-Amz-Credential, X-Amz-Security-Token; V2: AWSAccessKeyId, Signature), GCS, Azure SAS (sig), generic keys and
# tokens; and any parameter whose name ends in one of SECRET_QUERY_SUFFIXES (access_token, client_secret, ...).
SECRET_QUERY_KEYS = frozenset({
    "sig", "signature", "key", "apikey", "api_key", "awsaccesskeyid", "googleaccessid", "password", "passwd",
    "secret", "token",
})
SECRET_QUERY_SUFFIXES = ("signature", "credential", "token", "secret", "password")
MIN_SECRET_CHARS = 3  # shorter credentials are not masked inside other text (they would garble it)
# S3 requests that fail on a connection error, a timeout, throttling or a 5xx are retried by botocore with
# exponential backoff and jitter ("standard" mode; up to 20 s between tries, about a minute in all): an endpoint
# that goes away for a few seconds costs a pause, not the job. ``AWS_MAX_ATTEMPTS``/``AWS_RETRY_MODE`` override.
S3_RETRIES = {"mode": "standard", "max_attempts": 10}
S3_TIMEOUTS = {"connect_timeout": 10, "read_timeout": 60}


def redact_url(url: str | os.PathLike) -> str:
    """``url`` with no credentials: no ``user:password@`` part and no signature, key or token query parameter.

    Never raises, and keeps everything else as written (a bucket's case included): it is what goes into every
    message, log line and manifest that names a location. Anything without a ``scheme://`` is returned as is.
    """
    return split_credentials(url)[0]


def redact_text(text: str, url: str | os.PathLike) -> str:
    """``text`` (an error message from a storage library, say) with ``url`` in it replaced by its redacted
    form, and the URL's credentials masked (``***``) wherever else they appear (a library may quote them apart)."""
    redacted, secrets = split_credentials(url)
    text = text.replace(str(url), redacted)
    for secret in sorted({form for s in secrets for form in (s, unquote(s))}, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, "***")
    return text


def split_credentials(url: str | os.PathLike) -> tuple[str, list[str]]:
    """``url`` without its credentials (see ``redact_url``), and the credentials taken out of it."""
    text = str(url)
    if "://" not in text:
        return text, []
    secrets: list[str] = []
    while match := USERINFO.match(text):  # more than one '@' (an unencoded one in a password): strip them all
        secrets += [part for part in match["userinfo"].split(":", 1) if part]
        text = match["scheme"] + text[match.end():]
    head, hash_, fragment = text.partition("#")
    base, question, query = head.partition("?")
    if not question:
        return text, secrets
    kept = []
    for item in query.split("&"):
        name, _, value = item.partition("=")
        if is_secret_parameter(name):
            secrets += [value] if value else []
        else:
            kept.append(item)
    return base + ("?" + "&".join(kept) if kept else "") + hash_ + fragment, secrets


def is_secret_parameter(name: str) -> bool:
    """Whether a URL query parameter carries a credential (``SECRET_QUERY_KEYS``, ``SECRET_QUERY_SUFFIXES``)."""
    name = unquote(name).lower()
    return name in SECRET_QUERY_KEYS or name.endswith(SECRET_QUERY_SUFFIXES)


def error_text(err: BaseException, url: str | os.PathLike) -> str:
    """``"<ErrorType>: <message>"`` for a storage error about ``url``, with the URL's secrets masked."""
    return f"{type(err).__name__}: {redact_text(str(err), url)}"


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
    of a folder other processes write to (staging parts, versions) would hide their files. S3 requests are
    retried with backoff (``s3_options``).
    """
    if is_local(url):
        return url_to_fs(str(url))
    return url_to_fs(str(url), use_listings_cache=False, **s3_options(url))


def s3_options(url: str | os.PathLike) -> dict:
    """s3fs options for ``url``: botocore's retries and timeouts (``S3_RETRIES``); none for other protocols."""
    if not str(url).startswith(("s3://", "s3a://")):
        return {}
    config = dict(S3_TIMEOUTS)
    if not (os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE")):
        config["retries"] = S3_RETRIES
    return {"config_kwargs": config}


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


def write_bytes_create_only(url: str | os.PathLike, data: bytes) -> str:
    """Write ``data`` only if nothing is at ``url`` yet, else ``FileExistsError`` (whoever writes first wins);
    returns the written state's token (see ``read_versioned``).

    Local files: a complete temporary sibling hard-linked into place (``link`` fails if the name exists). Object
    stores: one PUT with ``If-None-Match: *`` (s3fs's ``mode="create"``; AWS S3 and moto honour it).
    """
    fs, path = filesystem(url)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    if not is_local(url):
        written = fs.pipe_file(path, data, mode="create")
        return written["ETag"] if isinstance(written, dict) else read_versioned(url)[1]
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as f:
        f.write(data)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return hashlib.sha256(data).hexdigest()


def read_versioned(url: str | os.PathLike) -> tuple[bytes, str]:
    """An object's bytes and a token naming that exact state (its S3 ETag, read in the same GET; locally a
    digest of the bytes), for ``replace_if_unchanged``. ``FileNotFoundError`` when there is none."""
    if is_local(url):
        data = Path(strip_file_scheme(url)).read_bytes()
        return data, hashlib.sha256(data).hexdigest()
    bucket, key = s3_bucket_key(url)
    try:
        response = s3_client().get_object(Bucket=bucket, Key=key)
    except s3_client().exceptions.NoSuchKey:
        raise FileNotFoundError(redact_url(url)) from None
    return response["Body"].read(), response["ETag"]


def replace_if_unchanged(url: str | os.PathLike, data: bytes, token: str) -> str | None:
    """Replace the object at ``url`` with ``data`` only if it is still in the state ``token`` names (a
    compare-and-swap); returns the new state's token, or None when the object had changed (nothing written).

    Object stores: a PUT with ``If-Match: <ETag>`` (AWS S3 since 2024, moto; through boto3, as s3fs does not
    expose it). Local files: read, compare and ``os.replace`` under an exclusive ``flock`` of a sidecar file.
    """
    if not is_local(url):
        bucket, key = s3_bucket_key(url)
        client = s3_client()
        try:
            return client.put_object(Bucket=bucket, Key=key, Body=data, IfMatch=token)["ETag"]
        except client.exceptions.ClientError as err:
            if err.response.get("Error", {}).get("Code") in CAS_CONFLICTS:
                return None
            raise
    path = Path(strip_file_scheme(url))
    with open(path.with_name(path.name + ".cas-lock"), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            current = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(current).hexdigest() != token:
            return None
        write_bytes_atomic(path, data)
        return hashlib.sha256(data).hexdigest()


def bucket_exists(url: str | os.PathLike) -> bool:
    """Whether the bucket of an object-store URL exists; ``PermissionError`` when the credentials are refused
    (s3fs's ``exists`` would say False, and the message would blame a missing bucket)."""
    fs, path = filesystem(url)
    bucket = path.split("/", 1)[0]
    if not str(url).startswith(("s3://", "s3a://")):
        return fs.exists(bucket)
    client = s3_client()
    try:
        client.head_bucket(Bucket=bucket)
    except client.exceptions.ClientError as err:
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404:
            return False
        if status == 403:
            raise PermissionError(f"access to bucket {bucket} denied (HTTP 403): the credentials are unknown, "
                                  "expired or not allowed to use it") from None
        raise
    return True


def s3_bucket_key(url: str | os.PathLike) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``."""
    if not str(url).startswith(("s3://", "s3a://")):
        raise NotImplementedError(f"{redact_url(url)}: conditional writes are implemented for s3:// and local paths")
    fs, path = filesystem(url)
    bucket, key, _ = fs.split_path(path)
    return bucket, key


# What S3 answers a conditional PUT whose condition failed: the object changed, was deleted, or another
# conditional write to it is in flight.
CAS_CONFLICTS = ("PreconditionFailed", "NoSuchKey", "ConditionalRequestConflict")
S3_ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                  "AWS_PROFILE", "AWS_DEFAULT_REGION")


def s3_client():
    """A boto3 S3 client for the calls s3fs does not expose (conditional PUTs); endpoint and credentials from
    the environment and AWS config, as for s3fs (one client per setting of those variables)."""
    return s3_client_for(tuple(os.environ.get(name) for name in S3_ENVIRONMENT))


@cache
def s3_client_for(environment: tuple) -> object:
    import boto3

    return boto3.session.Session().client("s3")


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
        raise FileNotFoundError(f"{redact_url(url)}: no such object or prefix")
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
