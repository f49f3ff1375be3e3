"""How the program's model is wrapped for data parallelism in each generation (a policy object).

* :class:`DDP` (the default): the same module in a new ``DistributedDataParallel`` every generation
  (``init_sync=False``: the state transfer already made every member equal).
* :class:`HSDP`: replicated across hosts and sharded (FSDP2) among a host's processes, so losing a host
  always leaves full replicas. FSDP2 shards a module in place and binds it to the generation's mesh, so
  each generation builds a new module on the meta device with the program's ``build`` function, shards it
  on the new ``(replicate, shard)`` mesh, makes its optimizer with ``make_optimizer`` and copies in this
  process's shards from the previous generation (a process keeps its shard index, so the copy is local);
  joiners get theirs from the same shard index of the most advanced replica. ``step.model`` and
  ``step.optimizer`` are the current objects.
* :class:`AsIs`: the program wraps the model itself (for example FSDP2 over all ranks under torchrun).
  Only for restart mode, where a process group lives as long as the process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh


class StepClock:
    """When the current step's first gradient bucket was ready (DDP comm hook): the end of the step's local
    compute before any wait for a peer (straggler detection reads and clears it)."""

    def __init__(self) -> None:
        self.first_bucket: float | None = None


@dataclass
class WrapContext:
    """What a wrap policy gets: the generation's world and the device."""

    world_size: int
    rank: int
    device: torch.device
    backend: str
    timeout: timedelta
    clock: StepClock | None = None
    """Where a DDP wrapping marks each step's first gradient bucket (set while stragglers are watched)."""


@dataclass
class Wrapped:
    """A policy's result: the module to train, the optimizers, the replica group (HSDP) and shard size."""

    module: nn.Module
    base: nn.Module
    """The module whose state is the training state (the unwrapped one under DDP)."""
    optimizers: list[torch.optim.Optimizer]
    replica_group: dist.ProcessGroup | None = None
    shard_size: int = 1


class WrapPolicy:
    """Base of the policies."""

    elastic = True
    """Whether the wrapping can be redone for a new generation (in-process recovery needs it)."""
    shard_size = 1

    def wrap(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], gen: WrapContext) -> Wrapped:
        raise NotImplementedError

    def park(self, wrapped: Wrapped) -> None:
        """End of a generation: let go of what holds its process groups."""


class AsIs(WrapPolicy):
    """The program's model as given (already wrapped by the program)."""

    elastic = False

    def wrap(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], gen: WrapContext) -> Wrapped:
        return Wrapped(model, model, optimizers)


@dataclass
class DDP(WrapPolicy):
    """``DistributedDataParallel`` around the same module every generation."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of ``DistributedDataParallel`` (for example ``bucket_cap_mb``)."""
    compile: bool = False
    """``torch.compile`` the wrapped model (DDP first, so gradient all-reduces still overlap the backward)."""
    clock: StepClock | None = None
    """Marks each step's first gradient bucket; the runtime passes its own in :class:`WrapContext` instead
    (the policy object is never changed)."""

    def wrap(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], gen: WrapContext) -> Wrapped:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [gen.device.index] if gen.device.type == "cuda" else None
        module = DistributedDataParallel(model, device_ids=device_ids, init_sync=False, **self.kwargs)
        clock = gen.clock if gen.clock is not None else self.clock
        if clock is not None:
            module.register_comm_hook(clock, _timed_allreduce)
        if self.compile:
            module.compile()
        return Wrapped(module, model, optimizers)

    def park(self, wrapped: Wrapped) -> None:
        """Drop the wrapper's hold on the generation's process group: the training loop may still hold the
        old wrapper (a local variable), and while anything holds the group its connections stay open, so a
        peer blocked on this process would wait for the collective timeout instead of failing at once."""
        module = wrapped.module
        if module is wrapped.base:
            return
        inner = getattr(module, "_orig_mod", module)  # a compiled wrapper
        for name in ("reducer", "process_group", "logger", "_delay_all_reduce_params"):
            inner.__dict__.pop(name, None)


