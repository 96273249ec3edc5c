"""Acceptance 3: one diffusion-pretraining step loop of a Qwen3-0.6B-shaped bidirectional model (random init,
no download) under DeepSpeed ZeRO-2 in bf16 at 4k tokens per sequence; prints tokens/s and model FLOP
utilisation (MFU). Made for one call on a lent H200; ``--tiny`` runs small shapes in fp32 on a CPU.

    python bench/train_gpu.py                      # GPU: Qwen3-0.6B shape, bf16, ZeRO-2, 4096 tokens
    python bench/train_gpu.py --tiny --steps 4     # CPU smoke

Token ids are random (the Qwen3 tokenizer is not available offline): throughput does not depend on them.
FLOPs per token: 6·N (N = every parameter that takes part in a matmul, the tied LM head included) plus
12·layers·heads·head_dim·seq_len for full (bidirectional) attention, as in PaLM's MFU definition.
"""

from __future__ import annotations

import os
import time

import torch
from gpu_shapes import QWEN3_0_6B_SHAPE, gpu_bench_parser
from result_file import Result

from embedlib.models.bidirectional import BidirectionalQwen3ForMaskedLM, to_bidirectional_config
from embedlib.models.tiny import tiny_qwen3_config
from embedlib.training.config import TrainConfig, from_dict
from embedlib.training.runner import make_engine
from embedlib.training.stages import DiffusionObjective

QWEN3_VOCAB = 151936
QWEN3_MASK_ID = 151669  # first embedding row past the tokenizer's 151669 tokens: never produced by it


def flops_per_token(config, seq_len: int, params: int) -> float:
    attention = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * seq_len
    return 6 * params + attention


def init_single_process_group(backend: str) -> None:
    import deepspeed

    for key, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": os.environ.get("MASTER_PORT", "29512"),
    }.items():
        os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend=backend)


def main() -> None:
    parser = gpu_bench_parser(__doc__, "small shapes, fp32, CPU")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    result = Result("train_gpu" + ("_tiny" if args.tiny else ""))
    cuda = torch.cuda.is_available() and not args.tiny
    if args.tiny:
        config = tiny_qwen3_config(2048)
        args.seq_len, args.batch_size, mask_id = min(args.seq_len, 256), min(args.batch_size, 4), 2047
    else:
        config = tiny_qwen3_config(QWEN3_VOCAB, **QWEN3_0_6B_SHAPE)
        mask_id = QWEN3_MASK_ID
    init_single_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = BidirectionalQwen3ForMaskedLM(to_bidirectional_config(config))
    params = sum(p.numel() for p in model.parameters())
    module = DiffusionObjective(model, mask_id, seed=0).to(device)
    cfg = from_dict(
        TrainConfig,
        {
            "stage": "pretrain",
            "model": "random-init",
            "output": "unused",
            "data": {"url": "random-ids"},
            "batch_size": args.batch_size,
            "max_steps": args.steps,
            "optimizer": {"lr": 1e-4, "warmup_steps": 1, "schedule": "constant"},
            "deepspeed": {"zero_stage": 2, "precision": "bf16" if cuda else "fp32"},
        },
    )
    module.generator = torch.Generator(device=device).manual_seed(0)
    engine = make_engine(module, cfg, args.steps)
    ids = torch.randint(
        0, min(QWEN3_MASK_ID, config.vocab_size - 1), (args.batch_size, args.seq_len), device=device
    )
    attention = torch.ones_like(ids)
    timings = []
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = engine(input_ids=ids, attention_mask=attention)
        engine.backward(out["loss"])
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
        print(
            f"step {step + 1}: loss {out['loss'].item():.3f}, masked acc {out['accuracy'].item():.3f}, "
            f"{timings[-1]:.3f} s",
            flush=True,
        )
    measured = timings[args.warmup :] or timings
    tokens_per_s = args.batch_size * args.seq_len / (sum(measured) / len(measured))
    achieved = tokens_per_s * flops_per_token(config, args.seq_len, params)
    print(
        f"model: {params / 1e6:.2f}M parameters, {config.num_hidden_layers} layers, hidden {config.hidden_size}; "
        f"{'bf16 ZeRO-2 on ' + torch.cuda.get_device_name(0) if cuda else 'fp32 ZeRO-2 on CPU'}"
    )
    print(
        f"tokens/s: {tokens_per_s:,.0f} ({args.batch_size} x {args.seq_len} tokens per step, "
        f"mean of {len(measured)} steps)"
    )
    print(
        f"achieved {achieved / 1e12:.1f} TFLOP/s; MFU {achieved / (args.peak_tflops * 1e12):.1%} "
        f"of {args.peak_tflops} TFLOP/s peak" + (" (a GPU peak: meaningless on CPU)" if not cuda else "")
    )
    if cuda:
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    result.write({
        "args": vars(args), "parameters": params, "tokens_per_s": tokens_per_s, "tflops": achieved / 1e12,
        "mfu": achieved / (args.peak_tflops * 1e12),
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    })


if __name__ == "__main__":
    main()
