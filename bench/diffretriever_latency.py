"""Encoding latency vs K: one bidirectional pass (DiffRetriever) vs K generation steps (PromptReps).

Both encoders use the SAME weights and sizes: a tiny Qwen3 written as a causal LM (the AR baseline, greedy
generation with a KV cache) and the same weights loaded as a bidirectional masked LM (DiffRetriever).

    python bench/diffretriever_latency.py --texts 64 --hidden 256 --layers 4 --out bench/results
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from embedlib.encoding.representative_tokens import DiffRetrieverEncoder, PromptRepsEncoder
from embedlib.eval.beir import load_beir
from embedlib.models.diffusion_lm import load_diffusion_lm
from embedlib.models.tiny import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from result_file import Result  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--texts", type=int, default=64, help="passages encoded per measurement")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--ar-no-cache",
        action="store_true",
        help="AR baseline without KV cache: each of the K steps re-reads the whole prompt",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    return parser.parse_args()


def same_size_encoders(folder: Path, hidden: int, layers: int, max_length: int, ar_cache: bool):
    """The causal checkpoint as the AR baseline and, loaded bidirectionally with its head, the diffusion one."""
    causal = make_tiny_checkpoint(
        folder / "causal",
        "qwen3-causal",
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64),
        num_key_value_heads=2,
    )
    diffusion = DiffRetrieverEncoder(load_diffusion_lm(causal, device="cpu", max_length=max_length))
    baseline = PromptRepsEncoder.from_pretrained(
        causal, device="cpu", max_length=max_length, use_cache=ar_cache
    )
    return diffusion, baseline


def seconds_per_text(encoder, texts: list[str], k: int, batch_size: int, repeats: int) -> tuple[float, int]:
    """Median wall seconds per text over ``repeats`` runs (after one warm-up) and forward passes per run."""
    encoder.encode(texts[:batch_size], k=k, batch_size=batch_size)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        encoder.encode(texts, k=k, batch_size=batch_size)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / len(texts), encoder.last_stats.forward_passes


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    ks = [r["k"] for r in rows]
    axes.plot(ks, [r["diffusion_ms"] for r in rows], marker="o", label="DiffRetriever (1 bidirectional pass)")
    axes.plot(ks, [r["ar_ms"] for r in rows], marker="s", label="PromptReps AR (K generation steps)")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("K representative tokens")
    axes.set_ylabel("ms per passage")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    args = parse_args()
    name = "diffretriever_latency" + ("_ar_no_cache" if args.ar_no_cache else "")
    result = Result(name)
    torch.set_num_threads(args.threads)
    texts = load_beir(args.dataset).doc_texts()[: args.texts]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        diffusion, baseline = same_size_encoders(
            Path(tmp), args.hidden, args.layers, args.max_length, not args.ar_no_cache
        )
        params = sum(p.numel() for p in diffusion.model.parameters())
        print(
            f"model: Qwen3 hidden={args.hidden} layers={args.layers} ({params / 1e6:.2f}M params), "
            f"{len(texts)} SciFact passages, max_length={args.max_length}, batch={args.batch_size}, "
            f"threads={args.threads}, AR KV cache {'off' if args.ar_no_cache else 'on'}"
        )
        print(
            f"{'K':>3} | {'diffusion ms/text':>17} | {'passes':>6} | {'AR ms/text':>10} | {'passes':>6} | speed-up"
        )
        for k in args.ks:
            diff_s, diff_passes = seconds_per_text(diffusion, texts, k, args.batch_size, args.repeats)
            ar_s, ar_passes = seconds_per_text(baseline, texts, k, args.batch_size, args.repeats)
            row = {
                "k": k,
                "diffusion_ms": diff_s * 1e3,
                "diffusion_passes": diff_passes,
                "ar_ms": ar_s * 1e3,
                "ar_passes": ar_passes,
                "speedup": ar_s / diff_s,
            }
            rows.append(row)
            print(
                f"{k:>3} | {row['diffusion_ms']:>17.2f} | {diff_passes:>6} | {row['ar_ms']:>10.2f} | "
                f"{ar_passes:>6} | {row['speedup']:.2f}x"
            )
    result.write({"args": vars(args), "params": params, "rows": rows}, folder=out)
    plot(rows, out / f"{name}.png")
    print(f"wrote {out / name}.png")


if __name__ == "__main__":
    main()
