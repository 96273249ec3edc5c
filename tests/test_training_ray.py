"""Ray Train + DeepSpeed runs on tiny models: 2 workers with ZeRO-3 and the forgetting guard over S3 on
multi-source mixture rows (resumed from a checkpoint that leaves the guard's frozen copy out; the binary centre
fitted on documents sampled from them), contextual training on 2 workers with ZeRO-3, a killed worker resuming, a
diverging run stopping. ZeRO-2 runs in test_diffretriever_training.py and test_node_loss.py.

The first DeepSpeed use on a machine JIT-compiles its small shared-memory communication op with g++
(``deepspeed_shm_comm``, cached under ``~/.cache/torch_extensions``); the optimizer is torch's AdamW, so no
other kernel is compiled. Workers take half a CPU each so Ray Data's read tasks are never starved.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import tiny_pair_values, tiny_pretrain_values
from train_faults import CheckpointMarkers, KillAfterCheckpoint

from embedlib.encoding.encoder import Encoder
from embedlib.training.config import TrainConfig, from_dict
from embedlib.training.data import beir_contextual_rows, sample_documents, text_rows, write_rows
from embedlib.training.runner import TrainingDiverged, train

# Generous timeouts: Ray Train V2 starts several helper actors, each a Python process; on a loaded shared
# 2-core machine each start can take tens of seconds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def mixture_pair_rows(shared_data, count: int) -> list[dict]:
    """Two-source mixture rows (same-source batches of 4): list columns (``relevant_ids``) and mask keys."""
    from embedlib.training.config import SourceConfig
    from embedlib.training.mixture import build_mixture

    sources = [SourceConfig(name=n, kind="beir", url=str(shared_data / n), split="test") for n in ("cranfield", "cisi")]
    return build_mixture(sources, rows=count, batch_size=4)


def checkpoint_module_keys(url: str) -> set[str]:
    """The parameter names in a DeepSpeed checkpoint's model states (read weights-only, as resume reads it)."""
    import io

    import torch

    from embedlib import storage

    fs, path = storage.filesystem(url)
    keys: set[str] = set()
    for name in fs.find(path):
        if name.endswith("model_states.pt"):  # one per rank under ZeRO-3
            keys |= set(torch.load(io.BytesIO(fs.cat_file(name)), weights_only=True)["module"])
    return keys


