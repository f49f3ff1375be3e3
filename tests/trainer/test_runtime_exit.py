"""The runtime's one exit path, in this process (standalone: a one-rank gloo group of its own): a stop
signal in a step saves that step, and ``steps()`` turns the mode's ``Leave(0)`` into ``SystemExit(0)``."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from llm_elastic import Elastic, ElasticConfig

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
