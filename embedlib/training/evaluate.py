"""Retrieval scores of a trained checkpoint through the INT8 path (the evaluation library's exact search)."""

from __future__ import annotations

from embedlib.encoding.encoder import Encoder
from embedlib.eval.beir import load_beir
from embedlib.eval.run import evaluate_systems
from embedlib.eval.systems import DenseSystem, ModelEmbeddings


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
