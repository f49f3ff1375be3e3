"""A plain training script as a user writes it (public ``llm_elastic`` names only), for the loss-rule tests.

It trains the examples/plain-pytorch task and prints, at the start of every step, one JSON line
``{"event": "params", "index": i, "digest": ...}``: a hash of the parameters the step starts from. The test
option ``--nan-at-steps 3,6,7`` makes this process's loss NaN at those 1-based steps, each once (before the
backward, so the gradients carry it too, as a real overflow would); the job's loss rules come from
``$LLMJOB_LOSS_RULES`` as the operator sets them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
from llm_elastic import Elastic, ElasticConfig, ElasticSampler, RNGState
from torch import nn


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--snapshot-every", type=int, default=0)
    parser.add_argument("--nan-at-steps", default="")
    args = parser.parse_args()
    nan_due = {int(s) for s in args.nan_at_steps.split(",") if s}

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4096, 16, generator=gen)
    y = x @ torch.randn(16, 1, generator=gen)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sampler = ElasticSampler(num_samples=len(x), global_batch=32, seed=1)
    config = ElasticConfig(
        total_steps=args.steps, checkpoint_every=0, snapshot_every=args.snapshot_every, metrics_port=0
    )
    elastic = Elastic(model, optimizer, config, state={"rng": RNGState()}, sampler=sampler)
    for step in elastic.steps():
        event = {"event": "params", "index": step.index, "digest": digest(model), "pid": os.getpid()}
        print(json.dumps(event), flush=True)
        with step:
            ids = sampler.indices(step.index, step.rank, step.world_size)
            loss = nn.functional.mse_loss(step.model(x[ids]), y[ids], reduction="sum") / 32 * step.world_size
            if step.index + 1 in nan_due:
                nan_due.discard(step.index + 1)
                loss = loss * float("nan")
            loss.backward()
            step.commit(loss)
            optimizer.step()
            optimizer.zero_grad()
    print(json.dumps({"event": "done", "step": elastic.step, "digest": digest(model)}), flush=True)


if __name__ == "__main__":
    main()
