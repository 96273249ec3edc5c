"""Issue 12, publishing under faults: concurrent builds into one output, a stale or crashed lease holder, corrupt
shard files, and an output the credentials cannot write — on the local filesystem and a real S3 endpoint (moto)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
from conftest import ROOT, all_ids, cranfield_rows, index_config, write_jsonl

from embedlib import storage
from embedlib.config import ConfigError
from embedlib.errors import UserError
from embedlib.index import ManifestError, ShardedIndex, build_index
from embedlib.index import build as build_module
from embedlib.index import manifest as manifests
from embedlib.index.lease import LeaseHeldError, LeaseLostError, PublishLease, lease_url

config = partial(index_config, shard_size=20)


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    """A folder for one test: local, or a fresh bucket on the moto S3 server."""
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("s3_bucket")


def race(count: int, attempt) -> tuple[list, list[BaseException]]:
    """Run ``attempt()`` in ``count`` threads released at the same moment; returns (results, errors)."""
    barrier = threading.Barrier(count)
    results, errors = [], []

    def run() -> None:
        barrier.wait()
        try:
            results.append(attempt())
        except Exception as err:  # noqa: BLE001 - collected for the test to assert on
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


# --- the lease ---------------------------------------------------------------------------------------------------

def test_of_racing_builds_exactly_one_takes_the_lease(root):
    index = storage.join(root, "index")
    for _ in range(3):
        winners, errors = race(4, lambda: PublishLease(index, 30).acquire())
        assert len(winners) == 1 and len(errors) == 3
        assert all(isinstance(e, LeaseHeldError) and "\n" not in str(e) for e in errors), errors
        assert f"build {winners[0].holder} (pid {os.getpid()}" in str(errors[0])
        winners[0].release()  # a released lease is free for the next round at once


def test_an_expired_lease_is_taken_over_and_its_holder_can_no_longer_publish(root):
    index = storage.join(root, "index")
    stalled = PublishLease(index, seconds=1).acquire()
    stalled.record_version(7)
    with pytest.raises(LeaseHeldError):
        PublishLease(index, 30).acquire()
    time.sleep(1.1)
    taker = PublishLease(index, 30).acquire()
    assert taker.avoid_version == 7  # the stalled holder may still be writing version 7's folder
    with pytest.raises(LeaseLostError, match=f"taken over by build {taker.holder}.*nothing published"):
        stalled.renew()
    stalled.release()  # must not free the taker's lease
    with pytest.raises(LeaseHeldError):
        PublishLease(index, 30).acquire()


HOLD_AND_HANG = """
import sys, time
from embedlib.index.lease import PublishLease
PublishLease(sys.argv[1], 600).acquire().record_version(3)
print("held", flush=True)
time.sleep(600)
"""


def test_a_killed_holder_does_not_block_the_next_build(root):
    """Killed on this host: its lease is taken over at once. On another host (where its death cannot be seen):
    once the lease expires, by waiting for it."""
    index = storage.join(root, "index")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_HANG, index], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LeaseHeldError, match=f"pid {holder.pid} on host"):
        PublishLease(index, 30).acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    taker = PublishLease(index, 30).acquire()
    assert taker.avoid_version == 0  # a dead holder writes nothing more: its version number may be reused

    record = json.loads(storage.read_bytes(lease_url(index)))
    data, token = storage.read_versioned(lease_url(index))
    moved = record | {"host": "another-host", "pid": 1, "expires_at": time.time() + 3}
    assert storage.replace_if_unchanged(lease_url(index), json.dumps(moved).encode(), token)
    with pytest.raises(LeaseHeldError, match="on host another-host.*expires in [0-3] s"):
        PublishLease(index, 30).acquire()
    PublishLease(index, 30).acquire(wait_seconds=20)
    assert time.time() >= moved["expires_at"]  # taken once expired, not before


# --- real builds into one output at once ------------------------------------------------------------------------

def published_versions(index: str) -> list[int]:
    fs, _ = storage.filesystem(index)
    return sorted(v for v, path in manifests.version_folders(index).items()
                  if fs.exists(f"{path.rstrip('/')}/{manifests.MANIFEST}"))


# Whole builds race on S3 only: the lease itself races on both stores above, and two builds cost 20 s.
@pytest.mark.parametrize("root", ["s3"], indirect=True)
def test_two_builds_started_together_publish_one_version_and_the_loser_says_why(
    ray_cluster, root, tiny_models
):
    spans = {"a": (0, 30), "b": (30, 60)}
    inputs = {name: write_jsonl(storage.join(root, f"{name}.jsonl"), cranfield_rows(*span))
              for name, span in spans.items()}
    index = storage.join(root, "index")
    names = iter(inputs)
    summaries, errors = race(2, lambda: build_index(config(inputs[next(names)], index, tiny_models["bert"])))
    assert len(summaries) == 1 and len(errors) == 1, errors
    assert isinstance(errors[0], LeaseHeldError) and isinstance(errors[0], UserError)
    assert "another build is publishing to this index" in str(errors[0]) and "\n" not in str(errors[0])
    assert summaries[0].version == 1 and published_versions(index) == [1]
    assert sorted(all_ids(index)) in [sorted(r["_id"] for r in cranfield_rows(*span)) for span in spans.values()]
    assert list(manifests.version_folders(index)) == [1]  # the loser wrote nothing there, not even staging
    fs, staging = storage.filesystem(storage.join(index, "_staging"))
    assert not fs.exists(staging) or not fs.find(staging)
    assert json.loads(storage.read_bytes(lease_url(index)))["released"]


def test_a_build_that_waits_for_the_lease_goes_on_once_it_is_released(root):
    index = storage.join(root, "index")
    first = PublishLease(index, 30).acquire()
    threading.Timer(1.0, first.release).start()
    started = time.time()
    second = PublishLease(index, 30).acquire(wait_seconds=10)
    assert time.time() - started >= 0.9 and second.token


@pytest.fixture(scope="module")
def small_index(ray_cluster, tmp_path_factory, tiny_models) -> Path:
    """A real IVF index of 30 Cranfield documents in two shards (parquet + FAISS files), built once."""
    root = tmp_path_factory.mktemp("corrupt")
    corpus = write_jsonl(str(root / "c.jsonl"), cranfield_rows(0, 30))
    build_index(config(corpus, str(root / "index"), tiny_models["bert"], index_type="ivf", nlist=2))
    return root / "index"


def test_a_version_number_is_published_once(small_index, root):
    index = storage.join(root, "index")
    fs, path = storage.filesystem(index)
    fs.put(str(small_index), path, recursive=True)
    manifest = manifests.read_manifest(index)
    replay = {key: value for key, value in manifest.items() if key != "base"} | {"counts": {"docs": 0}}
    with pytest.raises(ManifestError, match="version 1 was already published by another build"):
        manifests.publish(index, replay)
    assert manifests.read_manifest(index)["counts"] == manifest["counts"]
    assert manifests.read_manifest(storage.join(index, "v000001"))["counts"] == manifest["counts"]


# --- corrupt shard files ----------------------------------------------------------------------------------------

def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def one_byte_flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


@pytest.mark.parametrize("damage", [truncated, one_byte_flipped])
@pytest.mark.parametrize("suffix", ["parquet", "faiss"])
def test_a_damaged_shard_file_is_refused_naming_it_and_both_checksums(small_index, tmp_path, damage, suffix):
    import shutil

    index = shutil.copytree(small_index, tmp_path / "index")
    manifest = json.loads((index / "manifest.json").read_text())
    entry = manifest["shards"][-1]
    path = index / manifest["path"] / f"{entry['name']}.{suffix}"
    damaged = damage(path.read_bytes())
    path.write_bytes(damaged)
    import hashlib

    with pytest.raises(ManifestError) as caught:
        ShardedIndex.open(index)
    message = str(caught.value)
    assert message.startswith(f"{path}: checksum mismatch") and "\n" not in message
    assert entry[f"{suffix}_sha256"] in message and hashlib.sha256(damaged).hexdigest() in message


# --- an output the credentials cannot write: one line, before Ray or any encoding ---------------------------------

@pytest.fixture
def no_ray(monkeypatch):
    def refuse():
        raise AssertionError("the job connected to Ray before finding the bad output")

    monkeypatch.setattr(build_module, "ensure_ray", refuse)


def read_only_user(endpoint: str) -> dict[str, str]:
    """An IAM user (made on the moto server) allowed to list and read S3, not to write: its key pair."""
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint)
    name = f"reader-{time.time_ns()}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="read-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation",
                                                     "s3:ListAllMyBuckets"], "Resource": "*"}],
    }))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


@pytest.mark.parametrize("credentials", ["read-only", "unknown"])
def test_an_output_the_credentials_cannot_write_fails_before_ray_in_one_line(
    s3_endpoint, s3_bucket, tmp_path, tiny_models, monkeypatch, no_ray, credentials
):
    import s3fs

    corpus = write_jsonl(str(tmp_path / "c.jsonl"), cranfield_rows(0, 3))
    keys = read_only_user(s3_endpoint) if credentials == "read-only" else {
        "AWS_ACCESS_KEY_ID": "AKIAUNKNOWNKEY000000", "AWS_SECRET_ACCESS_KEY": "not-a-key"}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("moto.settings.INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks IAM policies from now
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(ConfigError, match=f"^output: cannot write to {s3_bucket}/index "
                                              r"\((PermissionError|OSError|ClientError)") as caught:
            build_index(config(corpus, f"{s3_bucket}/index", tiny_models["bert"]))
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert "\n" not in str(caught.value) and keys["AWS_SECRET_ACCESS_KEY"] not in str(caught.value)
