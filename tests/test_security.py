"""Issue 16: what a checkpoint, a URL or a manifest can make embedlib do.

- Resuming training never runs code planted in a DeepSpeed checkpoint (it is read with ``weights_only``).
- Credentials in a URL (``user:password@``, presigned query parameters) never reach an error message or a log line.
- A manifest must be well formed, name plain shard files, and agree with the shards it names (rows and widths).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cranfield_rows, tiny_pretrain_values, write_jsonl

from embedlib.index import IndexJobConfig, ManifestError, ShardedIndex, build_index
from embedlib.models.loading import CheckpointError
from embedlib.storage import redact_text, redact_url

SECRET = "s3cr3tvalue"


# --- redact_url -----------------------------------------------------------------------------------------------

PRESIGNED = (
    "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAFAKE%2F20260101%2Faws4"
    "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=ab12cd"
    "&X-Amz-Security-Token=tok3n"
)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("s3://AKIAFAKE:s3cr3tvalue@bucket/x", "s3://bucket/x"),
        ("file://user:s3cr3tvalue@/nonexistent", "file:///nonexistent"),  # no host: the old code raised TypeError
        ("s3://AKIAFAKE:wJalr/K7MDENG+bPxR@MyBucket/Key", "s3://MyBucket/Key"),  # '/' in the secret; case kept
        ("s3://KEYONLY@MyBucket/x", "s3://MyBucket/x"),
        ("http://u:p@Host.Example:9000/a", "http://Host.Example:9000/a"),
        ("s3://u:pw@host:notaport/x", "s3://host:notaport/x"),  # an invalid port: the old code raised ValueError
        ("s3://u:p@ss@bucket/x", "s3://bucket/x"),  # an unencoded '@' in the password
        ("http://[::1/x", "http://[::1/x"),  # malformed (urlsplit raises on it): returned as it is
        (
            PRESIGNED,
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20260101T000000Z"
            "&X-Amz-Expires=900&X-Amz-SignedHeaders=host",
        ),
        ("https://h/x?sig=1&token=2&access_token=3&key=4&Signature=5&versionId=6#frag", "https://h/x?versionId=6#frag"),
        ("https://h/x?AWSAccessKeyId=AKIA&Expires=9&Signature=abc", "https://h/x?Expires=9"),
        ("s3://bucket/x?versionId=3", "s3://bucket/x?versionId=3"),
        ("s3://bucket/mail/user@example.com/f", "s3://bucket/mail/user@example.com/f"),  # '@' in a key: kept
        ("/local/path", "/local/path"),
        ("relative/a@b:c?token=1", "relative/a@b:c?token=1"),  # not a URL: left as written
        (Path("/tmp/x"), "/tmp/x"),
    ],
)
def test_redact_url_is_total_keeps_case_and_strips_credentials(url, redacted):
    assert redact_url(url) == redacted


def test_redact_text_masks_the_secrets_wherever_a_library_quoted_them():
    url = "s3://AKIAFAKE:s3cr3tvalue@bucket/x?X-Amz-Signature=ab12cd34"
    text = f"Invalid bucket name 'AKIAFAKE:{SECRET}@bucket' for {url}; signature ab12cd34"
    redacted = redact_text(text, url)
    assert SECRET not in redacted and "ab12cd34" not in redacted and "s3://bucket/x" in redacted


# --- credentials never reach an error or a log line -----------------------------------------------------------

def assert_no_secret(err: BaseException, caplog, capsys) -> None:
    """Neither the error (with its chained causes, as a traceback shows them) nor any log line holds the secret."""
    shown = "".join(traceback.format_exception(err))
    assert SECRET not in shown, shown
    assert SECRET not in caplog.text
    out, errors = capsys.readouterr()
    assert SECRET not in out + errors


@pytest.mark.parametrize(
    "url", [f"file://user:{SECRET}@/nonexistent", f"s3://AKIAFAKE:{SECRET}@bucket/missing"], ids=["file", "s3"]
)
def test_opening_an_index_at_a_url_with_credentials_does_not_show_them(s3_endpoint, url, caplog, capsys):
    caplog.set_level(logging.DEBUG, logger="embedlib")
    with pytest.raises(ManifestError) as caught:
        ShardedIndex.open(url)
    assert "nonexistent" in str(caught.value) or "bucket/missing" in str(caught.value)
    assert_no_secret(caught.value, caplog, capsys)


@pytest.mark.parametrize(
    "url", [f"file://user:{SECRET}@/nonexistent/model", f"s3://AKIAFAKE:{SECRET}@bucket/model"], ids=["file", "s3"]
)
def test_loading_a_model_from_a_url_with_credentials_does_not_show_them(s3_endpoint, url, caplog, capsys):
    from embedlib.encoding.encoder import Encoder

    caplog.set_level(logging.DEBUG, logger="embedlib")
    with pytest.raises(CheckpointError) as caught:
        Encoder.from_pretrained(url, device="cpu")
    assert "model" in str(caught.value)
    assert_no_secret(caught.value, caplog, capsys)


def test_a_diffusion_lm_checkpoint_error_does_not_show_the_urls_credentials(
    tiny_models, tmp_path, monkeypatch, caplog, capsys
):
    from embedlib.models.diffusion_lm import load_diffusion_lm

    # fsspec reads file://user:password@/lm as the relative path "user:password@/lm": make it a real folder, a
    # LLaDA checkpoint whose config lacks a field (its error names the checkpoint).
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / f"user:{SECRET}@" / "lm"
    shutil.copytree(tiny_models["qwen3-causal"], folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llada", "d_model": 8}))
    with pytest.raises(CheckpointError, match=r"^file:///lm: LLaDA config has no 'n_heads'") as caught:
        load_diffusion_lm(f"file://user:{SECRET}@/lm", device="cpu")
    assert_no_secret(caught.value, caplog, capsys)


# --- manifests: well formed, plain shard names, in agreement with the shards -----------------------------------

@pytest.fixture(scope="module")
def built_index(ray_cluster, tmp_path_factory, tiny_models) -> Path:
    """A real two-shard int8 index of 40 Cranfield documents, built once for this module."""
    root = tmp_path_factory.mktemp("security-index")
    corpus = write_jsonl(root / "corpus.jsonl", cranfield_rows(40))
    build_index(IndexJobConfig(input=corpus, output=str(root / "index"), model=str(tiny_models["bert"]),
                               shard_size=20, batch_rows=16, show_progress=False))
    return root / "index"


@pytest.fixture
def index_copy(built_index, tmp_path) -> Path:
    """A private copy of the module's index, for one test to tamper with."""
    return Path(shutil.copytree(built_index, tmp_path / "index"))


