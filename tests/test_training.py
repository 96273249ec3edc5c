"""Training: the diffusion objective learns, data converters, SLERP, LoRA merge, config validation.

Ray Train + DeepSpeed runs are in ``test_training_ray.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import centred_model, perturbed_copy, train_config

from embedlib.encoding.encoder import Encoder
from embedlib.eval.beir import BeirDataset, load_beir, read_records
from embedlib.models.loading import load_backbone
from embedlib.models.mask_token import resolve_mask_id
from embedlib.training.config import ConfigError, TrainConfig, from_dict, load_config, load_merge_config
from embedlib.training.data import (
    beir_contextual_rows,
    beir_pairs,
    mine_bm25_negatives,
    text_rows,
    write_rows,
)
from embedlib.training.merge import depth_shares, merge_checkpoints, slerp
from embedlib.training.recipe import read_recipe
from embedlib.training.stages import DiffusionObjective, PretrainCollator

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine more threads only spin."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_diffusion_loss_decreases_on_real_text(tiny_models, shared_data):
    backbone = load_backbone(tiny_models["qwen3-causal"], device="cpu", dtype="fp32", with_lm_head=True)
    encoder = Encoder(backbone)
    module = DiffusionObjective(backbone.model.train(), resolve_mask_id(backbone.tokenizer), seed=0)
    collate = PretrainCollator(encoder, max_length=64)
    rows = text_rows([shared_data / "text" / "tinyshakespeare.txt"], chars_per_row=300)[: 8 * 40]
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    losses, accuracies = [], []
    for start in range(0, len(rows), 8):
        batch = collate({"text": [r["text"] for r in rows[start : start + 8]]})
        out = module(**batch)
        out["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out["loss"].item())
        accuracies.append(out["accuracy"].item())
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])
    assert np.mean(accuracies[-10:]) > np.mean(accuracies[:10])


def test_mask_id_resolution(tiny_models):
    tokenizer = load_backbone(tiny_models["qwen3-causal"], device="cpu").tokenizer
    assert resolve_mask_id(tokenizer) == tokenizer.convert_tokens_to_ids("<|mask|>")
    assert resolve_mask_id(tokenizer, 7) == 7
    assert resolve_mask_id(tokenizer, config={"mask_token_id": 9}) == 9
    assert resolve_mask_id(tokenizer, 7, config={"mask_token_id": 9}) == 7  # the config's request wins
    with pytest.raises(ValueError, match="mask_id"):
        resolve_mask_id(tokenizer, "dream")  # Dream's id exists only in Dream's 151k vocabulary


def test_config_errors_name_the_field(tmp_path):
    base = {"stage": "pair", "model": "m", "output": "o", "data": {"url": "d.parquet"}}
    assert from_dict(TrainConfig, base).optimizer.lr > 0
    for change, field in [
        ({"stage": "pairs"}, "stage"),
        ({"batch_size": 0}, "batch_size"),
        ({"optimizer": {"lr": "fast"}}, "optimizer.lr"),
        ({"data": {"url": "d", "x": 1}}, "data.x"),
        ({"deepspeed": {"zero_stage": 4}}, "deepspeed.zero_stage"),
        ({"mask_id": "bert"}, "mask_id"),
        ({"report_every": -1}, "report_every"),
    ]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            from_dict(TrainConfig, {**base, **change})
    path = tmp_path / "c.yaml"
    path.write_text("stage: triplet\nmodel: m\noutput: o\ndata: {url: d.jsonl}\n")
    assert load_config(str(path), {"optimizer.lr": 1e-4}).optimizer.lr == 1e-4


@pytest.mark.parametrize("path", sorted((ROOT / "jobs" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    config = (load_merge_config if path.stem.endswith("-merge") else load_config)(str(path))
    assert config.output


def test_beir_pairs_and_bm25_hard_negatives(shared_data, tmp_path):
    dataset = load_beir(str(shared_data / "cranfield"), "test")
    pairs = beir_pairs(dataset)
    assert len(pairs) == sum(1 for docs in dataset.qrels.values() for r in docs.values() if r >= 1)
    triplets = mine_bm25_negatives(pairs[:50], dataset, k=3)
    assert len(triplets) == 50
    for row in triplets:
        assert len(row["negatives"]) == 3
        assert not set(row["negative_ids"]) & set(dataset.qrels[row["query_id"]])
    write_rows(triplets, str(tmp_path / "t.parquet"))
    assert read_records(str(tmp_path / "t.parquet"))[0]["negatives"] == triplets[0]["negatives"]


def test_beir_contextual_rows_take_the_chunk_with_the_query_terms_as_gold():
    dataset = BeirDataset(
        corpus={
            "d1": {"title": "", "text": "Cats purr. Dogs bark loudly. Wings flutter at high speed. Engines roar."},
            "d2": {"title": "", "text": "Heat transfer in laminar flow near the nose. Drag rises."},
            "d3": {"title": "", "text": "One sentence only."},
        },
        queries={"q1": "wing flutter speed", "q2": "barking dogs", "q3": "one sentence", "q4": "laminar heat"},
        qrels={"q1": {"d1": 1}, "q2": {"d1": 1}, "q3": {"d3": 1}, "q4": {"d2": 1}},
        source="inline",
    )
    rows = {row["query_id"]: row for row in beir_contextual_rows(dataset, sentences_per_chunk=1)}
    assert set(rows) == {"q1", "q2", "q4"}  # d3 has a single chunk: nothing to tell apart
    assert rows["q1"]["chunks"] == ["Cats purr.", "Dogs bark loudly.", "Wings flutter at high speed.", "Engines roar."]
    assert (rows["q1"]["gold"], rows["q2"]["gold"], rows["q4"]["gold"]) == (2, 1, 0)
    pairs = {row["query_id"]: row for row in beir_contextual_rows(dataset, sentences_per_chunk=2)}
    assert pairs["q1"]["chunks"][1] == "Wings flutter at high speed. Engines roar." and pairs["q1"]["gold"] == 1


def test_slerp_endpoints_and_arc():
    a, b = torch.randn(8, 4), torch.randn(8, 4)
    assert torch.allclose(slerp(a, b, 0.0), a, atol=1e-6)
    assert torch.allclose(slerp(a, b, 1.0), b, atol=1e-6)
    x, y = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert torch.allclose(slerp(x, y, 0.5), torch.tensor([2**-0.5, 2**-0.5]))  # on the arc, not the chord
    assert torch.allclose(slerp(x, 2 * x, 0.5), 1.5 * x)  # parallel: linear


def test_merge_checkpoints_endpoints(tiny_models, tmp_path):
    texts = ["aerodynamic heating of a cone", "boundary layer"]
    first = centred_model(tiny_models["pplx-embed"], tmp_path / "first", texts)
    other = perturbed_copy(first, tmp_path / "other")
    encoder = Encoder.from_pretrained(other, device="cpu")
    for t, expected in ((0.0, first), (1.0, other)):
        merged = merge_checkpoints(first, other, tmp_path / f"m{t}", t)
        assert merged.weights_hash == Encoder.from_pretrained(expected, device="cpu").weights_hash
    merge_checkpoints(first, other, tmp_path / "half", 0.5)
    recipe = read_recipe(tmp_path / "half")  # the merged model says how it was made
    assert recipe["config_type"] == "MergeConfig" and recipe["config"]["t"] == 0.5
    halfway = Encoder.from_pretrained(tmp_path / "half", device="cpu")
    assert halfway.weights_hash not in {
        encoder.weights_hash,
        Encoder.from_pretrained(first, device="cpu").weights_hash,
    }
    assert halfway.encode(texts, quantization="float").shape == (2, halfway.dim)
    assert halfway.binary_centre is None  # the centre was fitted on other weights: not carried over


@pytest.mark.parametrize("family", ["bert", "pplx-embed"])
def test_depth_scaled_merge_keeps_embeddings_and_moves_the_last_layer_fully(tiny_models, tmp_path, family):
    first = Encoder.from_pretrained(tiny_models[family], device="cpu").model.state_dict()
    other = perturbed_copy(tiny_models[family], tmp_path / "other")
    second = Encoder.from_pretrained(other, device="cpu").model.state_dict()
    merge_checkpoints(tiny_models[family], other, tmp_path / "merged", 1.0, "linear", layer_scaling="linear")
    merged = Encoder.from_pretrained(tmp_path / "merged", device="cpu").model.state_dict()
    shares = depth_shares(first, "linear")
    for name, share in shares.items():
        if not first[name].is_floating_point():
            continue
        expected = torch.lerp(first[name].double(), second[name].double(), share).to(first[name].dtype)
        assert torch.allclose(merged[name], expected, atol=1e-6), name
    # two layers: the first stays at ``first``, the last and what follows it move fully, the embeddings stay
    expected_share = {"embed": 0.0, "layer.0.": 0.0, "layers.0.": 0.0, "layer.1.": 1.0, "layers.1.": 1.0}
    for name, share in shares.items():
        assert share == next((v for k, v in expected_share.items() if k in name), 1.0), name
    assert {0.0, 1.0} == set(shares.values())
    assert read_recipe(tmp_path / "merged")["config"]["layer_scaling"] == "linear"


def test_depth_shares_of_minilm_layers():
    names = ["embeddings.word_embeddings.weight", *(f"encoder.layer.{i}.output.dense.weight" for i in range(6)),
             "pooler.dense.weight"]
    shares = depth_shares(names, "linear")
    assert [shares[name] for name in names] == [0.0, 0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0]
    assert set(depth_shares(names).values()) == {1.0}
    with pytest.raises(ValueError, match="layer_scaling"):
        depth_shares(["embeddings.weight", "head.weight"], "linear")


def test_merge_job_fits_the_merged_models_own_binary_centre(tiny_models, tmp_path, merge_job):
    first = centred_model(tiny_models["pplx-embed"], tmp_path / "first", ["a centre of other weights"])
    second = perturbed_copy(first, tmp_path / "second")
    positives = [f"document {i} about {word}" for i, word in enumerate(["wings", "cones", "shocks", "heat"] * 3)]
    rows = tmp_path / "rows.parquet"
    write_rows([{"query": f"q{i}", "positive": p} for i, p in enumerate(positives)], str(rows))
    config = tmp_path / "merge.yaml"
    config.write_text(f"first: {first}\nsecond: {second}\noutput: {tmp_path / 'merged'}\nt: 0.5\n"
                      f"binary_centre_docs: 100\nbinary_centre_data: {rows}\n")
    assert merge_job.main(["--config", str(config)]) == 0
    merged = Encoder.from_pretrained(tmp_path / "merged", device="cpu")
    expected = merged.encode(positives, quantization="float").mean(axis=0)  # all 12 sampled: fewer than asked
    np.testing.assert_allclose(merged.binary_centre, expected, atol=1e-5)
    second_centre = Encoder.from_pretrained(second, device="cpu").binary_centre
    assert not np.allclose(merged.binary_centre, second_centre, atol=1e-3)  # not the centre either end carries

    config.write_text(f"first: {first}\nsecond: {second}\noutput: {tmp_path / 'm2'}\nbinary_centre_docs: 5\n")
    assert merge_job.main(["--config", str(config)]) == 2  # the docs without the rows: a config error


def test_merge_job_scales_the_merge_by_depth(tiny_models, tmp_path, merge_job, capsys):
    second = perturbed_copy(tiny_models["bert"], tmp_path / "second")
    config = tmp_path / "merge.yaml"
    config.write_text(f"first: {tiny_models['bert']}\nsecond: {second}\noutput: {tmp_path / 'merged'}\nt: 1.0\n"
                      "method: linear\nlayer_scaling: linear\n")
    assert merge_job.main(["--config", str(config)]) == 0
    first, second_weights, merged = (Encoder.from_pretrained(path, device="cpu").model.state_dict()
                                     for path in (tiny_models["bert"], second, tmp_path / "merged"))
    word = "embeddings.word_embeddings.weight"
    last = "encoder.layer.1.attention.self.query.weight"
    assert torch.equal(merged[word], first[word]) and not torch.equal(merged[word], second_weights[word])
    assert torch.allclose(merged[last], second_weights[last], atol=1e-6)
    config.write_text(config.read_text().replace("layer_scaling: linear", "layer_scaling: deep"))
    assert merge_job.main(["--config", str(config)]) == 2
    assert "layer_scaling: must be one of" in capsys.readouterr().err


def test_lora_save_merges_and_reloads_equal(tiny_models, tmp_path):
    from embedlib.training.runner import save_trained_model
    from embedlib.training.stages import build_stage

    cfg = train_config(
        "pair", tiny_models["pplx-embed"], tmp_path / "out", {"url": "unused.parquet"}, lora={"r": 4, "alpha": 8}
    )
    parts = build_stage(cfg, seed=0)
    trainable = [n for n, p in parts.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        for name, p in parts.module.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)  # a trained adapter: non-zero update
    texts = ["supersonic flow over a flat plate", "heat transfer"]
    parts.encoder.model.eval()
    expected = parts.encoder.encode(texts, quantization="float")
    save_trained_model(parts, cfg)
    recipe = read_recipe(tmp_path / "out")  # the resolved config beside the model, defaults filled in
    assert recipe["config"]["lora"]["r"] == 4 and recipe["config"]["temperature"] == cfg.temperature
    assert recipe["git"]["commit"] is None or len(recipe["git"]["commit"]) == 40
    reloaded = Encoder.from_pretrained(tmp_path / "out", device="cpu")
    assert not any("lora" in k for k in reloaded.model.state_dict())
    np.testing.assert_allclose(reloaded.encode(texts, quantization="float"), expected, atol=1e-5)
    base = Encoder.from_pretrained(tiny_models["pplx-embed"], device="cpu").encode(
        texts, quantization="float"
    )
    assert not np.allclose(base, expected, atol=1e-4)


def test_embedding_model_hard_negatives(shared_data, tiny_models):
    from embedlib.training.data import mine_embedding_negatives

    dataset = load_beir(str(shared_data / "cranfield"), "test")
    encoder = Encoder.from_pretrained(tiny_models["pplx-embed"], device="cpu", max_length=32)
    triplets = mine_embedding_negatives(beir_pairs(dataset)[:20], dataset, encoder, k=2)
    assert len(triplets) == 20
    for row in triplets:
        assert len(row["negative_ids"]) == 2 and not set(row["negative_ids"]) & set(
            dataset.qrels[row["query_id"]]
        )


def test_contextual_stage_late_chunking(tiny_models, tmp_path):
    from embedlib.training.stages import build_stage

    cfg = train_config(
        "contextual", tiny_models["pplx-embed"], tmp_path / "out", {"url": "unused", "max_length": 64},
        max_chunks=3, matryoshka_dims=[16],
    )
    parts = build_stage(cfg, seed=0)
    rows = {
        "query": ["wing flutter", "shock waves", "heat transfer"],
        "chunks": [
            ["flutter of wings", "at high speed", "was measured"],
            ["shock waves form", "ahead"],
            ["heat transfer", "in laminar flow", "near the nose", "dropped chunk"],
        ],
        "gold": [0, 0, 1],
    }
    batch = parts.collate(rows)
    assert batch["chunk_valid"].tolist() == [[True, True, True], [True, True, False], [True, True, True]]
    # Late chunking: a chunk's embedding is the mean of the whole document's token states over its span.
    states = parts.encoder.token_states(batch["document"]["input_ids"], batch["document"]["attention_mask"])
    span = batch["spans"][0, 1].bool()
    ids_chunk1, _ = parts.encoder.tokenize(["at high speed"])
    assert int(span.sum()) == len(ids_chunk1[0])
    chunk = states[0, span].mean(0)
    alone = parts.encoder.pooled(
        *[t[:1] for t in (batch["document"]["input_ids"], batch["document"]["attention_mask"])]
    )
    assert not torch.allclose(chunk, alone[0])  # the chunk saw its context, yet is not the document mean
    out = parts.module(batch)
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and out["loss"] > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in parts.module.parameters())


def test_chunk_window_keeps_the_gold_chunk_inside_the_caps():
    from embedlib.training.stages import chunk_window

    chunks = [[1] * 5, [2] * 5, [3] * 5, [4] * 5]
    assert chunk_window(chunks, gold=1, max_chunks=3, max_length=12) == (0, [(0, 5), (5, 10)], [1] * 5 + [2] * 5)
    # The gold chunk lies past both caps: the window slides forward until it holds it.
    assert chunk_window(chunks, gold=3, max_chunks=3, max_length=12) == (2, [(0, 5), (5, 10)], [3] * 5 + [4] * 5)
    # A gold chunk longer than max_length on its own is truncated, never dropped.
    assert chunk_window([[1] * 5, [2] * 20], gold=1, max_chunks=3, max_length=12) == (1, [(0, 12)], [2] * 12)


def test_progress_line_names_every_metric():
    from embedlib.training.runner import progress_line

    line = progress_line({"step": 3, "epoch": 0, "loss": 3.14159, "lr": 1e-3, "masked_accuracy": 0.41234}, 300)
    assert line == "step 3/300 epoch 0 loss 3.142 lr 1.000e-03 masked_accuracy 0.4123"
