"""GPU throughput: a Qwen3-0.6B-shaped bidirectional encoder (random init) in bf16 at 512 tokens/doc.

    python bench/index_gpu.py            # on a GPU node (one call; ~5 min on an H200)
    python bench/index_gpu.py --tiny     # a tiny shape on CPU, to check the script runs

Prints docs/s and model FLOP utilisation (MFU) of (1) a raw PyTorch loop (random token ids, forward, mean pool,
INT8) and (2) the indexing pipeline (Ray Data: read -> tokenize tasks -> one encoder actor per GPU -> parquet),
on a synthetic corpus whose every document fills 512 tokens. Weights are random: they do not change speed.
The vocabulary is the 2,048-token test tokenizer (not Qwen's 151,936): only the embedding lookup differs.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch
from gpu_shapes import QWEN3_0_6B_SHAPE, gpu_bench_parser
from result_file import Result

from embedlib.data import sample_corpus_texts
from embedlib.encoding.quantize import mean_pool, quantize_int8
from embedlib.models.loading import load_backbone
from embedlib.models.tiny import TINY_QWEN3_SHAPE, make_tiny_checkpoint


def forward_flops_per_doc(shape: dict, seq: int) -> float:
    """Matmul FLOPs of one forward pass over ``seq`` tokens (projections, MLP, attention scores and values)."""
    d, layers, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    per_token = 2 * layers * (d * q + 2 * d * kv + q * d + 3 * d * inter)
    attention = 2 * 2 * layers * seq * seq * q
    return per_token * seq + attention


def raw_loop(model_dir: Path, device: str, dtype: str, batch: int, seq: int, steps: int) -> float:
    """docs/s of forward + mean pool + INT8 on random full-length batches."""
    backbone = load_backbone(model_dir, device=device, dtype=dtype)
    vocab = len(backbone.tokenizer)
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    mask = torch.ones_like(ids)

    @torch.inference_mode()
    def step():
        states = backbone.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return quantize_int8(mean_pool(states, mask))

    for _ in range(3):
        step()
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return batch * steps / (time.perf_counter() - t)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def long_corpus(path: Path, docs: int, chars: int) -> str:
    """``docs`` documents of about ``chars`` characters each (enough to fill the token cap)."""
    text = " ".join(sample_corpus_texts())
    with open(path, "w") as f:
        for i in range(docs):
            start = (i * 997) % (len(text) - chars)
            f.write(json.dumps({"_id": f"d{i}", "text": text[start : start + chars]}) + "\n")
    return str(path)


def through_pipeline(
    model_dir: Path, corpus: str, output: str, gpu: bool, dtype: str, batch: int, seq: int
) -> float:
    """docs/s of the pipeline's encode stage (actor start-up and model load included)."""
    from embedlib.index import IndexJobConfig, build_index

    summary = build_index(
        IndexJobConfig(
            input=corpus,
            output=output,
            model=str(model_dir),
            actors=1,
            gpus_per_actor=1.0 if gpu else 0.0,
            cpus_per_actor=1.0 if gpu else 0.5,
            dtype=dtype,
            batch_rows=4 * batch,
            max_tokens_per_batch=batch * seq,
            shard_size=100_000,
            show_progress=False,
        )
    )
    print(summary)
    return summary.embedded / summary.encode_seconds


def main() -> None:
    parser = gpu_bench_parser(__doc__, "tiny shape on CPU (checks the script runs)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--docs", type=int, default=20_000, help="pipeline corpus size")
    args = parser.parse_args()
    result = Result("index_gpu" + ("_tiny" if args.tiny else ""))
    gpu = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", "bf16") if gpu else ("cpu", "fp32")
    shape = TINY_QWEN3_SHAPE if args.tiny else QWEN3_0_6B_SHAPE
    if args.tiny:
        args.batch, args.steps, args.docs = 8, 3, 64
    print(
        f"device {torch.cuda.get_device_name() if gpu else 'cpu'}, {dtype}, shape {shape}, {args.seq} tokens/doc"
    )

    import ray

    ray.init(ignore_reinit_error=True, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = make_tiny_checkpoint(tmp / "model", "pplx-embed", **shape)
        flops = forward_flops_per_doc(shape, args.seq)
        raw = raw_loop(model_dir, device, dtype, args.batch, args.seq, args.steps)
        corpus = long_corpus(tmp / "corpus.jsonl", args.docs, chars=8 * args.seq)
        piped = through_pipeline(model_dir, corpus, str(tmp / "index"), gpu, dtype, args.batch, args.seq)
    figures = {"args": vars(args), "gflop_per_doc": flops / 1e9}
    for name, rate in (("raw PyTorch loop", raw), ("pipeline (Ray Data actor pool)", piped)):
        mfu = rate * flops / (args.peak_tflops * 1e12)
        figures[name] = {"docs_per_s": rate, "tflops": rate * flops / 1e12, "mfu": mfu}
        print(
            f"{name}: {rate:.1f} docs/s, {rate * flops / 1e12:.1f} TFLOP/s, MFU {mfu:.3f} "
            f"(of {args.peak_tflops:.0f} TFLOP/s peak, {flops / 1e9:.1f} GFLOP/doc)"
        )
    result.write(figures)


if __name__ == "__main__":
    main()
