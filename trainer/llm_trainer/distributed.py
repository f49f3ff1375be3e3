"""Process group, device and data-parallel wrapping (DDP for small models, FSDP2 for large ones)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import HashStore
from torch.nn.parallel import DistributedDataParallel

from llm_trainer.config import ModelConfig
from llm_trainer.model import Transformer

FSDP_MIN_PARAMS = 1_000_000_000


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    restart_count: int
    """torchelastic's restart count of this agent (0 outside torchrun)."""
    local_world_size: int = 1
    """Workers on this node (torchrun's LOCAL_WORLD_SIZE)."""


def init_distributed(timeout_s: float) -> DistEnv:
    """Join the process group from torchrun's env, or make a one-process group when run directly."""
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # CPU collectives (background checkpoint persists, snapshot copies) need gloo beside NCCL.
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1, timeout=timeout)
    return DistEnv(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        backend=backend,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    )


def cpu_group() -> dist.ProcessGroup:
    """A new gloo group of every rank (collective: every rank calls it in the same order)."""
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    return group


def choose_parallel(mode: str, cfg: ModelConfig, world_size: int) -> str:
    """``ddp`` or ``fsdp``; ``auto`` shards models of 1B+ parameters when there is more than one rank."""
    if mode != "auto":
        return mode
    return "fsdp" if world_size > 1 and cfg.num_params() >= FSDP_MIN_PARAMS else "ddp"


def build_model(
    cfg: ModelConfig, env: DistEnv, parallel: str, bf16: bool, seed: int, compile_model: bool
) -> nn.Module:
    """The model on ``env.device``, initialised from ``seed`` and wrapped for data parallelism.

    ``compile_model``: under DDP the wrapped model is compiled whole, its forward including the loss (DDP
    before compile, so TorchDynamo splits the graph at DDP's buckets and gradient all-reduces still overlap
    the backward); under FSDP2 each block is compiled before ``fully_shard`` (FSDP2's hooks stay outside
    the graphs). Both compile in place (``nn.Module.compile``): parameter names, hence checkpoints, do not
    change."""
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        with torch.device("meta"):
            model = Transformer(cfg)
        kwargs: dict[str, Any] = {}
        if bf16:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            if compile_model:
                block.compile()
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        model.to_empty(device=env.device)
        model.init_weights(seed)
        return model
    model = Transformer(cfg)
    model.init_weights(seed)
    model.to(env.device)
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids)
    if compile_model:
        wrapped.compile()
    return wrapped


def unwrap(model: nn.Module) -> Transformer:
    """The ``Transformer`` inside a DDP wrapper (FSDP2 shards in place)."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    assert isinstance(inner, Transformer)
    return inner


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on accumulation micro-steps (DDP ``no_sync`` / FSDP2 flag)."""
    if isinstance(model, DistributedDataParallel):
        if enabled:
            yield
        else:
            with model.no_sync():
                yield
        return
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)
    yield
