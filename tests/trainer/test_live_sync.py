"""State hand-over between members, on a one-process gloo group (the multi-process path is covered by
test_live_recovery.py and test_runtime_api.py): refusing to start from scratch, the optimizer state made
for receiving with any optimizer, and the program's extras carried through their own state dicts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from llm_elastic.errors import StateLost
from llm_elastic.state import TrainState
from llm_elastic.transfer import Progress, synchronise
from llm_elastic.wrap import init_optimizer_state
from llm_trainer.config import model_config
from llm_trainer.model import Transformer
from torch._C._distributed_c10d import HashStore


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def model_and_optimizer() -> tuple[Transformer, torch.optim.Optimizer]:
    model = Transformer(model_config("tiny"))
    model.init_weights(1)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)


def test_new_members_refuse_to_restart_a_job_that_had_trained(group: None) -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(StateLost, match="step 7"):
        synchronise(TrainState(model, optimizer), Progress(0, float("nan"), fresh=True), None, job_step=7)


def test_a_new_job_starts_from_rank_0_and_agreeing_members_send_nothing(group: None) -> None:
    model, optimizer = model_and_optimizer()
    received: list[int] = []
    state = TrainState(model, optimizer)
    agreed, source = synchronise(state, Progress(0, float("nan"), fresh=True), None, 0, lambda: received.append(1))
    assert (agreed.step, agreed.fresh, source) == (0, False, 0)
    assert received == []  # rank 0 is the source: it overwrites nothing
    agreed, source = synchronise(state, Progress(3, 2.5, fresh=False), None, 3)
    assert source is None and agreed == Progress(3, 2.5, fresh=False)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
        lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    ],
    ids=["adamw", "sgd-momentum", "adagrad"],
)
def test_optimizer_state_made_for_receiving_steps_exactly_like_the_optimizer_own(make: object) -> None:
    """The state a joiner prepares before receiving in place changes nothing (whatever its keys)."""
    tokens = torch.randint(0, 256, (2, 16))
    results = []
    for prepare in (False, True):
        model = Transformer(model_config("tiny"))
        model.init_weights(1)
        optimizer = make(model.parameters())  # type: ignore[operator]
        if prepare:
            init_optimizer_state(optimizer)
            assert optimizer.state, "state made before the first step"
        for _ in range(2):
            optimizer.zero_grad()
            model(tokens).float().square().mean().backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(results[0], results[1])
