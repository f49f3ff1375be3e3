"""Throughput (tokens/s) and model FLOPs utilisation of one training step on one device.

On a CUDA machine (the numbers the docs ask for):
    python bench/trainer_mfu.py --model 125m --seq-len 2048 --micro-batch 8
    python bench/trainer_mfu.py --model 1b --seq-len 2048 --micro-batch 4 --compile
bf16 autocast on GPU; peak FLOPs default to the GPU's dense bf16 figure (H100/H200 SXM: 989 TFLOPS) or
``--peak-tflops``. On CPU (fp32) it measures tokens/s; MFU is printed only when ``--peak-tflops`` is given.
Synthetic token ids: no data set needed. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from llm_trainer.config import model_config
from llm_trainer.model import Transformer, flops_per_token

GPU_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in GPU_PEAK_TFLOPS.items() if k in name), None)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="torch.compile each block")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = model_config(args.model)
    torch.manual_seed(0)
    model = Transformer(cfg)
    model.init_weights(0)
    model.to(device)
    if args.compile:
        for block in model.layers:
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    bf16 = device.type == "cuda"
    tokens = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len + 1), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - started)
    per_step = statistics.median(times)
    tokens_per_s = args.micro_batch * args.seq_len / per_step
    achieved = flops_per_token(cfg, args.seq_len) * tokens_per_s
    peak = peak_tflops(device, args.peak_tflops)
    result = {
        "model": args.model,
        "params": cfg.num_params(),
        "device": device_name(device),
        "dtype": "bf16-autocast" if bf16 else "fp32",
        "threads": torch.get_num_threads(),
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "compile": args.compile,
        "step_s_median": round(per_step, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "achieved_tflops": round(achieved / 1e12, 3),
        "mfu": round(achieved / (peak * 1e12), 4) if peak else None,
        "torch": torch.__version__,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
