"""The program's extras (its ``Stateful`` objects beside the model and optimizers) as one ``torch.save``
blob: a file beside a checkpoint, base64 inside a snapshot's JSON meta (:mod:`llm_elastic.persistence`)."""

from __future__ import annotations

import io

import torch

from llm_elastic.errors import StateLost
from llm_elastic.state import TrainState


def pack(state: TrainState) -> bytes:
    """The extras' state dicts, ``torch.save``d."""
    buffer = io.BytesIO()
    torch.save(state.extras_state(), buffer)
    return buffer.getvalue()


def unpack(state: TrainState, raw: bytes | None) -> None:
    """Load the extras from a blob made by :func:`pack` (None or empty: nothing saved); a blob that does
    not fit this run's extras is :class:`~llm_elastic.errors.StateLost`."""
    if not raw:
        return
    saved = torch.load(io.BytesIO(raw), weights_only=False)
    try:
        state.load_extras_state(saved)
    except ValueError as exc:
        raise StateLost(f"the saved state does not fit this run: {exc}") from exc
