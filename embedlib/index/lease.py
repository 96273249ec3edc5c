"""The publish lease: one build at a time per index URL, on any object store, without a lock server.

``<index>/_lease.json`` names the build that holds the index and until when. It is created with a create-only
write (S3 ``If-None-Match: *``, a hard link locally) and changed only by compare-and-swap (S3 ``If-Match:
<ETag>``, a ``flock``-guarded replace locally), so two builds can never both hold it. The holder renews it
every third of ``lease_seconds`` from a background thread; a released, expired or (on the same host) dead
holder's lease is taken over. A build that finds the lease held fails at once with ``LeaseHeldError`` (or
waits up to ``lease_wait_seconds`` for it); a holder that stalled past its expiry and was taken over finds
out at its next renewal and publishes nothing (``LeaseLostError``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from embedlib import storage
from embedlib.errors import UserError

LEASE = "_lease.json"
POLL_SECONDS = 0.5  # how often a waiting build looks at the lease again


class LeaseHeldError(UserError, RuntimeError):
    """Another build holds the index's publish lease; the message names it and when the lease expires."""


class LeaseLostError(UserError, RuntimeError):
    """This build's lease expired and another build took the index over; nothing was published."""


def lease_url(index_url: str) -> str:
    return storage.join(index_url, LEASE)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def stale(record: dict | None, now: float) -> bool:
    """Whether a lease record no longer protects anything: unreadable, released, expired, or held by a
    process on this host that is gone (a killed driver's lease need not be waited out)."""
    if not isinstance(record, dict):
        return True
    if record.get("released") or now >= float(record.get("expires_at", 0)):
        return True
    return record.get("host") == socket.gethostname() and not process_alive(int(record.get("pid", 0)))


def version_in_use(record: dict | None) -> int:
    """The version an expired holder recorded, when it may still be alive (neither released nor known dead)."""
    if not isinstance(record, dict) or record.get("released") or not isinstance(record.get("version"), int):
        return 0
    known_dead = record.get("host") == socket.gethostname() and not process_alive(int(record.get("pid", 0)))
    return 0 if known_dead else record["version"]


def parse(data: bytes) -> dict | None:
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def describe(record: dict, now: float) -> str:
    """``build <id> (pid P on host H) since <time>, expires in N s``, for messages."""
    since = datetime.fromtimestamp(float(record.get("acquired_at", 0)), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"build {record.get('holder')} (pid {record.get('pid')} on host {record.get('host')}) since {since}, "
            f"expires in {max(0.0, float(record.get('expires_at', 0)) - now):.0f} s unless renewed")


class PublishLease:
    """The lease on one index URL, held by this process (``acquire``), renewed until ``release``."""

    def __init__(self, index_url: str, seconds: float):
        self.url = lease_url(index_url)
        self.index_url = index_url
        self.seconds = seconds
        self.holder = uuid.uuid4().hex[:12]
        self.acquired_at = time.time()
        self.token: str | None = None
        self.lost: str | None = None  # why the lease was lost, once it was
        self.version: int | None = None  # the version this build writes (recorded once planned)
        # The version a stalled holder whose expired lease this build took over may still be writing (it may
        # be alive): not to be chosen again. 0 when the holder released, or is known dead, or had none.
        self.avoid_version = 0
        self.lock = threading.Lock()

    def record(self, released: bool = False) -> bytes:
        now = time.time()
        return json.dumps({
            "holder": self.holder, "host": socket.gethostname(), "pid": os.getpid(), "acquired_at": self.acquired_at,
            "renewed_at": now, "expires_at": 0 if released else now + self.seconds, "released": released,
            "version": self.version,
        }).encode()

    def acquire(self, wait_seconds: float = 0.0) -> PublishLease:
        """Take the lease: create it, or take over a stale one; if it is held, wait up to ``wait_seconds``
        for it, then raise ``LeaseHeldError``."""
        deadline = time.time() + wait_seconds
        while True:
            data = self.record()
            try:
                self.token = storage.write_bytes_create_only(self.url, data)
                return self
            except FileExistsError:
                pass
            try:
                current, token = storage.read_versioned(self.url)
            except FileNotFoundError:
                continue
            now = time.time()
            record = parse(current)
            if stale(record, now):
                if (new_token := storage.replace_if_unchanged(self.url, data, token)) is not None:
                    self.token = new_token
                    self.avoid_version = version_in_use(record)
                    return self
                continue  # another build took it over first: look again
            if now >= deadline:
                waited = f" (waited {wait_seconds:.0f} s)" if wait_seconds else ""
                raise LeaseHeldError(
                    f"{storage.redact_url(self.index_url)}: another build is publishing to this index{waited}: "
                    f"{describe(record, now)}; nothing done. Rerun when it has finished, or pass "
                    "--lease-wait-seconds to wait for it")
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - now)))

    def record_version(self, version: int) -> None:
        """Write the version this build publishes into the lease (a build taking over an expired lease
        will not choose it)."""
        self.version = version
        self.renew()

    def renew(self) -> None:
        """Push the expiry forward; ``LeaseLostError`` if another build took the lease over meanwhile."""
        with self.lock:
            if self.lost:
                raise LeaseLostError(self.lost)
            token = storage.replace_if_unchanged(self.url, self.record(), self.token)
            if token is None:
                current = parse(storage.read_versioned(self.url)[0]) if storage.exists(self.url) else None
                self.lost = (f"{storage.redact_url(self.index_url)}: this build's publish lease was taken over by "
                             f"{describe(current, time.time()) if current else 'another build'} (this build "
                             f"stalled past its {self.seconds:.0f} s lease); nothing published, rerun the job")
                raise LeaseLostError(self.lost)
            self.token = token

    def release(self) -> None:
        """Mark the lease released (a compare-and-swap: a lease taken over by another build stays theirs)."""
        with self.lock:
            if not self.lost and self.token:
                storage.replace_if_unchanged(self.url, self.record(released=True), self.token)
            self.lost = self.lost or "released"


@contextmanager
def held_lease(index_url: str, seconds: float, wait_seconds: float = 0.0) -> Iterator[PublishLease]:
    """Hold the publish lease of ``index_url`` for the ``with`` block, renewed every ``seconds / 3``."""
    lease = PublishLease(index_url, seconds).acquire(wait_seconds)
    stop = threading.Event()

    def renew_until_stopped() -> None:
        while not stop.wait(seconds / 3):
            try:
                lease.renew()
            except LeaseLostError:
                return
            except Exception:  # noqa: BLE001 - a storage hiccup: try again next time (expiry bounds the risk)
                continue

    renewer = threading.Thread(target=renew_until_stopped, name="publish-lease", daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        stop.set()
        renewer.join()
        lease.release()
