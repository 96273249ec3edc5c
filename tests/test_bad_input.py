"""The bad-input probe set: every kind of bad input fed to the index job is handled cleanly.

Whole-input problems (no such file, a JSON array, a missing text column, an unreadable parquet file, a wrong
model or output location) fail before Ray is used, with one ``UserError`` that names the field or the URL.
Row problems are quarantined: the row goes to the rejects with its reason and every other row is indexed.
Nothing crashes, and no valid document is lost.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import all_ids

from embedlib.config import ConfigError
from embedlib.errors import UserError
from embedlib.index import IndexJobConfig, InputError, RejectedRowsError, build_index
from embedlib.index import build as build_module

MAX_CHARS = 200


def line(value) -> bytes:
    return json.dumps(value).encode()


# --- whole-input problems: one line, before Ray -------------------------------------------------------------

def missing_path(tmp: Path) -> dict:
    return dict(input=str(tmp / "nowhere"))


def empty_folder(tmp: Path) -> dict:
    (tmp / "empty").mkdir()
    return dict(input=str(tmp / "empty"))


def folder_without_data_files(tmp: Path) -> dict:
    (tmp / "txt").mkdir()
    (tmp / "txt" / "notes.txt").write_text("hello\n")
    return dict(input=str(tmp / "txt"))


def json_array_file(tmp: Path) -> dict:
    (tmp / "docs.json").write_text(json.dumps([{"_id": "a", "text": "x"}]))
    return dict(input=str(tmp / "docs.json"))


def jsonl_without_text_column(tmp: Path) -> dict:
    (tmp / "c.jsonl").write_bytes(line({"_id": "a", "body": "x"}) + b"\n")
    return dict(input=str(tmp / "c.jsonl"))


def gzip_jsonl_without_text_column(tmp: Path) -> dict:
    (tmp / "c.jsonl").write_bytes(gzip.compress(line({"_id": "a", "body": "x"}) + b"\n"))
    return dict(input=str(tmp / "c.jsonl"))


def parquet_without_text_column(tmp: Path) -> dict:
    pq.write_table(pa.table({"id": ["a"], "body": ["x"]}), tmp / "c.parquet")
    return dict(input=str(tmp / "c.parquet"))


def wrong_text_column_flag(tmp: Path) -> dict:
    (tmp / "c.jsonl").write_bytes(line({"_id": "a", "text": "x"}) + b"\n")
    return dict(input=str(tmp / "c.jsonl"), text_column="body")


def corrupt_parquet(tmp: Path) -> dict:
    (tmp / "c.parquet").write_bytes(b"this is not parquet at all")
    return dict(input=str(tmp / "c.parquet"))


def parquet_named_jsonl(tmp: Path) -> dict:
    pq.write_table(pa.table({"_id": ["a"], "text": ["x"]}), tmp / "c.jsonl")
    return dict(input=str(tmp / "c.jsonl"))


def mixed_formats(tmp: Path) -> dict:
    (tmp / "mixed").mkdir()
    (tmp / "mixed" / "a.jsonl").write_bytes(line({"_id": "a", "text": "x"}) + b"\n")
    pq.write_table(pa.table({"id": ["b"], "text": ["y"]}), tmp / "mixed" / "b.parquet")
    return dict(input=str(tmp / "mixed"))


def jsonl_read_as_parquet(tmp: Path) -> dict:
    (tmp / "c.jsonl").write_bytes(line({"_id": "a", "text": "x"}) + b"\n")
    return dict(input=str(tmp / "c.jsonl"), input_format="parquet")


def missing_model(tmp: Path) -> dict:
    return dict(model=str(tmp / "no-model"))


def model_folder_without_config(tmp: Path) -> dict:
    (tmp / "model").mkdir()
    (tmp / "model" / "weights.bin").write_bytes(b"\0")
    return dict(model=str(tmp / "model"))


def output_is_a_file(tmp: Path) -> dict:
    (tmp / "out").write_text("a file")
    return dict(output=str(tmp / "out"))


def output_under_a_file(tmp: Path) -> dict:
    (tmp / "out").write_text("a file")
    return dict(output=str(tmp / "out" / "index"))


def zero_shard_size(tmp: Path) -> dict:
    return dict(shard_size=0)


def unknown_quantization(tmp: Path) -> dict:
    return dict(quantization="int4")


def unknown_method(tmp: Path) -> dict:
    return dict(method="colbert")


WHOLE_INPUT_CASES = [
    (missing_path, InputError, "no such file or folder"),
    (empty_folder, InputError, "no jsonl or parquet files found"),
    (folder_without_data_files, InputError, "no jsonl or parquet files found"),
    (json_array_file, InputError, "is a JSON array, not JSON lines"),
    (jsonl_without_text_column, InputError, r"no column 'text' in c.jsonl \(columns: _id, body\)"),
    (gzip_jsonl_without_text_column, InputError, r"no column 'text' in c.jsonl \(columns: _id, body\)"),
    (parquet_without_text_column, InputError, r"no column 'text' in c.parquet \(columns: id, body\)"),
    (wrong_text_column_flag, InputError, "no column 'body'"),
    (corrupt_parquet, InputError, "c.parquet is not a readable parquet file"),
    (parquet_named_jsonl, InputError, "c.jsonl is a parquet file"),
    (mixed_formats, InputError, "cannot tell the format"),
    (jsonl_read_as_parquet, InputError, "c.jsonl is not a readable parquet file"),
    (missing_model, ConfigError, "model: .*no-model is not a checkpoint folder"),
    (model_folder_without_config, ConfigError, "model: .* is not a checkpoint folder"),
    (output_is_a_file, ConfigError, "output: .*out is a file"),
    (output_under_a_file, ConfigError, "output: cannot write to"),
    (zero_shard_size, ConfigError, "shard_size: must be a positive integer"),
    (unknown_quantization, ConfigError, "quantization: must be one of"),
    (unknown_method, ConfigError, "method: must be one of"),
]


@pytest.fixture
def no_ray(monkeypatch):
    """Fails the test if the build gets as far as connecting to Ray."""
    def refuse():
        raise AssertionError("the job connected to Ray before finding the bad input")

    monkeypatch.setattr(build_module, "ensure_ray", refuse)


@pytest.mark.parametrize(("make", "error", "message"), WHOLE_INPUT_CASES, ids=[c[0].__name__ for c in WHOLE_INPUT_CASES])
def test_a_bad_input_fails_before_ray_with_one_line(tmp_path, tiny_models, no_ray, make, error, message):
    corpus = tmp_path / "good.jsonl"
    corpus.write_bytes(line({"_id": "a", "text": "x"}) + b"\n")
    values = dict(input=str(corpus), output=str(tmp_path / "index"), model=str(tiny_models["bert"]),
                  show_progress=False)
    with pytest.raises(error, match=message) as caught:
        build_index(IndexJobConfig(**(values | make(tmp_path))))
    assert isinstance(caught.value, UserError) and "\n" not in str(caught.value)
    assert not (tmp_path / "index" / "manifest.json").exists()


def test_an_s3_output_in_a_missing_bucket_is_refused_not_created(s3_endpoint, tmp_path, tiny_models, no_ray):
    import boto3

    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(line({"_id": "a", "text": "x"}) + b"\n")
    with pytest.raises(ConfigError, match="output: the bucket of s3://no-such-bucket/index does not exist"):
        build_index(IndexJobConfig(input=str(corpus), output="s3://no-such-bucket/index",
                                   model=str(tiny_models["bert"])))
    buckets = [b["Name"] for b in boto3.client("s3", endpoint_url=s3_endpoint).list_buckets()["Buckets"]]
    assert "no-such-bucket" not in buckets


def test_credentials_in_an_input_url_are_not_in_the_error(s3_endpoint, tmp_path, tiny_models, no_ray):
    with pytest.raises(InputError) as caught:
        build_index(IndexJobConfig(input="s3://AKIAFAKEKEY:pl4nted-s3cret@no-such-bucket/corpus",
                                   output=str(tmp_path / "i"), model=str(tiny_models["bert"])))
    assert "pl4nted-s3cret" not in str(caught.value) and "no-such-bucket/corpus" in str(caught.value)


# --- row problems: quarantined one row at a time, in one build ----------------------------------------------

VALID_ROWS = [
    line({"_id": "plain", "title": "t", "text": "a plain document"}),
    line({"_id": 7, "text": "an integer id"}),
    line({"_id": "title-not-a-string", "title": 5, "text": "the title is ignored"}),
    line({"_id": "null-title", "title": None, "text": "no title"}),
    line({"_id": "empty-text", "text": ""}),
    line({"_id": "nul-byte", "text": "a \u0000 b"}),
    line({"_id": "crlf", "text": "windows line end"}) + b"\r",
    line({"_id": "unicode", "text": "caf\u00e9 \u4e2d\u6587 \U0001f600"}),
    line({"_id": "at-limit", "text": "x" * MAX_CHARS}),
    line({"_id": "extra-fields", "text": "more keys", "meta": {"a": [1, 2]}}),
    line({"_id": "whitespace-text", "text": "   "}),
    line({"_id": "  spaced id  ", "text": "ids are taken as they are"}),
]
REJECTED_ROWS = [
    (line({"title": "x", "text": "no id key"}), "missing id"),
    (line({"_id": None, "text": "null id"}), "missing id"),
    (line({"_id": "", "text": "empty id"}), "missing id"),
    (line({"_id": 1.5, "text": "float id"}), "id is float, not a string or integer"),
    (line({"_id": True, "text": "bool id"}), "id is bool, not a string or integer"),
    (line({"_id": [1], "text": "list id"}), "id is list, not a string or integer"),
    (line({"_id": {"a": 1}, "text": "dict id"}), "id is dict, not a string or integer"),
    (b'{"_id": "\\ud800", "text": "lone surrogate id"}', "id is not valid unicode (lone surrogate)"),
    (line({"_id": "no-text-key"}), "null text"),
    (line({"_id": "null-text", "text": None}), "null text"),
    (line({"_id": "number-text", "text": 123}), "non-string text"),
    (line({"_id": "list-text", "text": ["a"]}), "non-string text"),
    (line({"_id": "dict-text", "text": {"a": 1}}), "non-string text"),
    (line({"_id": "bool-text", "text": True}), "non-string text"),
    (line({"_id": "too-long", "text": "x" * (MAX_CHARS + 1)}), f"text over {MAX_CHARS} chars"),
    (b'{"_id": "surrogate-text", "text": "a \\udc00 b"}', "text is not valid unicode (lone surrogate)"),
    (b'{"_id": "surrogate-title", "title": "\\ud83d", "text": "b"}', "text is not valid unicode (lone surrogate)"),
    (b"{not json", "invalid json"),
    (b'{"_id": "truncated", "text": "ab', "invalid json"),
    (b"[1, 2]", "invalid json"),
    (b"42", "invalid json"),
    (b'"a string"', "invalid json"),
    (b"null", "invalid json"),
    (b"\xff\xfe not utf-8 and not json", "undecodable bytes"),
    (b'{"_id": "latin-1", "text": "caf\xe9"}', "undecodable bytes"),
    (line({"_id": "twice", "text": "first"}), "duplicate id"),
    (line({"_id": "twice", "text": "second"}), "duplicate id"),
    (line({"_id": "thrice", "text": "1"}), "duplicate id"),
    (line({"_id": "thrice", "text": "2"}), "duplicate id"),
    (line({"_id": "thrice", "text": "3"}), "duplicate id"),
    (line({"_id": "across-files", "text": "in main.jsonl"}), "duplicate id"),
]
PACKED_ROWS = [line({"_id": "gzip-1", "text": "from a gzip file named .jsonl"}), line({"_id": "gzip-2", "text": "b"})]


def test_bad_rows_are_quarantined_and_every_valid_row_is_indexed(ray_cluster, tmp_path, tiny_models):
    folder = tmp_path / "corpus"
    folder.mkdir()
    rows = VALID_ROWS + [row for row, _ in REJECTED_ROWS]
    (folder / "main.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\n".join(rows[:3]) + b"\n\n   \n"
                                        + b"\n".join(rows[3:]) + b"\n")  # a BOM; blank lines are not rows
    (folder / "more.jsonl").write_bytes(line({"_id": "across-files", "text": "in more.jsonl"}) + b"\n")
    (folder / "packed.jsonl").write_bytes(gzip.compress(b"\n".join(PACKED_ROWS) + b"\n"))
    (folder / "broken.jsonl").write_bytes(gzip.compress(b"x" * 1000)[:20])

    summary = build_index(IndexJobConfig(input=str(folder), output=str(tmp_path / "index"),
                                         model=str(tiny_models["bert"]), max_text_chars=MAX_CHARS,
                                         show_progress=False))

    expected = {}
    for _, reason in [*REJECTED_ROWS, (None, "duplicate id")]:
        expected[reason] = expected.get(reason, 0) + 1
    gzip_reason = next(r for r in summary.rejects_by_reason if r.startswith("unreadable gzip"))
    expected[gzip_reason] = 1
    assert summary.rejects_by_reason == expected
    indexed = all_ids(tmp_path / "index")
    valid_ids = {json.loads(r)["_id"] for r in VALID_ROWS + PACKED_ROWS}
    assert sorted(indexed) == sorted(str(i) for i in valid_ids)
    assert summary.docs_in == len(VALID_ROWS) + len(REJECTED_ROWS) + 1 + len(PACKED_ROWS) + 1
    rejects = [json.loads(x) for f in Path(summary.rejects_url).glob("*.jsonl") for x in f.read_text().splitlines()]
    assert sorted(r["reason"] for r in rejects) == sorted(r for r, n in expected.items() for _ in range(n))
    assert {r["id"] for r in rejects if r["reason"] == "duplicate id"} == {"twice", "thrice", "across-files"}
    assert all(r["line"] for r in rejects if not r["reason"].startswith("unreadable gzip"))
    assert f"{summary.rejected} rejected" in str(summary)

    with pytest.raises(RejectedRowsError, match=f"{summary.rejected - 7} rows rejected"):  # strict: before shards
        build_index(IndexJobConfig(input=str(folder), output=str(tmp_path / "strict"), model=str(tiny_models["bert"]),
                                   max_text_chars=MAX_CHARS, strict=True, show_progress=False))
    assert not (tmp_path / "strict" / "manifest.json").exists()


def test_bad_parquet_rows_are_quarantined(ray_cluster, tmp_path, tiny_models):
    table = pa.table({
        "id": pa.array(["ok-1", None, "null-text", "twice", "twice", "ok-2"]),
        "text": pa.array([b"fine", b"no id", None, b"a", b"b", b"caf\xc3\xa9"], pa.binary()),
    })
    pq.write_table(table, tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([5, 6]), "text": pa.array([b"\xff bad bytes", b"int id"])}),
                   tmp_path / "b.parquet")
    folder = tmp_path / "in"
    folder.mkdir()
    (tmp_path / "a.parquet").rename(folder / "a.parquet")
    (tmp_path / "b.parquet").rename(folder / "b.parquet")
    summary = build_index(IndexJobConfig(input=str(folder), output=str(tmp_path / "index"),
                                         model=str(tiny_models["bert"]), show_progress=False))
    assert summary.rejects_by_reason == {"missing id": 1, "null text": 1, "duplicate id": 2, "undecodable bytes": 1}
    assert sorted(all_ids(tmp_path / "index")) == ["6", "ok-1", "ok-2"]
