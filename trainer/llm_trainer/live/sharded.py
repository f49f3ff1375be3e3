"""HSDP for the live driver: the state is replicated across hosts and sharded among a host's processes.

Losing a host (pod/node) always leaves full replicas on the others. Each generation gets a fresh
``(replicate, shard)`` device mesh over its new process group, so the model is re-wrapped with FSDP2 every
generation: a new module is built on the meta device, sharded on the new mesh, and its local shards (and
AdamW's) are copied from the previous generation's module, whose process groups are gone. A process keeps
its shard index (its position among its host's members), so the copy is local; joiners get their shard
from the member of the most advanced replica with the same shard index (:func:`llm_trainer.live.sync`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch import nn
from torch._C._distributed_c10d import Backend, ProcessGroupGloo
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from llm_trainer.config import ModelConfig
from llm_trainer.live.sync import ensure_optimizer_state, local
from llm_trainer.model import Transformer

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


def hsdp_mesh(world_size: int, shard_size: int, timeout: timedelta) -> DeviceMesh:
    """The generation's mesh: rows are hosts (replicas), columns the shard index within a host.

    Its groups get ``timeout`` (the driver's collective timeout) instead of the 30-minute default of new
    groups: a member blocked in a subgroup collective whose peer moved on then fails within it at worst
    (normally at once, when the peer drops its groups, see :func:`detach`)."""
    if shard_size < 1 or world_size % shard_size:
        raise ValueError(f"world size {world_size} is not a whole number of hosts of {shard_size} processes")

    def gloo() -> tuple[str, Backend.Options]:
        options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # gloo options with a timeout
        options._timeout = timeout
        return ("gloo", options)

    return init_device_mesh(
        "cpu",
        (world_size // shard_size, shard_size),
        mesh_dim_names=("replicate", "shard"),
        backend_override={"replicate": gloo(), "shard": gloo()},
    )


@dataclass
class LocalState:
    """This process's shards of the parameters and of AdamW's state, as plain tensors: what outlives a
    generation (the FSDP module holds the generation's process groups, which must go with it)."""

    params: list[torch.Tensor]
    optimizer: list[dict[str, torch.Tensor]]


def detach(model: nn.Module, optimizer: torch.optim.Optimizer) -> LocalState:
    """Copy the local shards out of a sharded model and its optimizer.

    A generation can fail between an all-gather and the reshard that follows it; resharding is local (it
    frees the gathered copy and puts the sharded parameters back), so it is done first."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    with torch.no_grad():
        params = [local(p).clone() for p in model.parameters()]
        states = [
            {
                k: local(v).clone()
                for k, v in optimizer.state.get(p, {}).items()
                if isinstance(v, torch.Tensor)
            }
            for p in model.parameters()
        ]
    return LocalState(params, states)


def build(
    shape: ModelConfig,
    mesh: DeviceMesh,
    seed: int,
    make_optimizer: OptimizerFactory,
    previous: LocalState | None,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A model sharded on ``mesh`` and its optimizer: initialised from ``seed``, or holding ``previous``
    (this process's shards from its last generation; the shard layout is the same, so the copy is local)."""
    with torch.device("meta"):
        model = Transformer(shape)
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    model.init_weights(seed)  # also the buffers (RoPE tables), which no shard carries
    optimizer = make_optimizer(model)
    if previous is None:
        return model, optimizer
    params = list(model.parameters())
    if len(params) != len(previous.params):
        raise ValueError("the kept shards do not match the model")
    ensure_optimizer_state(optimizer)
    with torch.no_grad():
        for param, kept, kept_state in zip(params, previous.params, previous.optimizer, strict=True):
            local(param).copy_(kept)
            new_state = optimizer.state[param]
            for key, value in kept_state.items():
                local(new_state[key]).copy_(value)
    return model, optimizer


def is_sharded(module: nn.Module) -> bool:
    """Whether the module's parameters are DTensors (FSDP2)."""
    return any(isinstance(p, DTensor) for p in module.parameters())
