"""Throughput (tokens/s), model FLOPs utilisation and peak memory of one training step on one device.

One variant per process (so peak memory and compile caches are its own):
    python bench/trainer_mfu.py --model 1b --seq-len 2048 --micro-batch 4 --loss-chunk-tokens 2048 --compile
Side by side, each variant in a fresh subprocess, one table at the end (before/after of the issue "Training
that never waits"; ``--rounds 2`` repeats the list in alternating order, for a loaded machine):
    python bench/trainer_mfu.py --model 1b --seq-len 2048 --micro-batch 4 --compare
The variants: ``plain`` (full logits, then ``F.cross_entropy`` on their fp32 copy: the trainer before
``--loss-chunk-tokens``), ``chunked`` (``llm_trainer.loss``, what ``--loss-chunk-tokens N`` runs),
``recompute`` (chunks under ``torch.utils.checkpoint``: the logits recomputed in backward, the design
``docs/decisions.md`` T14 compares against); ``chunked:512`` overrides ``--loss-chunk-tokens`` for one
variant, and ``+compile`` adds ``torch.compile`` of the whole model, the loss included, as ``--compile`` does.

The step is the trainer's: forward with the targets (the model returns the summed token loss), backward,
AdamW (fused on CUDA). bf16 autocast on GPU, fp32 on CPU. Peak memory: ``torch.cuda.max_memory_allocated``
on GPU; on CPU the process's peak resident set (``ru_maxrss``) and how much it grew over the steps (above the
RSS after the model and optimizer were built). MFU is against the GPU's dense bf16 peak (H100/H200 SXM: 989
TFLOPS) or ``--peak-tflops``; on CPU only with ``--peak-tflops``. Synthetic token ids: no data set needed.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from llm_trainer.config import MODELS, ModelConfig, model_config
from llm_trainer.loss import plain_cross_entropy
from llm_trainer.model import Transformer, flops_per_token
from torch.utils.checkpoint import checkpoint

GPU_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}
VARIANTS = ("plain", "chunked", "recompute")
DEFAULT_COMPARE = "plain,chunked,plain+compile,chunked+compile"

# Llama 3's 128256-entry vocabulary (tied, as in 1B) on a body a 2-core CPU can step in seconds.
MODELS.setdefault(
    "bench-128k",
    ModelConfig(
        dim=256,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=704,
        vocab_size=128256,
        max_seq_len=4096,
        rope_theta=500000.0,
        tie_embeddings=True,
    ),
)


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


def rss_bytes() -> int:
    """Current resident set of this process (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def recompute_loss(
    model: Transformer, inputs: torch.Tensor, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """The alternative design: chunks of the plain path under activation checkpointing (each chunk's
    logits are recomputed in backward: four output-layer matmuls per token instead of three)."""
    hidden = model.hidden_states(inputs)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    total = torch.zeros((), device=hidden.device)
    for start in range(0, flat_hidden.shape[0], chunk):
        part: torch.Tensor = checkpoint(
            plain_cross_entropy,
            flat_hidden[start : start + chunk],
            model.output.weight,
            flat_targets[start : start + chunk],
            use_reentrant=False,
        )
        total = total + part
    return total


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Build, warm up, time ``--steps`` steps of one variant; the result as a dict."""
    spec, _, extra = args.variant.partition("+")
    name, _, chunk_text = spec.partition(":")
    compile_model = args.compile or extra == "compile"
    if name not in VARIANTS or extra not in ("", "compile"):
        raise SystemExit(
            f"unknown variant {args.variant!r}: one of {', '.join(VARIANTS)}, optionally :CHUNK, +compile"
        )
    if name == "recompute" and compile_model:
        raise SystemExit("recompute runs outside the model's forward: nothing to compile")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = model_config(args.model)
    torch.manual_seed(0)
    model = Transformer(cfg)
    model.init_weights(0)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    bf16 = device.type == "cuda"
    tokens = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    chunk = 0 if name == "plain" else int(chunk_text or args.loss_chunk_tokens)

    def loss_of() -> torch.Tensor:
        if name == "recompute":
            return recompute_loss(model, inputs, targets, chunk)
        out: torch.Tensor = model(inputs, targets, chunk)
        return out

    if compile_model:
        model.compile()

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    rss_before = rss_bytes()
    started = time.perf_counter()
    first_loss = float(step().item())  # compiles when compiling; AdamW allocates its state
    first_step_s = time.perf_counter() - started
    for _ in range(args.warmup - 1):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
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
    result: dict[str, Any] = {
        "variant": args.variant,
        "model": args.model,
        "params": cfg.num_params(),
        "vocab": cfg.vocab_size,
        "device": device_name(device),
        "dtype": "bf16-autocast" if bf16 else "fp32",
        "threads": torch.get_num_threads(),
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "loss_chunk_tokens": chunk,
        "compile": compile_model,
        "first_loss": round(first_loss / (args.micro_batch * args.seq_len), 5),
        "first_step_s": round(first_step_s, 2),
        "step_s_median": round(per_step, 4),
        "step_s_min": round(min(times), 4),
        "step_s_all": [round(t, 4) for t in times],
        "tokens_per_s": round(tokens_per_s, 1),
        "achieved_tflops": round(achieved / 1e12, 3),
        "mfu": round(achieved / (peak * 1e12), 4) if peak else None,
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    else:
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        result["peak_rss_gib"] = round(peak_rss / 2**30, 2)
        result["step_rss_growth_gib"] = round((peak_rss - rss_before) / 2**30, 2)
    return result


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Every variant of ``--compare`` in its own process, then one Markdown table."""
    variants = [v.strip() for v in args.compare.split(",") if v.strip()]
    passthrough: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value and not arg.startswith("--"):
            skip_value = False
            continue
        skip_value = arg == "--compare"
        if not arg.startswith("--compare"):
            passthrough.append(arg)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    failed: dict[str, str] = {}
    for round_index in range(args.rounds):
        order = variants if round_index % 2 == 0 else variants[::-1]
        for variant in order:
            cmd = [sys.executable, __file__, *passthrough, "--variant", variant]
            print(f"# round {round_index + 1}, {variant}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                failed[variant] = f"exit {done.returncode}"
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
            runs[variant].append(row)
    rows: list[dict[str, Any]] = []
    for variant in variants:
        if variant in failed or not runs[variant]:
            rows.append({"variant": variant, "error": failed.get(variant, "no run")})
            continue
        merged = dict(runs[variant][0])
        times = [t for run in runs[variant] for t in run["step_s_all"]]
        merged["step_s_median"] = round(statistics.median(times), 4)
        merged["step_s_min"] = round(min(times), 4)
        scale = merged["step_s_median"] / runs[variant][0]["step_s_median"]
        merged["tokens_per_s"] = round(runs[variant][0]["tokens_per_s"] / scale, 1)
        merged["achieved_tflops"] = round(runs[variant][0]["achieved_tflops"] / scale, 3)
        if merged["mfu"] is not None:
            merged["mfu"] = round(runs[variant][0]["mfu"] / scale, 4)
        merged["first_step_s"] = max(run["first_step_s"] for run in runs[variant])
        for key in ("peak_mem_gib", "peak_rss_gib", "step_rss_growth_gib"):
            if key in merged:
                merged[key] = max(run[key] for run in runs[variant])
        rows.append(merged)
    memory = "peak GPU memory" if any("peak_mem_gib" in r for r in rows) else "peak RSS (growth over steps)"
    header = [
        "variant",
        "step median (min)",
        "tokens/s",
        "TFLOPS",
        "MFU",
        memory,
        "first step",
        "loss at step 1",
    ]
    print("\n| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} | | | | | | |")
            continue
        if "peak_mem_gib" in r:
            mem = f"{r['peak_mem_gib']} GiB"
        else:
            mem = f"{r['peak_rss_gib']} GiB ({r['step_rss_growth_gib']} GiB)"
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "-"
        print(
            f"| {r['variant']} | {r['step_s_median']} s ({r['step_s_min']} s) | {r['tokens_per_s']:.0f} | "
            f"{r['achieved_tflops']} | "
            f"{mfu} | {mem} | {r['first_step_s']} s | {r['first_loss']} |"
        )
    print(f"(step: median and min over {args.rounds} round(s) x {args.steps} timed steps; memory: the max)")
    return 0 if all("error" not in r for r in rows) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", help=f"a named shape ({', '.join(MODELS)})")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (at least 1)")
    parser.add_argument(
        "--variant", default="chunked", help=f"{', '.join(VARIANTS)}, optionally :CHUNK and/or +compile"
    )
    parser.add_argument("--loss-chunk-tokens", type=int, default=2048, help="chunk of chunked/recompute")
    parser.add_argument("--compile", action="store_true", help="torch.compile the whole model")
    parser.add_argument(
        "--compare",
        nargs="?",
        const=DEFAULT_COMPARE,
        default=None,
        help=f"run these variants side by side in subprocesses (default: {DEFAULT_COMPARE})",
    )
    parser.add_argument("--rounds", type=int, default=1, help="with --compare: repeat the list this often")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    args.warmup = max(1, args.warmup)
    if args.compare is not None:
        return compare(args, argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(run_one(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
