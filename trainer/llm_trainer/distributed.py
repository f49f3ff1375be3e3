"""Data-parallel choices of the trainer (the process group and the wrapping belong to ``llm_elastic``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from llm_trainer.config import ModelConfig

FSDP_MIN_PARAMS = 1_000_000_000


def choose_parallel(mode: str, cfg: ModelConfig, world_size: int) -> str:
    """``ddp``, ``fsdp`` or ``hsdp``; ``auto`` shards models of 1B+ parameters when there is more than one
    rank to shard over."""
    if mode != "auto":
        return mode
    return "fsdp" if world_size > 1 and cfg.num_params() >= FSDP_MIN_PARAMS else "ddp"


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on accumulation micro-steps (DDP ``no_sync`` / FSDP2 flag)."""
    inner = getattr(model, "_orig_mod", model)  # a compiled wrapper
    if isinstance(inner, DistributedDataParallel):
        if enabled:
            yield
        else:
            with inner.no_sync():
                yield
        return
    setter = getattr(inner, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)
    yield
