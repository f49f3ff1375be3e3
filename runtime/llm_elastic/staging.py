"""Copy the training state into host buffers that are allocated once and reused.

The state is ``{"model": ..., "optim": ...}`` from ``get_state_dict``: nested dicts and lists whose tensor
leaves are plain tensors (DDP) or DTensors (FSDP2). :class:`HostStage` keeps one CPU buffer per tensor
leaf (pinned when the source is on a GPU, so the device-to-host copy runs at full speed) and, on every
:meth:`HostStage.stage`, copies the leaves into them and returns the same structure with the copies in
place (DTensors keep their sharding spec around a CPU local tensor, so DCP can plan and write them).

On a GPU the copies run on a side stream: :meth:`HostStage.stage` returns at once and
:meth:`HostStage.before_update` makes the optimizer's kernels wait for the copies (parameters must not
change while they are read); readers of the staged copy call :meth:`HostStage.wait_copied` first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor

StateDict = dict[str, Any]


def tensor_leaves(state: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor leaf, in a deterministic order (``/``-joined keys)."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for key in sorted(state, key=str):
            yield from tensor_leaves(state[key], f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for index, item in enumerate(state):
            yield from tensor_leaves(item, f"{prefix}/{index}" if prefix else str(index))


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this rank holds (a DTensor's local shard, else the tensor itself)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def map_tensors(state: Any, fn: Callable[[str, torch.Tensor], torch.Tensor], prefix: str = "") -> Any:
    """``state`` with every tensor leaf replaced by ``fn(path, leaf)`` (paths as in :func:`tensor_leaves`)."""
    if isinstance(state, torch.Tensor):
        return fn(prefix, state)
    if isinstance(state, dict):
        return {k: map_tensors(v, fn, f"{prefix}/{k}" if prefix else str(k)) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        items = [map_tensors(v, fn, f"{prefix}/{i}" if prefix else str(i)) for i, v in enumerate(state)]
        return type(state)(items)
    return state


class HostStage:
    """Reusable host copies of a state dict's tensors (allocated on first use, re-allocated only when a
    tensor's shape or dtype changes)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._event: torch.cuda.Event | None = None
        self._stream: torch.cuda.Stream | None = None
        self.nbytes = 0

    def _buffer(self, path: str, source: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != source.shape or buf.dtype != source.dtype:
            pin = source.device.type == "cuda"
            buf = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buf
            self.nbytes = sum(b.numel() * b.element_size() for b in self._buffers.values())
        return buf

    def stage(self, state: StateDict) -> StateDict:
        """Start copying ``state``'s tensors into the host buffers; returns the staged structure."""
        on_gpu = any(t.device.type == "cuda" for _, t in tensor_leaves(state))
        if on_gpu and self._stream is None:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        if on_gpu:
            assert self._stream is not None
            self._stream.wait_stream(torch.cuda.current_stream())

        def copy(path: str, tensor: torch.Tensor) -> torch.Tensor:
            source = local_part(tensor).detach()
            buf = self._buffer(path, source)
            if source.device.type == "cuda":
                assert self._stream is not None
                with torch.cuda.stream(self._stream):
                    buf.copy_(source, non_blocking=True)
            else:
                buf.copy_(source)
            if isinstance(tensor, DTensor):
                return DTensor(buf, tensor._spec, requires_grad=False)
            return buf

        staged = map_tensors(state, copy)
        if on_gpu:
            assert self._stream is not None
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
            self._event = event
        return dict(staged)

    def before_update(self) -> None:
        """Make the current stream (the optimizer's) wait until the copies have read the parameters."""
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)

    def wait_copied(self) -> None:
        """Block the calling thread until the staged copy is complete."""
        if self._event is not None:
            self._event.synchronize()
