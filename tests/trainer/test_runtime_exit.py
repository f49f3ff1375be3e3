"""The runtime's parts in this process (a one-rank gloo group): the one exit path (a stop signal in a step
saves that step, and ``steps()`` turns the mode's ``Leave(0)`` into ``SystemExit(0)``), and the DDP clock
that travels in ``WrapContext`` instead of being set on the user's policy."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from llm_elastic import DDP, Elastic, ElasticConfig
from llm_elastic.wrap import StepClock, WrapContext

pytestmark = pytest.mark.trainer


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_stop_saves_the_step_and_exits_0_through_the_one_exit_path(
    tmp_path: Path, own_signal_handlers: None
) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = ElasticConfig(
        total_steps=10, checkpoint_dir=str(tmp_path), metrics_port=0, async_checkpoint=False
    )
    elastic = Elastic(model, optimizer, config, env={})
    assert elastic.mode == "standalone" and elastic.restored.source is None
    with pytest.raises(SystemExit) as exited:
        for step in elastic.steps():
            with step:
                loss = step.model(torch.ones(2, 4)).sum()
                loss.backward()
                if step.index == 1:
                    os.kill(os.getpid(), signal.SIGTERM)  # rides this step's commit
                step.commit(loss)
                optimizer.step()
                optimizer.zero_grad()
            assert step.verdict is not None and step.verdict.stopping == (1 if step.index == 1 else 0)
    assert exited.value.code == 0
    assert elastic.step == 2 and elastic.rank == 0 and elastic.world_size == 1
    assert (tmp_path / "step-2" / "COMPLETE").exists()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert not torch.distributed.is_initialized()


def test_ddp_marks_the_first_bucket_on_the_generations_clock_and_leaves_the_policy_alone() -> None:
    from torch._C._distributed_c10d import HashStore

    torch.distributed.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 1)
        policy, clock = DDP(), StepClock()
        gen = WrapContext(1, 0, torch.device("cpu"), "gloo", timedelta(seconds=5), clock)
        wrapped = policy.wrap(model, [torch.optim.SGD(model.parameters(), lr=0.1)], gen)
        wrapped.module(torch.ones(2, 4)).sum().backward()
        assert clock.first_bucket is not None and policy.clock is None
        policy.park(wrapped)
    finally:
        torch.distributed.destroy_process_group()
