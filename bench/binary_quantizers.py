"""Issue 13: how far can a 1-bit-per-dimension code get from INT8 without more training? Every binary code here
stores d bits per document (48 B for MiniLM), ranked by Hamming distance, except the asymmetric row.

    python bench/binary_quantizers.py                      # base and the recommended model, SciFact test
    python bench/binary_quantizers.py --models base=PATH --sets scifact,nfcorpus-test
    python bench/binary_quantizers.py --max-length 256     # the issue's length: binary_quantizers-len256.json

Codes, from the model's float embeddings (cached by weights hash), at the quality table's 128 tokens unless
``--max-length`` says otherwise:
- ``binary``: ``sign(x)``, what the index serves (``quantize_binary``);
- ``binary-centred``: ``sign(x - mean)``, the mean of the corpus's embeddings;
- ``binary-median``: ``sign(x - median)``, every bit set on half the corpus;
- ``binary-centred-rotated``: ``sign(R(x - mean))``, ``R`` a random orthogonal rotation (SimHash-like);
- ``binary-itq``: ``R`` learned by iterative quantization (Gong & Lazebnik 2011) on the corpus;
- ``asymmetric``: float query against the documents' ``sign(x)`` (the documents stay 1 bit a dimension), an
  upper bound of what re-scoring binary candidates with the float query can give;
- ``asymmetric-centred``: ``x - mean`` float query against the documents' ``sign(x - mean)``;
- ``served-centred``: the same with the model's own binary centre (``binary_centre.json``, fitted on training
  documents), what the index serves for such a model; only for models that have one.

Except ``served-centred``, centring, medians and rotations are fitted on the evaluated corpus itself (as an index
would be trained on its documents), which flatters them: read the figures as a ceiling.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from eval_common import EVAL_CACHE  # noqa: E402
from quality_table import DEFAULT_EVAL_MAX_LENGTH, RECOMMENDED, WORK  # noqa: E402
from result_file import Result  # noqa: E402

from embedlib.data import default_model_path  # noqa: E402
from embedlib.encoding.formats import asymmetric_binary_similarity, binary_queries, normalized  # noqa: E402
from embedlib.encoding.quantize import binary_straight_through, quantize_binary, quantize_int8  # noqa: E402
from embedlib.eval.beir import load_beir  # noqa: E402
from embedlib.eval.metrics import evaluate_run  # noqa: E402
from embedlib.eval.systems import ModelEmbeddings  # noqa: E402

DATA = ROOT.parent / "shared" / "data"


def signs(x: np.ndarray) -> np.ndarray:
    """``±1`` as training's ``binary_straight_through`` gives them: the bit ``quantize_binary`` sets is ``+1``, so
    the dot product of two is ``d - 2·Hamming``."""
    return binary_straight_through(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()


def int8_codes(x: np.ndarray) -> np.ndarray:
    return quantize_int8(torch.from_numpy(x)).numpy().astype(np.float32)


def random_rotation(d: int, seed: int = 0) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return q.astype(np.float32)


def itq_rotation(centred: np.ndarray, iterations: int = 50, seed: int = 0) -> np.ndarray:
    """The orthogonal ``R`` minimising ``||sign(VR) - VR||`` (alternating codes and Procrustes)."""
    rotation = random_rotation(centred.shape[1], seed)
    for _ in range(iterations):
        u, _, vt = np.linalg.svd(centred.T @ signs(centred @ rotation))
        rotation = u @ vt
    return rotation


def centred_asymmetric(queries: np.ndarray, docs: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """What a centred binary index serves: float queries ``x - centre`` against the documents' packed
    ``sign(x - centre)`` (``asymmetric_binary_similarity``)."""
    codes = quantize_binary(torch.from_numpy(docs), centre)
    return asymmetric_binary_similarity(binary_queries(queries, centre), codes)


def code_scores(queries: np.ndarray, docs: np.ndarray, centre: np.ndarray | None) -> dict[str, np.ndarray]:
    """Query-by-document scores ``(nq, nd)`` of each code (higher is better); ``centre``: the model's own."""
    mean, median = docs.mean(0), np.median(docs, 0)
    rotation, itq = random_rotation(docs.shape[1]), itq_rotation(docs - mean)
    served = {} if centre is None else {"served-centred": centred_asymmetric(queries, docs, centre)}
    return {
        "float": normalized(queries) @ normalized(docs).T,
        "int8": normalized(int8_codes(queries)) @ normalized(int8_codes(docs)).T,
        "binary": signs(queries) @ signs(docs).T,
        "binary-centred": signs(queries - mean) @ signs(docs - mean).T,
        "binary-median": signs(queries - median) @ signs(docs - median).T,
        "binary-centred-rotated": signs((queries - mean) @ rotation) @ signs((docs - mean) @ rotation).T,
        "binary-itq": signs((queries - mean) @ itq) @ signs((docs - mean) @ itq).T,
        "asymmetric": normalized(queries) @ signs(docs).T,
        "asymmetric-centred": centred_asymmetric(queries, docs, mean),
    } | served


def ndcg_at_10(scores: np.ndarray, query_ids: list[str], doc_ids: list[str], qrels: dict) -> float:
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    run = {qid: {doc_ids[j]: float(scores[i, j]) for j in top[i]} for i, qid in enumerate(query_ids)}
    return evaluate_run(qrels, run, (10,))[0]["ndcg@10"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=f"base={default_model_path()},{RECOMMENDED}={WORK}/{RECOMMENDED}",
                        help="comma-separated name=path (default: the quality table's base and recommended)")
    parser.add_argument("--sets", default="scifact")
    parser.add_argument("--max-length", type=int, default=DEFAULT_EVAL_MAX_LENGTH)
    parser.add_argument("--cache", default=EVAL_CACHE)
    args = parser.parse_args()
    at_default_length = args.max_length == DEFAULT_EVAL_MAX_LENGTH
    result = Result("binary_quantizers" if at_default_length else f"binary_quantizers-len{args.max_length}")
    started = time.time()
    figures: dict = {"max_length": args.max_length, "metric": "ndcg@10", "models": {}}
    for item in args.models.split(","):
        name, _, path = item.partition("=")
        model = ModelEmbeddings.load(name, path, cache=args.cache, max_length=args.max_length)
        figures["models"][name] = {"path": path, "sets": {}}
        for set_name in args.sets.split(","):
            dataset = load_beir(str(DATA / set_name), "test")
            queries = dataset.judged_queries()
            docs = model.float_vectors(dataset.doc_texts(), "corpus")
            query_vectors = model.float_vectors(list(queries.values()), "queries")
            scores = code_scores(query_vectors, docs, model.encoder.binary_centre)
            row = {code: round(ndcg_at_10(s, list(queries), dataset.doc_ids(), dataset.qrels), 4)
                   for code, s in scores.items()}
            figures["models"][name]["sets"][set_name] = row
            print(f"{name} {set_name}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()), flush=True)
    figures["wall_s"] = round(time.time() - started, 1)
    print(f"written {result.write(figures)}")


if __name__ == "__main__":
    main()
