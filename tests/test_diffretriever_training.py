"""DiffRetriever fine-tuning: the dense + sparse InfoNCE by hand, the stage module, saving, a Ray Train run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from embedlib.data import sample_corpus_texts
from embedlib.encoding.representative_tokens import DiffRetrieverEncoder
from embedlib.models.tiny import train_bpe_tokenizer
from embedlib.models.tiny_diffusion import TINY_WRITERS, make_tiny_diffusion_qwen3_checkpoint
from embedlib.objectives.representative import diffretriever_loss, maxsim_matrix
from embedlib.training.config import ConfigError, TrainConfig, from_dict

A, B2 = math.e - 1, math.e**2 - 1  # log(1 + x) of these is 1 and 2
TEXTS = ["supersonic flow over a flat plate", "heat transfer in a boundary layer"]


def hand_inputs() -> dict[str, torch.Tensor]:
    """Two queries (Kq=2) and three passages (Kp=2: two positives, one hard negative), h=2, V=4."""
    queries = torch.tensor([[[2.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [-0.6, 0.8]]])
    passages = torch.tensor([[[1.0, 0.0], [0.0, -1.0]], [[0.0, -1.0], [3.0, 4.0]], [[1.0, 0.0], [0.0, 1.0]]])
    # Term 3 is excluded (a special token): large everywhere, it must not count.
    query_logits = torch.tensor([[[A, -1, 0, B2], [0, B2, -5, 0]], [[-1, -1, A, B2], [-2, 0, 0, 0]]])
    passage_logits = torch.tensor(
        [[[B2, 0, 0, B2], [0, 0, 0, 0]], [[0, A, B2, B2], [0, 0, 0, 0]], [[0, 0, A, B2], [0, 0, 0, 0]]]
    )
    return {
        "query_states": queries,
        "query_logits": query_logits.float(),
        "passage_states": passages,
        "passage_logits": passage_logits.float(),
        "excluded": torch.tensor([False, False, False, True]),
    }


def nce(positive: float, negatives: list[float], temperature: float) -> float:
    return -positive / temperature + math.log(sum(math.exp(s / temperature) for s in [positive, *negatives]))


def test_maxsim_matrix_by_hand():
    x = hand_inputs()
    # q0 rows (1,0),(0,1); q1 rows (0,1),(-0.6,0.8) [its best on p0 is -0.6, kept]; p1 = (0,-1),(0.6,0.8)
    expected = [[0.5, 0.7, 1.0], [-0.3, (0.8 + 0.28) / 2, (1.0 + 0.8) / 2]]
    np.testing.assert_allclose(maxsim_matrix(x["query_states"], x["passage_states"]), expected, atol=1e-6)


def test_diffretriever_loss_by_hand():
    x = hand_inputs()
    for name in ("query_states", "query_logits", "passage_states", "passage_logits"):
        x[name].requires_grad_(True)
    tau, weight = 0.1, 0.5
    out = diffretriever_loss(**x, temperature=tau, sparse_weight=weight)
    dense = (nce(0.5, [0.7, 1.0], tau) + nce(0.54, [-0.3, 0.9], tau)) / 2
    # term weights: q0 (1,2,0), q1 (0,0,1); p0 (2,0,0), p1 (0,1,2), p2 (0,0,1)
    sparse = (nce(2.0, [2.0, 0.0], 1.0) + nce(2.0, [0.0, 1.0], 1.0)) / 2
    assert out["dense_loss"].item() == pytest.approx(dense, rel=1e-5)
    assert out["sparse_loss"].item() == pytest.approx(sparse, rel=1e-5)
    assert out["loss"].item() == pytest.approx(dense + weight * sparse, rel=1e-5)
    out["loss"].backward()
    assert all(torch.isfinite(x[n].grad).all() for n in ("query_states", "passage_logits"))
    assert x["passage_states"].grad.abs().sum() > 0 and x["query_logits"].grad.abs().sum() > 0


def test_diffretriever_loss_masks_copies_of_the_positive():
    x = hand_inputs()
    hashes = torch.tensor([7, 8, 7])  # the hard negative is q0's own positive again
    out = diffretriever_loss(**x, temperature=0.1, passage_hashes=hashes)
    assert out["dense_loss"].item() == pytest.approx((nce(0.5, [0.7], 0.1) + nce(0.54, [-0.3, 0.9], 0.1)) / 2)


def test_config_errors_name_the_diffretriever_fields():
    base = {"stage": "diffretriever", "model": "m", "output": "o", "data": {"url": "d.parquet"}}
    cfg = from_dict(TrainConfig, base)
    assert (cfg.k_query, cfg.k_passage, cfg.sparse_weight, cfg.hard_negatives) == (4, 16, 1.0, 0)
    assert from_dict(TrainConfig, {**base, "stage": "triplet"}).hard_negatives == 3
    for change, field in [
        ({"k_query": 0}, "k_query"),
        ({"k_passage": "many"}, "k_passage"),
        ({"sparse_weight": -1}, "sparse_weight"),
        ({"hard_negatives": -1}, "hard_negatives"),
        ({"temperature": 0}, "temperature"),
    ]:
        with pytest.raises(ConfigError, match=field):
            from_dict(TrainConfig, {**base, **change})
    with pytest.raises(ConfigError, match="hard_negatives"):
        from_dict(TrainConfig, {**base, "stage": "triplet", "hard_negatives": 0})


@pytest.fixture(scope="module")
def diffusion_lms(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("diffretriever-train")
    tokenizer = train_bpe_tokenizer(sample_corpus_texts())
    return {kind: writer(root / kind, tokenizer=tokenizer) for kind, writer in TINY_WRITERS.items()}


@pytest.mark.parametrize("kind", ["dream", "llada", "embedlib"])
def test_save_keeps_head_mask_id_and_format(diffusion_lms, kind, tmp_path):
    encoder = DiffRetrieverEncoder.from_pretrained(diffusion_lms[kind], device="cpu", max_length=96)
    encoder.save_pretrained(tmp_path / "saved")
    again = DiffRetrieverEncoder.from_pretrained(tmp_path / "saved", device="cpu", max_length=96)
    saved_type = json.loads((tmp_path / "saved" / "config.json").read_text())["model_type"]
    assert saved_type == json.loads((diffusion_lms[kind] / "config.json").read_text())["model_type"]
    assert (again.lm.format, again.lm.mask_token_id, again.lm.logits_shift) == (
        encoder.lm.format,
        encoder.lm.mask_token_id,
        encoder.lm.logits_shift,
    )
    before, after = encoder.encode(TEXTS, k=3), again.encode(TEXTS, k=3)
    np.testing.assert_allclose(np.stack(after.dense), np.stack(before.dense), atol=1e-5)
    np.testing.assert_allclose(after.sparse.toarray(), before.sparse.toarray(), atol=1e-4)


def stage_config(model, output, **changes) -> TrainConfig:
    values = {
        "stage": "diffretriever",
        "model": str(model),
        "output": str(output),
        "data": {"url": "unused.parquet", "max_length": 24, "query_max_length": 12},
        "k_query": 2,
        "k_passage": 3,
        **changes,
    }
    return from_dict(TrainConfig, values)


def test_stage_triplet_rows_backward_and_lora_merge(diffusion_lms, tmp_path):
    from embedlib.training.runner import save_trained_model
    from embedlib.training.stages import build_stage

    cfg = stage_config(diffusion_lms["dream"], tmp_path / "out", hard_negatives=1, lora={"r": 4, "alpha": 8})
    parts = build_stage(cfg, seed=0)
    rows = {
        "query": ["flat plate", "heat"],
        "positive": TEXTS,
        "negatives": [["a wing in a wind tunnel", "x"], [TEXTS[1]]],  # row 1's negative is its positive
    }
    batch = parts.collate(rows)
    assert batch["passage"]["input_ids"].shape[0] == 4
    assert (batch["passage"]["input_ids"] == parts.encoder.lm.mask_token_id).sum(1).tolist() == [3] * 4
    assert batch["passage_hash"][1] == batch["passage_hash"][3]
    out = parts.module(batch)
    assert {"loss", "dense_loss", "sparse_loss"} <= set(out) and torch.isfinite(out["loss"])
    out["loss"].backward()
    trainable = [(n, p) for n, p in parts.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, _ in trainable)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for _, p in trainable)
    with torch.no_grad():
        for name, p in trainable:
            if "lora_B" in name:
                p.normal_(std=0.05)
    parts.module.eval()
    expected = parts.encoder.encode(TEXTS, k=3)
    save_trained_model(parts, cfg)
    reloaded = DiffRetrieverEncoder.from_pretrained(tmp_path / "out", device="cpu")
    assert reloaded.lm.format == "dream" and not any("lora" in k for k in reloaded.model.state_dict())
    np.testing.assert_allclose(np.stack(reloaded.encode(TEXTS, k=3).dense), np.stack(expected.dense), atol=1e-5)
    base = DiffRetrieverEncoder.from_pretrained(diffusion_lms["dream"], device="cpu").encode(TEXTS, k=3)
    assert not np.allclose(np.stack(base.dense), np.stack(expected.dense), atol=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_ray_deepspeed_diffretriever_run_saves_a_loadable_encoder(ray_cluster, shared_data, tmp_path):
    from embedlib.eval.beir import load_beir
    from embedlib.training.data import beir_pairs, write_rows
    from embedlib.training.runner import train

    model = make_tiny_diffusion_qwen3_checkpoint(tmp_path / "start")
    write_rows(beir_pairs(load_beir(str(shared_data / "cranfield"), "test"))[:16], str(tmp_path / "pairs.jsonl"))
    cfg = stage_config(
        model,
        tmp_path / "model",
        data={"url": str(tmp_path / "pairs.jsonl"), "max_length": 32, "query_max_length": 16},
        batch_size=4,
        max_steps=4,
        optimizer={"lr": 2e-3},
        deepspeed={"zero_stage": 2},
        scaling={"num_workers": 1, "cpus_per_worker": 0.5},
        checkpoint_url=str(tmp_path / "ckpt"),
        checkpoint_every=4,
        run_name="diffretriever",
    )
    result = train(cfg)
    assert [row["step"] for row in result.history] == [1, 2, 3, 4]
    assert all(math.isfinite(row[k]) for row in result.history for k in ("loss", "dense_loss", "sparse_loss"))
    trained = DiffRetrieverEncoder.from_pretrained(tmp_path / "model", device="cpu")
    start = DiffRetrieverEncoder.from_pretrained(model, device="cpu")
    assert (trained.lm.format, trained.lm.mask_token_id) == ("embedlib", start.lm.mask_token_id)
    after, before = trained.encode(TEXTS, k=4), start.encode(TEXTS, k=4)
    assert not np.allclose(np.stack(after.dense), np.stack(before.dense), atol=1e-4)
    assert (tmp_path / "model" / "metrics.csv").is_file()
