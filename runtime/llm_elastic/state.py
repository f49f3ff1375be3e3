"""The training state a program hands to the runtime, through the ecosystem's ``Stateful`` protocol.

``model`` and ``optimizers`` go through ``torch.distributed.checkpoint.state_dict`` (``get_state_dict`` /
``set_state_dict``): the same FQN-keyed dicts that checkpoints use, for plain, DDP-wrapped and FSDP2 modules
and any optimizer (the optimizer's lazily created state is materialised by torch's own helper, so a joiner
that never stepped has the same tensors as a survivor). ``extras`` are the program's other ``Stateful``
objects (an LR scheduler, a data sampler, RNG state, anything with ``state_dict()`` /
``load_state_dict()``), treated as replicated: every member holds the same values. The runtime never reads
a key of any of these dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()`` (torch's ``Stateful``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class RNGState:
    """The process's CPU (and current CUDA device's) random generator state, as a ``Stateful``."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["cpu"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state(state_dict["cuda"])


class TrainState:
    """The model, its optimizers and the extras of one program (the objects, not copies)."""

    def __init__(
        self,
        model: nn.Module,
        optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
        extras: Mapping[str, Stateful] | None = None,
    ) -> None:
        self.model = model
        self.optimizers: list[torch.optim.Optimizer] = (
            [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        )
        self.extras: dict[str, Stateful] = dict(extras or {})
        self.torn = False
        """True while a peer's state is being loaded over this one (a transfer that breaks halfway leaves
        it set: this member then holds no trained state, whatever step its position says)."""
        for name, obj in self.extras.items():
            if not isinstance(obj, Stateful):
                raise TypeError(f"state[{name!r}] has no state_dict()/load_state_dict()")

    def replace(self, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
        """New module and optimizers (HSDP re-wraps per generation); extras stay."""
        self.model = model
        self.optimizers = optimizers

    @property
    def optims(self) -> torch.optim.Optimizer | tuple[torch.optim.Optimizer, ...]:
        """The optimizers as torch's state-dict helpers and the checkpointer take them (one, or a tuple)."""
        return self.optimizers[0] if len(self.optimizers) == 1 else tuple(self.optimizers)

    def has_optimizer_state(self) -> bool:
        """Whether any optimizer made its (lazily created) state, i.e. stepped at least once."""
        return any(optimizer.state for optimizer in self.optimizers)

    def tensors_state(self, with_optimizer: bool = True) -> dict[str, Any]:
        """``{"model": ..., "optim": ...}`` from ``get_state_dict`` (tensors shared with the live objects).

        Without ``with_optimizer`` only the model's: torch's helper makes a missing optimizer state by
        stepping once with zero gradients, which changes the next steps of an optimizer that counts its
        steps (Adam's bias correction), so an optimizer that never stepped is left alone."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if not with_optimizer:
            return {"model": get_model_state_dict(self.model)}
        model_state, optim_state = get_state_dict(self.model, self.optims)
        return {"model": model_state, "optim": optim_state}

    def load_tensors_state(self, state: dict[str, Any]) -> None:
        """Put a state made by :meth:`tensors_state` back into the live objects."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if "optim" not in state:
            set_model_state_dict(self.model, state["model"])
            return
        set_state_dict(
            self.model,
            self.optims,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )

    def extras_state(self) -> dict[str, Any]:
        """Every extra's ``state_dict()`` by name."""
        return {name: obj.state_dict() for name, obj in self.extras.items()}

    def load_extras_state(self, state: Mapping[str, Any]) -> None:
        """Load each extra that ``state`` holds (names missing from ``state`` are left as they are)."""
        for name, obj in self.extras.items():
            if name in state:
                obj.load_state_dict(state[name])

    def zero_grad(self) -> None:
        """Drop the gradients of a discarded step."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