def test_two_worker_deepspeed_zero3_anchored_pair_run_over_s3(
    ray_cluster, s3_bucket, tiny_models, shared_data, tmp_path
):
    data_url = f"{s3_bucket}/train/pairs.parquet"
    rows = mixture_pair_rows(shared_data, 48)
    assert {r["source"] for r in rows} == {"cranfield", "cisi"} and all(r["relevant_ids"] for r in rows)
    write_rows(rows, data_url)
    values = tiny_pair_values(
        tiny_models["pplx-embed"], data_url, tmp_path, "zero3-anchored", max_steps=3, matryoshka_dims=[16, 32],
        anchor_weight=1.0,  # the frozen starting model rides along in the DeepSpeed engine, partitioned by ZeRO-3
        deepspeed={"zero_stage": 3}, checkpoint_url=f"{s3_bucket}/checkpoints", checkpoint_every=3,
        binary_centre_docs=16,  # fitted on documents sampled from the rows on S3, saved with the model
    )
    result = train(from_dict(TrainConfig, values))
    assert [row["step"] for row in result.history] == [1, 2, 3]
    assert all(row["tokens_per_s"] > 0 for row in result.history)
    assert result.history[-1]["anchor_loss"] > 0  # the trained model has moved away from its frozen copy
    trained = Encoder.from_pretrained(tmp_path / "model", device="cpu")
    assert (
        trained.weights_hash != Encoder.from_pretrained(tiny_models["pplx-embed"], device="cpu").weights_hash
    )
    assert trained.encode(["a query"], quantization="int8").shape == (1, trained.dim)
    fitted = json.loads((tmp_path / "model" / "binary_centre.json").read_text())
    sampled = sample_documents(data_url, 16, seed=0)
    assert fitted["fitted_on"]["docs"] == len(sampled) > 8 and set(sampled) <= {r["positive"] for r in rows}
    assert {r["source"] for r in rows if r["positive"] in sampled} == {"cranfield", "cisi"}  # the whole mixture
    np.testing.assert_allclose(trained.binary_centre, trained.encode(sampled, quantization="float").mean(0), atol=1e-5)
    with open(tmp_path / "model" / "metrics.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [1, 2, 3]
    assert (tmp_path / "model" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert result.checkpoint and result.checkpoint.startswith(s3_bucket.removeprefix("s3://"))
    saved = checkpoint_module_keys(f"s3://{result.checkpoint}")
    assert any(k.startswith("backbone.") for k in saved)
    assert not any(k.startswith("anchor.") for k in saved)  # the frozen copy is rebuilt on resume, not stored

    resumed = train(from_dict(TrainConfig, values | {"max_steps": 4}))
    assert [row["step"] for row in resumed.history] == [1, 2, 3, 4]
    assert resumed.history[-1]["resumed_from_step"] == 3
    # the rebuilt copy is the starting model: the resumed student is as far from it as before, not at distance 0
    assert resumed.history[-1]["anchor_loss"] > 0.5 * result.history[-1]["anchor_loss"]


def test_two_worker_zero3_contextual_run_saves_whole_weights(ray_cluster, tiny_models, shared_data, tmp_path):
    from embedlib.eval.beir import load_beir

    rows = [r for r in beir_contextual_rows(load_beir(str(shared_data / "cranfield"), "test")) if r["gold"] <= 1]
    write_rows(rows[:24], str(tmp_path / "contextual.parquet"))
    cfg = from_dict(
        TrainConfig,
        {
            "stage": "contextual",
            "model": str(tiny_models["pplx-embed"]),
            "output": str(tmp_path / "model"),
            "data": {"url": str(tmp_path / "contextual.parquet"), "max_length": 256, "query_max_length": 32},
            "batch_size": 4,
            "max_steps": 3,
            "max_chunks": 4,
            "optimizer": {"lr": 1e-3},
            "deepspeed": {"zero_stage": 3},
            "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
            "checkpoint_url": str(tmp_path / "ckpt"),
            "checkpoint_every": 3,
            "run_name": "zero3-contextual",
        },
    )
    result = train(cfg)
    assert [row["step"] for row in result.history] == [1, 2, 3]
    assert all(row["loss"] > 0 for row in result.history)
    start = Encoder.from_pretrained(tiny_models["pplx-embed"], device="cpu")
    trained = Encoder.from_pretrained(tmp_path / "model", device="cpu")
    # ZeRO-3 leaves each rank a slice of every parameter; the saved model must hold them whole.
    shapes = {name: tuple(p.shape) for name, p in trained.model.named_parameters()}
    assert shapes == {name: tuple(p.shape) for name, p in start.model.named_parameters()}
    assert trained.weights_hash != start.weights_hash
    assert trained.encode(["a query"], quantization="int8").shape == (1, trained.dim)


def test_killed_worker_resumes_from_checkpoint(ray_cluster, tiny_models, shared_data, tmp_path):
    rows = text_rows([shared_data / "text" / "tinyshakespeare.txt"], chars_per_row=300)[:64]
    write_rows(rows, str(tmp_path / "text.jsonl"))
    cfg = from_dict(
        TrainConfig,
        {
            "stage": "pretrain",
            "model": str(tiny_models["qwen3-causal"]),
            "output": str(tmp_path / "model"),
            "data": {"url": str(tmp_path / "text.jsonl"), "max_length": 48},
            "batch_size": 4,
            "max_steps": 5,
            "optimizer": {"lr": 1e-3},
            "scaling": {"num_workers": 1, "cpus_per_worker": 0.5},
            "checkpoint_url": str(tmp_path / "ckpt"),
            "checkpoint_every": 2,
            "max_failures": 1,
            "run_name": "resume",
        },
    )
    markers = tmp_path / "markers"
    markers.mkdir()
    # the worker dies at step 3, once the controller has registered the step-2 checkpoint
    result = train(cfg, after_step=KillAfterCheckpoint(markers, step=3, checkpointed=2),
                   callbacks=[CheckpointMarkers(markers)])
    steps = [row["step"] for row in result.history]
    assert steps == [1, 2, 3, 4, 5]  # step 3 was lost with the killed worker and redone once
    assert "resumed_from_step" not in result.history[1]
    assert all(row["resumed_from_step"] == 2 for row in result.history[2:])
    assert all(0 <= row["masked_accuracy"] <= 1 for row in result.history)
    Encoder.from_pretrained(tmp_path / "model", device="cpu")


def test_diverging_run_stops_with_a_clear_error_and_writes_no_model(ray_cluster, tiny_models, shared_data, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    poisoned = tmp_path / "poisoned"  # a checkpoint with one NaN weight: every loss is NaN
    shutil.copytree(tiny_models["qwen3-causal"], poisoned)
    weights = load_file(poisoned / "model.safetensors")
    weights["model.norm.weight"][0] = float("nan")
    save_file(weights, poisoned / "model.safetensors", metadata={"format": "pt"})
    rows = text_rows([shared_data / "text" / "tinyshakespeare.txt"], chars_per_row=300)[:16]
    write_rows(rows, str(tmp_path / "text.jsonl"))
    cfg = from_dict(TrainConfig, tiny_pretrain_values(poisoned, tmp_path, "diverge", max_steps=3))
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 1"):
        train(cfg)
    assert not (tmp_path / "model").exists()