@dataclass
class HSDP(WrapPolicy):
    """Replicated across hosts, FSDP2-sharded within a host of ``shard_size`` processes."""

    build: Callable[[], nn.Module]
    """Makes the model (called under ``torch.device("meta")``)."""
    init: Callable[[nn.Module], None]
    """Initialises a sharded model's parameters and buffers (the first generation's state, and buffers)."""
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    shard_size: int = 1
    blocks: Callable[[nn.Module], Iterable[nn.Module]] = lambda model: ()
    """Sub-modules sharded on their own before the root (for example the transformer blocks)."""
    subgroup_timeout: float = 5.0
    """Timeout of the mesh's groups: a blocked gloo op cannot be interrupted (docs/decisions.md L5)."""
    mixed_precision: Any = None
    """An FSDP2 ``MixedPrecisionPolicy``, or None."""
    compile: bool = False
    """``torch.compile`` each block before it is sharded (FSDP2's hooks stay outside the graphs)."""

    def wrap(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], gen: WrapContext) -> Wrapped:
        from torch.distributed.fsdp import fully_shard

        mesh = self._mesh(gen)
        with torch.device("meta"):
            fresh = self.build()
        kwargs: dict[str, Any] = {"mesh": mesh}
        if self.mixed_precision is not None:
            kwargs["mp_policy"] = self.mixed_precision
        for block in self.blocks(fresh):
            if self.compile:
                block.compile()
            fully_shard(block, **kwargs)
        fully_shard(fresh, **kwargs)
        fresh.to_empty(device=gen.device)
        self.init(fresh)  # also the buffers, which no shard carries
        optimizer = self.make_optimizer(fresh)
        if any(p.device.type != "meta" for p in model.parameters()):  # a previous generation's shards
            _copy_local(model, optimizers[0], fresh, optimizer)
        return Wrapped(fresh, fresh, [optimizer], mesh.get_group("replicate"), self.shard_size)

    def _mesh(self, gen: WrapContext) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        if gen.world_size % self.shard_size:
            raise ValueError(
                f"world size {gen.world_size} is not a whole number of hosts of {self.shard_size} processes"
            )
        override: dict[int | str, Any] = {}
        if gen.device.type == "cpu":
            from torch._C._distributed_c10d import ProcessGroupGloo

            options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # gloo options with a timeout
            options._timeout = timedelta(seconds=self.subgroup_timeout)
            override = {"replicate": ("gloo", options), "shard": ("gloo", options)}
        return init_device_mesh(
            gen.device.type,
            (gen.world_size // self.shard_size, self.shard_size),
            mesh_dim_names=("replicate", "shard"),
            backend_override=override,
        )

    def park(self, wrapped: Wrapped) -> None:
        """Reshard (a generation can fail between an all-gather and its reshard; resharding is local)."""
        from torch.distributed.fsdp import FSDPModule

        for module in wrapped.module.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def _timed_allreduce(clock, bucket):  # type: ignore[no-untyped-def]  # DDP checks the bucket's annotation
    """DDP's default all-reduce of a gradient bucket, marking when the step's first bucket was ready (no
    annotations: DDP refuses a hook whose ``bucket`` is annotated with anything but the class itself, and
    this module's annotations are strings)."""
    import time

    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if clock.first_bucket is None:
        clock.first_bucket = time.monotonic()
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default group


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor.data


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's lazily made state (torch's own helper: a zero-learning-rate step with zero
    gradients), so that it can be received in place; only for state about to be overwritten (the step
    counts as one for Adam). Keys are the optimizer's business."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optimizer)


def _copy_local(
    old: nn.Module, old_optimizer: torch.optim.Optimizer, new: nn.Module, new_optimizer: torch.optim.Optimizer
) -> None:
    """Copy this process's shards (parameters and optimizer state, whatever its keys) from ``old``; an
    optimizer that never stepped stays without state (making it would change its next steps)."""
    with_optimizer = bool(old_optimizer.state)
    if with_optimizer:
        init_optimizer_state(new_optimizer)
    old_params, new_params = list(old.parameters()), list(new.parameters())
    if len(old_params) != len(new_params):
        raise ValueError("the previous generation's model does not match the new one")
    with torch.no_grad():
        for old_p, new_p in zip(old_params, new_params, strict=True):
            _local(new_p).copy_(_local(old_p))
            if not with_optimizer:
                continue
            old_state, new_state = old_optimizer.state.get(old_p, {}), new_optimizer.state[new_p]
            for key, value in old_state.items():
                if isinstance(value, torch.Tensor):
                    target = new_state.get(key)
                    if isinstance(target, torch.Tensor):
                        _local(target).copy_(_local(value))
                else:
                    new_state[key] = value