def edit_manifests(index: Path, change: Callable[[dict], object]) -> None:
    """Apply ``change`` to the root manifest and the version's own copy (its result replaces the manifest when
    it returns something)."""
    version = json.loads((index / "manifest.json").read_text())["path"]
    for path in (index / "manifest.json", index / version / "manifest.json"):
        manifest = json.loads(path.read_text())
        result = change(manifest)
        path.write_text(json.dumps(manifest if result is None else result))


def rewrite_first_shard(index: Path, change: Callable[[pa.Table], pa.Table]) -> str:
    """Rewrite the first shard's parquet with ``change`` and record its new checksum in the manifests, so that
    only a check of the contents against the manifest can notice; returns the shard file's name."""
    manifest = json.loads((index / "manifest.json").read_text())
    name = f"{manifest['shards'][0]['name']}.parquet"
    path = index / manifest["path"] / name
    pq.write_table(change(pq.read_table(path)), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    edit_manifests(index, lambda m: m["shards"][0].update(parquet_sha256=digest))
    return name


def narrower_vectors(table: pa.Table) -> pa.Table:
    """The same rows with every stored vector 4 bytes shorter."""
    vectors = table.column("vector").to_pylist()
    width = len(vectors[0]) - 4
    column = pa.array([v[:width] for v in vectors], pa.binary(width))
    return table.set_column(table.schema.get_field_index("vector"), "vector", column)


def test_the_tampering_helpers_leave_a_consistent_index_readable(index_copy):
    rewrite_first_shard(index_copy, lambda table: table)
    index = ShardedIndex.open(index_copy)
    assert len(index) == 40
    assert all(index.search(["flow over a flat plate"], k=3).ids[0])


def test_a_shard_with_fewer_rows_than_its_manifest_entry_is_refused(index_copy):
    rows = json.loads((index_copy / "manifest.json").read_text())["shards"][0]["rows"]
    name = rewrite_first_shard(index_copy, lambda table: table.slice(0, rows - 5))
    with pytest.raises(ManifestError, match=rf"{name}: {rows - 5} rows, the manifest says {rows}$"):
        ShardedIndex.open(index_copy)


def test_a_shard_with_narrower_vectors_than_the_manifest_is_refused(index_copy):
    name = rewrite_first_shard(index_copy, narrower_vectors)
    with pytest.raises(ManifestError, match=rf"{name}: vectors of \d+ bytes, the manifest's .* needs \d+"):
        ShardedIndex.open(index_copy)


def dropping(*keys) -> Callable[[dict], None]:
    """A manifest change: delete the field at the path ``keys``."""
    def change(manifest: dict) -> None:
        *parents, last = keys
        for key in parents:
            manifest = manifest[key]
        del manifest[last]
    return change


def setting(value, *keys) -> Callable[[dict], None]:
    """A manifest change: set the field at the path ``keys`` to ``value``."""
    def change(manifest: dict) -> None:
        *parents, last = keys
        for key in parents:
            manifest = manifest[key]
        manifest[last] = value
    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dropping("dim"), r"missing field 'dim'"),
        (dropping("shards"), r"missing field 'shards'"),
        (dropping("shards", 0, "parquet_sha256"), r"shards\[0\]: missing field 'parquet_sha256'"),
        (setting("20", "shards", 1, "rows"), r"shards\[1\]\.rows must be an integer, got str"),
        (setting(None, "dim"), r"dim must be an integer, got NoneType"),
        (dropping("model", "weights_hash"), r"model: missing field 'weights_hash'"),
        (setting("int4", "quantization"), r"quantization must be one of"),
        (lambda manifest: [manifest], r"not an embedlib index manifest"),
        (setting("../../outside/x", "shards", 0, "name"), r"shard name '../../outside/x' is not a plain file name"),
    ],
    ids=["no-dim", "no-shards", "no-checksum", "rows-a-string", "dim-null", "no-weights-hash", "bad-quantization",
         "a-list", "shard-outside"],
)
def test_a_malformed_manifest_is_refused_naming_the_file(index_copy, change, message):
    edit_manifests(index_copy, change)
    with pytest.raises(ManifestError, match=message) as caught:
        ShardedIndex.open(index_copy)
    assert str(caught.value).startswith(str(index_copy / "manifest.json"))


