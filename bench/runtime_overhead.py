"""What the runtime library costs in a healthy step: the same training loop with and without ``llm_elastic``.

Both variants run the reference model's step under ``torchrun --standalone --nproc-per-node 2`` (gloo on
CPU; on a GPU box, NCCL): ``plain`` is a hand-written DDP loop (forward, backward, AdamW, one ``.item()`` of
the loss), ``elastic`` is the same loop inside ``Elastic.steps()`` (the commit's all-reduce of the loss and
the runtime's flags, the step record, the metrics update; no checkpoints). Each variant runs in fresh
processes, rounds alternate (plain, elastic, elastic, plain, ...) so drift on a loaded machine hits both; the
median step time of each is printed, and the difference as a share of the plain step. Then the periodic
health check (``spec.healthCheck.intervalSeconds``): the duration of one run of the checks a worker repeats
(the checkpoint volume's write + fsync, /dev/shm), and its share of the default interval.

    python bench/runtime_overhead.py                       # tiny model and a ~1 s CPU step, 4 rounds
    python bench/runtime_overhead.py --models tiny --rounds 10 --steps 200   # what docs/benchmarks.md shows

On the 2-core VM one run's step time is bimodal (the same variant gives 12.5 ms in one run and 16 ms in the
next), so a few short rounds can show a cost that is not there: use ten rounds or more for the tiny model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = {
    # name: (model, sequence length, samples per rank per step)
    "tiny": ("tiny", 64, 4),
    "1s": ("125m", 128, 2),  # about a second per step on the 2-core development VM
}


def worker(variant: str, model_name: str, seq_len: int, batch: int, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from llm_trainer.config import model_config
    from llm_trainer.model import Transformer

    torch.manual_seed(0)
    shape = model_config(model_name)
    model = Transformer(shape)
    model.init_weights(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, shape.vocab_size, (batch, seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    times: list[float] = []

    if variant == "plain":
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        ddp = DistributedDataParallel(model)
        for index in range(steps + warmup):
            started = time.monotonic()
            loss = ddp(inputs, targets) / (batch * seq_len)
            loss.backward()
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            optimizer.step()
            optimizer.zero_grad()
            reduced.item()
            if index >= warmup:
                times.append(time.monotonic() - started)
        dist.destroy_process_group()
    else:
        from llm_elastic import Elastic, ElasticConfig

        elastic = Elastic(model, optimizer, ElasticConfig(total_steps=steps + warmup, metrics_port=0))
        for step in elastic.steps():
            with step:
                started = time.monotonic()
                loss = step.model(inputs, targets) / (batch * seq_len)
                loss.backward()
                step.commit(loss)
                optimizer.step()
                optimizer.zero_grad()
                if step.index >= warmup:
                    times.append(time.monotonic() - started)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"median_step_s": statistics.median(times)}), flush=True)


def run(variant: str, model: str, steps: int, warmup: int) -> float:
    name, seq_len, batch = MODELS[model]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = [
        torchrun, "--standalone", "--nproc-per-node=2", __file__, "--worker", variant,
        "--model-name", name, "--seq-len", str(seq_len), "--batch", str(batch),
        "--steps", str(steps), "--warmup", str(warmup),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", LLMJOB_RECOVERY="restart")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=1800)
    line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
    return float(json.loads(line)["median_step_s"])


def health_check_cost(runs: int) -> None:
    """One periodic run of the worker's checks, timed ``runs`` times on a scratch directory."""
    import tempfile

    from llm_elastic.health import Checks, HealthPolicy

    policy = HealthPolicy()
    with tempfile.TemporaryDirectory(prefix="health-bench-") as scratch:
        checks = Checks(policy, scratch, "/dev/shm", 64 << 20, 1)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            finding = checks.run(periodic=True)
            times.append(time.perf_counter() - started)
            if finding is not None:
                raise SystemExit(f"the health check failed on this machine: {finding.line()}")
    median = statistics.median(times)
    print(
        f"\nperiodic health check (checkpoint dir write + fsync, /dev/shm 64 MiB): {median * 1e3:.1f} ms "
        f"median of {runs} (max {max(times) * 1e3:.1f} ms); every {policy.intervalSeconds:g} s that is "
        f"{100 * median / policy.intervalSeconds:.4f} % of wall time, in a background thread"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", choices=["plain", "elastic"], help=argparse.SUPPRESS)
    parser.add_argument("--model-name", help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--models", default="tiny,1s", help="comma-separated: tiny, 1s")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--steps", type=int, default=0, help="timed steps per run (default: 200 tiny, 12 for 1s)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--checks", type=int, default=20, help="timed runs of the periodic health check")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model_name, args.seq_len, args.batch, args.steps, args.warmup)
        return 0
    print("| model | plain step (median) | with llm_elastic | cost |\n|---|---|---|---|")
    for model in [m for m in args.models.split(",") if m]:
        if model not in MODELS:
            parser.error(f"--models: {model!r} is not one of {', '.join(MODELS)}")
        steps = args.steps or (200 if model == "tiny" else 12)
        got: dict[str, list[float]] = {"plain": [], "elastic": []}
        for rnd in range(args.rounds):
            order = ("plain", "elastic") if rnd % 2 == 0 else ("elastic", "plain")
            for variant in order:
                got[variant].append(run(variant, model, steps, args.warmup))
        plain, elastic = statistics.median(got["plain"]), statistics.median(got["elastic"])
        print(
            f"| {model} ({MODELS[model][0]}) | {plain * 1e3:.1f} ms | {elastic * 1e3:.1f} ms | "
            f"{100 * (elastic - plain) / plain:+.1f} % |",
            flush=True,
        )
    print(f"\n{os.cpu_count()} CPUs, 2 processes, gloo; load average {os.getloadavg()[0]:.1f}")
    if args.checks:
        health_check_cost(args.checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
