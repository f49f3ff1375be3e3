"""State hand-over between members, on a one-process gloo group (the multi-process path is covered by
test_live_recovery.py and test_runtime_api.py): refusing to start from scratch, the optimizer state made
for receiving with any optimizer, and the program's extras carried through their own state dicts."""

from __future__ import annotations

import pytest
import torch
from llm_elastic.errors import StateLost
from llm_elastic.position import Position, Progress
from llm_elastic.state import TrainState
from llm_elastic.transfer import synchronise
from llm_elastic.wrap import init_optimizer_state
from llm_trainer.config import model_config
from llm_trainer.model import Transformer


def model_and_optimizer() -> tuple[Transformer, torch.optim.Optimizer]:
    model = Transformer(model_config("tiny"))
    model.init_weights(1)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)


def test_new_members_refuse_to_restart_a_job_that_had_trained(one_rank: None) -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(StateLost, match="step 7"):
        synchronise(TrainState(model, optimizer), Position(), None, job_step=7)


def test_a_new_job_starts_from_rank_0_and_agreeing_members_send_nothing(one_rank: None) -> None:
    model, optimizer = model_and_optimizer()
    restores: list[int] = []
    state = TrainState(model, optimizer)
    agreement = synchronise(state, Position(), None, 0, lambda: restores.append(1))  # type: ignore[func-returns-value]
    agreed = agreement.position
    assert (agreed.progress.step, agreed.progress.fresh, agreement.source) == (0, False, 0)
    assert restores == [1] and agreement.loaded is None, "every member new: storage is asked first"
    assert not state.torn, "rank 0 is the source: it overwrites nothing"
    held = Position(progress=Progress(3, 2.5, fresh=False))
    agreement = synchronise(state, held, None, 3)
    assert agreement.source is None and agreement.position == held


def test_a_member_whose_transfer_broke_halfway_counts_as_new(one_rank: None) -> None:
    """Its position still says step 3, but its state is torn: it is no source, so with no peer holding
    the state and nothing in storage the job's step 3 is lost."""
    model, optimizer = model_and_optimizer()
    state = TrainState(model, optimizer)
    state.torn = True
    with pytest.raises(StateLost, match="step 3"):
        synchronise(state, Position(progress=Progress(3, 2.5, fresh=False)), None, 3, lambda: None)


def _train(model: Transformer, optimizer: torch.optim.Optimizer, steps: int) -> torch.Tensor:
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    for _ in range(steps):
        optimizer.zero_grad()
        model(tokens).float().square().mean().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_a_source_that_never_stepped_sends_no_optimizer_state_and_changes_nothing(one_rank: None) -> None:
    """A new job's first generation hands the initial weights over; making the optimizer's state for it
    (torch steps once with zero gradients) would shift Adam's bias correction for the whole run."""
    plain_model, plain_optimizer = model_and_optimizer()
    expected = _train(plain_model, plain_optimizer, 3)
    model, optimizer = model_and_optimizer()
    synchronise(TrainState(model, optimizer), Position(), None, 0, lambda: None)
    assert not optimizer.state
    assert torch.equal(_train(model, optimizer, 3), expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
        lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    ],
    ids=["adamw", "sgd-momentum", "adagrad"],
)
def test_received_optimizer_state_continues_exactly_like_the_sender(make: object) -> None:
    """A joiner's optimizer (any kind), prepared and loaded with a sender's state, steps like the sender."""
    sender = Transformer(model_config("tiny"))
    sender.init_weights(1)
    sender_opt = make(sender.parameters())  # type: ignore[operator]
    _train(sender, sender_opt, 2)
    joiner = Transformer(model_config("tiny"))
    joiner.init_weights(2)
    joiner_opt = make(joiner.parameters())  # type: ignore[operator]
    init_optimizer_state(joiner_opt)
    sent = TrainState(sender, sender_opt).tensors_state()
    receiving = TrainState(joiner, joiner_opt)
    target = receiving.tensors_state()
    from llm_elastic.staging import tensor_leaves

    for (path, mine), (other, theirs) in zip(tensor_leaves(target), tensor_leaves(sent), strict=True):
        assert path == other
        mine.copy_(theirs)
    receiving.load_tensors_state(target)
    assert torch.equal(_train(joiner, joiner_opt, 2), _train(sender, sender_opt, 2))