# --- training resume never runs code from the checkpoint --------------------------------------------------------

class Planted:
    """Unpickling this creates ``marker``: what a planted checkpoint would do with any code it likes."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(model_states: Path, marker: Path) -> None:
    """Add a ``Planted`` object to a DeepSpeed model-states file, keeping everything DeepSpeed reads from it."""
    import torch

    state = torch.load(model_states, weights_only=False)  # our own checkpoint, from the run above
    state["planted"] = Planted(marker)
    torch.save(state, model_states)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_resume_refuses_a_checkpoint_with_a_planted_pickle(ray_cluster, tiny_models, shared_data, tmp_path):
    from embedlib.training.config import TrainConfig, from_dict
    from embedlib.training.data import text_rows, write_rows
    from embedlib.training.runner import train

    rows = text_rows([shared_data / "text" / "tinyshakespeare.txt"], chars_per_row=200)[:16]
    write_rows(rows, str(tmp_path / "text.jsonl"))
    values = tiny_pretrain_values(tiny_models["qwen3-causal"], tmp_path, "planted", max_steps=1)
    # (A clean resume from a real ZeRO-2 checkpoint, read weights-only: test_training_ray.py's killed worker.)
    first = train(from_dict(TrainConfig, values))
    model_states = sorted(Path(first.checkpoint).rglob("mp_rank_00_model_states.pt"))
    assert len(model_states) == 1
    marker = tmp_path / "code-ran"
    plant(model_states[0], marker)

    try:
        resumed = train(from_dict(TrainConfig, values | {"max_steps": 2}))  # resumes from the planted checkpoint
    except Exception as err:  # noqa: BLE001 - Ray Train wraps the worker's error in its own
        error = err
    else:
        error = None
        assert resumed.history[-1].get("resumed_from_step") == 1  # it did resume from the planted checkpoint
    assert not marker.exists(), "the planted pickle ran on resume"
    assert error is not None, "resuming from a checkpoint with a planted pickle did not fail"
    planted = re.escape(f"{model_states[0]}: not loaded: it holds io.open")  # named where it is stored
    assert re.search(planted, str(error)), str(error)
