"""Shared by the training benches: a plain single-process PyTorch loop over the same stage modules, and the
retrieval scores of a trained checkpoint through the evaluation library's exact INT8 search.

It is the reference the Ray Train + DeepSpeed runner is measured against (throughput), and the cheap way to
run the small ablation at equal compute on a shared 2-core machine.
"""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from embedlib.encoding.encoder import Encoder
from embedlib.eval.beir import load_beir
from embedlib.eval.run import evaluate_systems
from embedlib.eval.systems import DenseSystem, ModelEmbeddings
from embedlib.training.config import TrainConfig
from embedlib.training.runner import count_tokens, lr_lambda, save_trained_model, total_steps
from embedlib.training.stages import build_stage


def plain_loop(cfg: TrainConfig, rows: list[dict], save: bool = True) -> list[dict]:
    """Train ``cfg``'s stage on ``rows`` in this process (AdamW, same schedule and clipping); per-step metrics."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.scaling.torch_threads or 1)
    parts = build_stage(cfg, seed=cfg.seed)
    parts.module.train()
    steps = total_steps(cfg, len(rows))
    parameters = [p for p in parts.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        parameters, lr=cfg.optimizer.lr, betas=cfg.optimizer.betas, weight_decay=cfg.optimizer.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, steps))
    history = []
    for step in tqdm(range(steps), desc=f"{cfg.stage} (plain loop)", unit="step", mininterval=10):
        start = time.perf_counter()
        chunk = [rows[(step * cfg.batch_size + i) % len(rows)] for i in range(cfg.batch_size)]
        if hasattr(parts.module, "progress"):
            parts.module.progress = step / steps
        batch = parts.collate({key: [row[key] for row in chunk] for key in chunk[0]})
        out = parts.module(batch) if "input_ids" not in batch else parts.module(**batch)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(parameters, cfg.optimizer.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        row = {
            "step": step + 1,
            "loss": out["loss"].item(),
            "tokens_per_s": count_tokens(batch) / (time.perf_counter() - start),
        }
        if "accuracy" in out:
            row["accuracy"] = out["accuracy"].item()
        row |= {name: out[name].item() for name in out if name.endswith("_loss")}  # parts of the loss
        history.append(row)
    if save:
        save_trained_model(parts, cfg)
    return history


def retrieval_scores(
    encoder: Encoder,
    dataset_url: str,
    split: str = "test",
    cache: str | None = None,
    name: str = "model",
    quantization: str = "int8",
) -> dict[str, float]:
    """nDCG@10 / recall@100 / MRR@10 of ``encoder`` on a BEIR-layout dataset (exact FAISS search)."""
    dataset = load_beir(dataset_url, split)
    system = DenseSystem(ModelEmbeddings(name, encoder, cache=cache), quantization)
    result = evaluate_systems(dataset, [system], max_k=100)[0]
    return {key: result.metrics[key] for key in ("ndcg@10", "mrr@10", "recall@100")}
