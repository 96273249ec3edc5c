"""Diffusion LM backbones (Dream, LLaDA, embedlib Qwen3) with their LM head, and representative-token encoders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedlib import storage
from embedlib.data import sample_corpus_texts
from embedlib.encoding.representative_tokens import DiffRetrieverEncoder, PromptRepsEncoder, PromptTemplate
from embedlib.models.bidirectional import (
    BidirectionalLlamaForMaskedLM,
    BidirectionalQwen2ForMaskedLM,
    BidirectionalQwen3ForMaskedLM,
)
from embedlib.models.diffusion_lm import LLADA_KEY_MAPPING, LLADA_MASK_TOKEN_ID, load_diffusion_lm
from embedlib.models.loading import CheckpointError
from embedlib.models.tiny import train_bpe_tokenizer
from embedlib.models.tiny_diffusion import TINY_WRITERS

TEXTS = [
    "what similarity laws must be obeyed when constructing aeroelastic models of heated high speed aircraft",
    "boundary layer",
    "an experimental study of a glancing shock wave interacting with a turbulent boundary layer " * 3,
    "",
]


@pytest.fixture(scope="module")
def diffusion_models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("diffusion-lms")
    tokenizer = train_bpe_tokenizer(sample_corpus_texts())
    return {kind: writer(root / kind, tokenizer=tokenizer) for kind, writer in TINY_WRITERS.items()}


@pytest.fixture(scope="module")
def encoders(diffusion_models) -> dict[str, DiffRetrieverEncoder]:
    return {
        kind: DiffRetrieverEncoder.from_pretrained(path, device="cpu", max_length=128)
        for kind, path in diffusion_models.items()
    }


def test_dream_loads_as_bidirectional_qwen2_with_its_head_and_config_mask_id(diffusion_models):
    folder = diffusion_models["dream"]
    fields = json.loads((folder / "config.json").read_text())
    assert fields["model_type"] == "Dream" and "auto_map" in fields
    lm = load_diffusion_lm(folder, device="cpu")
    assert isinstance(lm.model, BidirectionalQwen2ForMaskedLM)
    assert lm.mask_token_id == fields["mask_token_id"]
    assert lm.logits_shift == 1
    saved = load_file(str(folder / "model.safetensors"))
    for name, tensor in lm.model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_llada_weights_are_renamed_onto_llama_and_its_own_mask_id_is_used(diffusion_models):
    folder = diffusion_models["llada"]
    lm = load_diffusion_lm(folder, device="cpu")
    assert isinstance(lm.model, BidirectionalLlamaForMaskedLM)
    assert lm.mask_token_id == LLADA_MASK_TOKEN_ID
    assert lm.logits_shift == 0
    assert lm.model.config.vocab_size > LLADA_MASK_TOKEN_ID
    saved = {}
    for shard in sorted(folder.glob("*.safetensors")):
        saved.update(load_file(str(shard)))
    mapped = {}
    import re

    for name, tensor in saved.items():
        for pattern, replacement in LLADA_KEY_MAPPING.items():
            name = re.sub(pattern, replacement, name)
        mapped[name] = tensor
    state = lm.model.state_dict()
    assert set(state) == set(mapped)
    for name, tensor in state.items():
        assert torch.equal(tensor, mapped[name]), name


def test_loaded_models_attend_in_both_directions(diffusion_models):
    for kind, folder in diffusion_models.items():
        model = load_diffusion_lm(folder, device="cpu").model
        a = torch.tensor([[11, 12, 13, 14]])
        b = torch.tensor([[11, 12, 13, 15]])
        with torch.no_grad():
            first_a, first_b = model(input_ids=a).logits[0, 0], model(input_ids=b).logits[0, 0]
        assert not torch.allclose(first_a, first_b), f"{kind}: first position ignores the last token"


def test_embedlib_diffusion_checkpoint_keeps_lm_head_and_tokenizer_mask(diffusion_models):
    lm = load_diffusion_lm(diffusion_models["embedlib"], device="cpu")
    assert isinstance(lm.model, BidirectionalQwen3ForMaskedLM)
    assert lm.mask_token_id == lm.tokenizer.convert_tokens_to_ids("<|mask|>")


def test_unsupported_llada_variant_names_the_field(diffusion_models, tmp_path):
    import shutil

    folder = tmp_path / "llada-sequential"
    shutil.copytree(diffusion_models["llada"], folder)
    fields = json.loads((folder / "config.json").read_text())
    fields["block_type"] = "sequential"
    (folder / "config.json").write_text(json.dumps(fields))
    with pytest.raises(CheckpointError, match="block_type"):
        load_diffusion_lm(folder, device="cpu")


def test_checkpoint_with_missing_weights_is_refused(diffusion_models, tmp_path):
    import shutil

    folder = tmp_path / "dream-broken"
    shutil.copytree(diffusion_models["dream"], folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights.pop("model.layers.1.mlp.up_proj.weight")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="up_proj"):
        load_diffusion_lm(folder, device="cpu")


def test_non_diffusion_format_is_refused(minilm_path):
    with pytest.raises(CheckpointError, match="bert"):
        load_diffusion_lm(minilm_path, device="cpu")


def test_dream_checkpoint_loads_from_s3(diffusion_models, s3_bucket):
    url = f"{s3_bucket}/models/dream"
    storage.upload_dir(diffusion_models["dream"], url)
    local = DiffRetrieverEncoder.from_pretrained(diffusion_models["dream"], device="cpu", max_length=128)
    remote = DiffRetrieverEncoder.from_pretrained(url, device="cpu", max_length=128)
    a, b = local.encode(TEXTS[:2], k=4), remote.encode(TEXTS[:2], k=4)
    np.testing.assert_allclose(np.stack(a.dense), np.stack(b.dense), atol=1e-6)


# --- representative tokens ----------------------------------------------------------------------------


def count_body_calls(model) -> list[int]:
    calls = [0]
    model.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("k", [1, 4, 16])
def test_diffusion_encoder_runs_one_forward_pass_for_any_k(encoders, k):
    encoder = encoders["dream"]
    calls = count_body_calls(encoder.model)
    out = encoder.encode(TEXTS, k=k, kind="passage", batch_size=len(TEXTS))
    assert calls[0] == 1 == encoder.last_stats.forward_passes
    assert [v.shape for v in out.dense] == [(k, encoder.dim)] * len(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(np.concatenate(out.dense), axis=1), 1.0, atol=1e-5)


def test_sparse_vectors_are_maxpooled_log_relu_logits_at_the_predicting_positions(encoders):
    for kind, encoder in encoders.items():
        k = 4
        out = encoder.encode(TEXTS[:2], k=k, kind="query")
        ids, _ = encoder.masked_prompts(TEXTS[:2], k, "query")
        lm = encoder.lm
        for row, prompt in enumerate(ids):
            with torch.no_grad():
                logits = lm.model(input_ids=torch.tensor([prompt])).logits[0]
            positions = [p - lm.logits_shift for p, token in enumerate(prompt) if token == lm.mask_token_id]
            expected = torch.log1p(torch.relu(logits[positions])).amax(dim=0)
            expected[encoder.excluded] = 0
            top = torch.topk(expected, encoder.top_terms).indices.numpy()
            vector = out.sparse[row].toarray()[0]
            assert set(np.flatnonzero(vector)) <= set(top.tolist()), kind
            np.testing.assert_allclose(vector[top], expected.numpy()[top], rtol=1e-4, atol=1e-5, err_msg=kind)
            assert vector[lm.mask_token_id] == 0 and (vector >= 0).all()


def test_encoding_is_independent_of_batching_and_order(encoders):
    encoder = encoders["llada"]
    together = encoder.encode(TEXTS, k=4, batch_size=8)
    reordered = encoder.encode(TEXTS[::-1], k=4, batch_size=1)
    for row in range(len(TEXTS)):
        np.testing.assert_allclose(together.dense[row], reordered.dense[len(TEXTS) - 1 - row], atol=1e-5)
    np.testing.assert_allclose(together.sparse.toarray(), reordered.sparse.toarray()[::-1], atol=1e-4)


def test_long_texts_are_truncated_but_keep_their_mask_slots(encoders):
    encoder = encoders["embedlib"]
    long_text = "turbulent boundary layer " * 200
    ids, truncated = encoder.masked_prompts([long_text, "short"], 16, "passage")
    assert truncated == 1
    assert len(ids[0]) == encoder.max_length
    assert ids[0].count(encoder.lm.mask_token_id) == 16
    out = encoder.encode([long_text, "short"], k=16)
    assert encoder.last_stats.truncated == 1 and out.dense[0].shape == (16, encoder.dim)


def test_prompt_template_is_validated():
    with pytest.raises(ValueError, match="The words are"):
        PromptTemplate(instruction="Summarise:")
    with pytest.raises(ValueError, match="kind"):
        PromptTemplate().parts(4, "document")


def test_promptreps_baseline_runs_k_forward_passes_and_pads_on_the_left(tiny_models):
    encoder = PromptRepsEncoder.from_pretrained(tiny_models["qwen3-causal"], device="cpu", max_length=128)
    calls = count_body_calls(encoder.model)
    out = encoder.encode(TEXTS, k=4, kind="query", batch_size=len(TEXTS))
    assert calls[0] == 4 == encoder.last_stats.forward_passes
    assert [v.shape for v in out.dense] == [(4, encoder.model.config.hidden_size)] * len(TEXTS)
    alone = encoder.encode(TEXTS[1:2], k=4, kind="query")
    np.testing.assert_allclose(out.dense[1], alone.dense[0], atol=1e-4)
    assert (out.sparse.getnnz(axis=1) <= encoder.top_terms).all()


def test_diffretriever_system_builds_and_searches_with_fixed_and_routed_budgets(encoders):
    from embedlib.data import SAMPLE_DATASET
    from embedlib.eval.beir import load_beir
    from embedlib.eval.diffretriever import DiffRetrieverSettings, DiffRetrieverSystem
    from embedlib.search.adaptive_k import KRouter
    from embedlib.search.hybrid import exhaustive_scores
    from embedlib.search.multivector import STORED_DTYPE, top_k

    dataset = load_beir(str(SAMPLE_DATASET))
    ids, texts = dataset.doc_ids()[:24], dataset.doc_texts()[:24]
    queries = list(dataset.queries.values())[:6]
    encoder = encoders["embedlib"]
    settings = DiffRetrieverSettings(k_query=2, k_passage=4, mode="dense", candidates=24)
    system = DiffRetrieverSystem("tiny", encoder, settings, show_progress=False)
    system.build([(ids[:10], texts[:10]), (ids[10:], texts[10:])])
    found = system.search(queries, 5)
    docs = encoder.encode(texts, k=4)
    docs.dense = [d.astype(STORED_DTYPE).astype(np.float32) for d in docs.dense]  # as the index stores them
    expected = top_k(exhaustive_scores(encoder.encode(queries, k=2, kind="query"), docs, "dense"), 5)
    assert found.ids == expected.named(ids).ids
    np.testing.assert_allclose(found.scores, expected.scores, rtol=1e-5)
    assert system.bytes_per_doc() > 4 * encoder.dim * 4

    router = KRouter(ks=(1, 8), thresholds=(210.0,))  # bits of information: splits these queries
    routed = DiffRetrieverSystem("tiny-routed", encoder, settings, router=router, show_progress=False)
    routed.build([(ids, texts)])
    budgets = routed.query_budgets(queries)
    assert set(budgets.tolist()) == {1, 8}
    routed_found = routed.search(queries, 5).ids
    for row, k in enumerate(budgets):
        alone = routed.index.search(encoder.encode([queries[row]], k=int(k), kind="query"), 5, mode="dense")
        assert routed_found[row] == alone.named(ids).ids[0]
    with pytest.raises(ValueError, match="k_passage"):
        DiffRetrieverSettings(k_passage=0)


def test_promptreps_without_kv_cache_gives_the_same_representation(tiny_models):
    cached = PromptRepsEncoder.from_pretrained(tiny_models["qwen3-causal"], device="cpu", max_length=128)
    uncached = PromptRepsEncoder(cached.model, cached.tokenizer, 128, use_cache=False)
    a, b = cached.encode(TEXTS[:2], k=3), uncached.encode(TEXTS[:2], k=3)
    np.testing.assert_allclose(np.stack(a.dense), np.stack(b.dense), atol=1e-4)
    np.testing.assert_allclose(a.sparse.toarray(), b.sparse.toarray(), atol=1e-3)


def test_mask_id_outside_the_lm_head_is_refused(encoders):
    import dataclasses

    lm = encoders["dream"].lm
    with pytest.raises(ValueError, match="mask_token_id"):
        DiffRetrieverEncoder(dataclasses.replace(lm, mask_token_id=lm.model.config.vocab_size + 5))
