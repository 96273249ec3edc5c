"""The encoder core: bidirectional backbones, pooling, quantization, save/load, bad input."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from conftest import centred_model
from transformers import AutoModel

from embedlib import CheckpointError, Encoder
from embedlib.encoding.batching import plan_batches
from embedlib.encoding.formats import hamming_distance, similarity
from embedlib.encoding.quantize import int8_straight_through
from embedlib.eval.beir import load_beir
from embedlib.models.bidirectional import BidirectionalQwen3Model

SENTENCES = [
    "The cat sat on the mat.",
    "Mean pooling averages the token states of a sentence.",
    "Bidirectional attention lets every token see the whole text.",
    "A much longer sentence that keeps going, so that the batch has to pad the shorter ones quite a bit more.",
    "",
]


@pytest.fixture(scope="module")
def qwen3(tiny_models) -> Encoder:
    return Encoder.from_pretrained(tiny_models["qwen3-causal"])


@pytest.fixture(scope="module")
def minilm(minilm_path) -> Encoder:
    return Encoder.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def scifact_queries(shared_data) -> list[str]:
    return list(load_beir(str(shared_data / "scifact")).judged_queries().values())[:64]


def first_token_state(model, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state[0, 0]


# --- bidirectionality ----------------------------------------------------------------------------------


def test_qwen3_backbone_is_bidirectional(qwen3):
    ids = torch.tensor([qwen3.tokenizer("the wing in a slipstream")["input_ids"]])
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 7) % len(qwen3.tokenizer)
    assert isinstance(qwen3.model, BidirectionalQwen3Model)
    assert not torch.allclose(first_token_state(qwen3.model, ids), first_token_state(qwen3.model, changed))


def test_causal_reference_first_token_ignores_the_last(tiny_models, qwen3):
    causal = AutoModel.from_pretrained(tiny_models["qwen3-causal"]).eval()
    ids = torch.tensor([qwen3.tokenizer("the wing in a slipstream")["input_ids"]])
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 7) % len(qwen3.tokenizer)
    assert torch.allclose(first_token_state(causal, ids), first_token_state(causal, changed))


def test_every_attention_layer_is_non_causal(qwen3):
    flags = [m.is_causal for m in qwen3.model.modules() if hasattr(m, "is_causal")]
    assert len(flags) == qwen3.model.config.num_hidden_layers
    assert not any(flags)


@pytest.mark.parametrize("which", ["qwen3", "minilm"])
def test_padding_invariance(which, request):
    encoder = request.getfixturevalue(which)
    alone = encoder.encode([SENTENCES[0]], quantization="float")
    batched = encoder.encode(SENTENCES, quantization="float")
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)
    assert encoder.last_stats.batches == 1  # the short text really was padded next to the long one


# --- pooling and quantization --------------------------------------------------------------------------


def test_int8_and_binary_follow_the_formulas(qwen3):
    pooled = qwen3.encode(SENTENCES, quantization="float")
    int8 = qwen3.encode(SENTENCES, quantization="int8")
    binary = qwen3.encode(SENTENCES, quantization="binary")
    assert int8.dtype == np.int8 and binary.dtype == np.uint8
    np.testing.assert_array_equal(int8, np.round(127 * np.tanh(pooled)).astype(np.int8))
    np.testing.assert_array_equal(binary, np.packbits(pooled > 0, axis=1))


def test_a_saved_binary_centre_is_subtracted_before_the_bits_are_taken(tiny_models, tmp_path):
    folder = centred_model(tiny_models["pplx-embed"], tmp_path / "centred", SENTENCES)
    encoder = Encoder.from_pretrained(folder, device="cpu")
    pooled = encoder.encode(SENTENCES, quantization="float")
    np.testing.assert_allclose(encoder.binary_centre, pooled.mean(axis=0), atol=1e-5)
    np.testing.assert_array_equal(
        encoder.encode(SENTENCES, quantization="binary"), np.packbits(pooled > encoder.binary_centre, axis=1)
    )
    np.testing.assert_array_equal(  # Matryoshka: the centre's first dims
        encoder.encode(SENTENCES, quantization="binary", dim=16), np.packbits(pooled[:, :16] > encoder.binary_centre[:16], axis=1)
    )
    encoder.save_pretrained(tmp_path / "saved")  # the centre travels with the model
    np.testing.assert_array_equal(Encoder.from_pretrained(tmp_path / "saved", device="cpu").binary_centre,
                                  encoder.binary_centre)
    (folder / "binary_centre.json").write_text(json.dumps({"centre": [0.0] * 3}))
    with pytest.raises(CheckpointError, match=f"binary_centre.json: 'centre' must be {encoder.dim} finite"):
        Encoder.from_pretrained(folder, device="cpu")


def test_mean_pooling_matches_manual_mean_of_token_states(qwen3):
    tokens = qwen3.encode_tokens(SENTENCES)
    pooled = qwen3.encode(SENTENCES, quantization="float")
    for states, vector in zip(tokens, pooled, strict=True):
        np.testing.assert_allclose(states.mean(axis=0), vector, atol=1e-5)
    assert [len(t) for t in tokens] == [len(ids) for ids in qwen3.tokenize(SENTENCES)[0]]


def test_pooling_is_data_and_is_saved_with_the_model(tiny_models, qwen3, tmp_path):
    from embedlib.encoding.batching import pad_batch
    from embedlib.models.loading import read_pooling_mode
    from embedlib.training.causal_ablation import load_causal_backbone

    assert qwen3.pooling.mode == "mean"
    causal = Encoder(load_causal_backbone(tiny_models["qwen3-causal"]))  # the ablation: last-token pooling
    ids, _ = causal.tokenize(["flow over a flat plate at high speed", "shock"])
    input_ids, mask = pad_batch(ids, causal.tokenizer.pad_token_id)
    with torch.no_grad():
        states = causal.token_states(input_ids, mask)
        last = states[torch.arange(2), torch.tensor([len(ids[0]) - 1, len(ids[1]) - 1])]
        torch.testing.assert_close(causal.pooled(input_ids, mask), last)
    causal.save_pretrained(tmp_path / "causal")
    assert read_pooling_mode(tmp_path / "causal") == "last_token"
    assert json.loads((tmp_path / "causal" / "1_Pooling" / "config.json").read_text())["pooling_mode_lasttoken"]


def test_straight_through_estimator():
    x = torch.tensor([-2.0, -0.01, 0.0, 0.3, 5.0], requires_grad=True)
    y = int8_straight_through(x)
    torch.testing.assert_close(y, torch.round(127 * torch.tanh(x.detach())))
    y.sum().backward()
    torch.testing.assert_close(x.grad, 127 * (1 - torch.tanh(x.detach()) ** 2))


def test_matryoshka_truncates_before_quantization(qwen3):
    full = qwen3.encode(SENTENCES, quantization="float")
    np.testing.assert_allclose(qwen3.encode(SENTENCES, quantization="float", dim=32), full[:, :32], atol=1e-6)
    np.testing.assert_array_equal(
        qwen3.encode(SENTENCES, quantization="int8", dim=32), np.round(127 * np.tanh(full[:, :32])).astype(np.int8)
    )
    assert qwen3.encode(SENTENCES, quantization="binary", dim=24).shape == (len(SENTENCES), 3)
    with pytest.raises(ValueError, match="dim"):
        qwen3.encode(SENTENCES, dim=qwen3.dim + 1)


def test_similarities():
    codes = np.packbits(np.array([[1, 0, 1, 1, 0, 0, 0, 0, 1], [0, 0, 1, 1, 0, 0, 0, 1, 0]], dtype=bool), axis=1)
    assert hamming_distance(codes, codes).tolist() == [[0, 3], [3, 0]]
    int8 = np.array([[127, 0], [64, 64]], dtype=np.int8)
    np.testing.assert_allclose(similarity(int8, int8, "int8"), [[1, 0.70710677], [0.70710677, 1]], atol=1e-6)


def test_outputs_come_back_in_input_order(minilm, scifact_queries):
    texts = scifact_queries[:40]
    order = np.random.default_rng(0).permutation(len(texts))
    direct = minilm.encode(texts, quantization="float", max_tokens_per_batch=256)
    shuffled = minilm.encode([texts[i] for i in order], quantization="float", max_tokens_per_batch=256)
    np.testing.assert_allclose(shuffled, direct[order], atol=1e-5)


def test_batches_respect_the_token_budget():
    lengths = [5, 300, 40, 41, 7, 7, 120, 1]
    batches = plan_batches(lengths, max_tokens=128, max_batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 128


# --- agreement with sentence-transformers and checkpoint formats --------------------------------------


def test_minilm_matches_sentence_transformers(minilm, minilm_path, scifact_queries):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_path), device="cpu").encode(scifact_queries)
    ours = minilm.encode(scifact_queries, quantization="float")
    cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999


def test_pplx_embed_checkpoint_loads_natively(tiny_models):
    folder = tiny_models["pplx-embed"]
    assert json.loads((folder / "config.json").read_text())["model_type"] == "bidirectional_pplx_qwen3"
    encoder = Encoder.from_pretrained(folder)
    assert isinstance(encoder.model, BidirectionalQwen3Model)
    assert encoder.max_length == 512  # from its sentence-transformers config
    assert encoder.encode(SENTENCES).shape == (len(SENTENCES), encoder.dim)


@pytest.mark.parametrize("which", ["qwen3", "minilm"])
def test_save_load_round_trip_and_sentence_transformers(which, request, tmp_path):
    from sentence_transformers import SentenceTransformer

    encoder = request.getfixturevalue(which)
    encoder.save_pretrained(tmp_path / "saved")
    reloaded = Encoder.from_pretrained(tmp_path / "saved")
    assert reloaded.weights_hash == encoder.weights_hash
    for quantization in ("float", "int8", "binary"):
        np.testing.assert_array_equal(
            reloaded.encode(SENTENCES, quantization=quantization), encoder.encode(SENTENCES, quantization=quantization)
        )
    st = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    # Non-empty texts: for "" a tokenizer without special tokens gives sentence-transformers no token at all,
    # where the Encoder reads the end-of-text token.
    texts = [t for t in SENTENCES if t]
    np.testing.assert_allclose(st.encode(texts), encoder.encode(texts, quantization="float"), atol=1e-5)


def test_save_and_load_through_s3(qwen3, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDLIB_CACHE", str(tmp_path / "cache"))
    url = f"{s3_bucket}/models/tiny-qwen3"
    qwen3.save_pretrained(url)
    reloaded = Encoder.from_pretrained(url)
    assert reloaded.source == url
    np.testing.assert_array_equal(reloaded.encode(SENTENCES), qwen3.encode(SENTENCES))


# --- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("quantization", "dtype", "width"), [("int8", np.int8, 64), ("binary", np.uint8, 8),
                                                              ("float", np.float32, 64)])
def test_empty_input_gives_empty_array(qwen3, quantization, dtype, width):
    out = qwen3.encode([], quantization=quantization)
    assert out.shape == (0, width) and out.dtype == dtype
    assert qwen3.encode_tokens([]) == []


@pytest.mark.parametrize("bad", [None, 3, b"bytes"])
def test_non_string_item_names_its_position(qwen3, bad):
    with pytest.raises(TypeError, match=r"texts\[2\]"):
        qwen3.encode(["a", "b", bad])


@pytest.mark.parametrize("which", ["qwen3", "minilm"])
def test_empty_string_encodes(which, request):
    vector = request.getfixturevalue(which).encode([""], quantization="float")
    assert vector.shape[0] == 1 and np.isfinite(vector).all() and np.abs(vector).sum() > 0


def test_long_text_is_truncated_and_counted(minilm, caplog):
    with caplog.at_level(logging.WARNING):
        minilm.encode(["short", "word " * 2000])
    assert minilm.last_stats.truncated == 1
    assert minilm.last_stats.tokens <= 5 + minilm.max_length
    assert "truncated" in caplog.text


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match=str(tmp_path / "nope")):
        Encoder.from_pretrained(tmp_path / "nope")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "missing config.json"),
        (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
        (lambda d: (d / "config.json").write_text("{}"), "no 'model_type'"),
        (lambda d: (d / "model.safetensors").unlink(), "missing weights"),
        (lambda d: (d / "tokenizer.json").unlink(), "missing tokenizer"),
    ],
)
def test_malformed_checkpoint_says_what_is_missing(tiny_models, tmp_path, damage, message):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_models["qwen3-causal"], folder)
    damage(folder)
    with pytest.raises(CheckpointError, match=message) as err:
        Encoder.from_pretrained(folder)
    assert str(folder) in str(err.value)
