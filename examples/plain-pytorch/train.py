"""A plain PyTorch training script that is not ours: its own model, data and loop, elastic through
``llm_elastic`` (the public API only). It runs the same way under every recovery mode:

    python train.py --steps 200                          # on a laptop: one process
    torchrun --nproc-per-node 2 train.py --steps 200     # restart mode, as the operator runs it
    # recovery inProcess: the operator runs `python train.py ...` with LLMJOB_LIVE_* set

The task: learn y = x @ W_true + noise on a synthetic data set generated from a seed (every process makes
the same data, so no files are needed). Each global batch of 32 samples is split across the members by
``ElasticSampler``, so the samples a step trains on are the same whatever the number of members.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from llm_elastic import Elastic, ElasticConfig, ElasticSampler, RNGState
from torch import nn


def make_data(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    w_true = torch.randn(features, 1, generator=gen)
    y = x @ w_true + 0.01 * torch.randn(samples, 1, generator=gen)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("LLMJOB_CHECKPOINT_DIR", ""))
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pad each step (demos, tests)")
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = make_data(4096, 16, seed=7)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    sampler = ElasticSampler(num_samples=len(x), global_batch=args.global_batch, seed=1)

    elastic = Elastic(
        model,
        optimizer,
        ElasticConfig(
            total_steps=args.steps,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every if args.checkpoint_dir else 0,
        ),
        state={"scheduler": scheduler, "rng": RNGState()},
        sampler=sampler,
    )
    for step in elastic.steps():
        with step:
            ids = sampler.indices(step.index, step.rank, step.world_size)
            pred = step.model(x[ids])
            # DDP averages gradients over the members: scaling this member's share of the batch's mean
            # loss by the world size makes the average the whole batch's mean, whatever the world size.
            loss = nn.functional.mse_loss(pred, y[ids], reduction="sum") / args.global_batch * step.world_size
            loss.backward()
            step.commit(loss)  # the runtime's one collective: returns the batch's mean loss
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            time.sleep(args.step_seconds)
    print(f"done: {elastic.step} steps", flush=True)


if __name__ == "__main__":
    main()
